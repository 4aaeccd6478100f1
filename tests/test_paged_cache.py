"""``trainer.generation=continuous`` on CPU: the paged cache sized per call from its own prompts
(mixrl.trainer.generation.paged_cache), never above the config's size; the caller's config kept."""

from __future__ import annotations

from types import SimpleNamespace

from mixrl.trainer.generation.paged_cache import CACHE_ROWS, PagedCacheSizing, blocks_needed


def test_blocks_needed_by_hand():
    # 128 requests, prompts of at most 50 tokens, 256 new: 64 rows x (ceil(306 / 16) = 20, + 1) = 1344 pages
    assert CACHE_ROWS == 64
    assert blocks_needed(max_prompt=50, max_new=256, requests=128, page_size=16) == 64 * 21 == 1344
    # fewer requests than rows: each gets its pages; 8 requests of 6 + 24 tokens: 8 x (2 + 1)
    assert blocks_needed(max_prompt=6, max_new=24, requests=8, page_size=16) == 24


class _Model:
    """Records the config each manager is opened with."""

    def __init__(self):
        self.opened = []

    def continuous_batching_context_manager(self, *args, **kwargs):
        self.opened.append(kwargs)
        return "manager"


def test_lowers_num_blocks_on_a_copy():
    model = _Model()
    sizing = PagedCacheSizing(model)
    config = SimpleNamespace(num_blocks=3136, page_size=16)  # 64 rows x 49 pages: 512 assumed prompt tokens + 256
    hints = SimpleNamespace(max_prompt_length=50, max_generated_length=256, num_requests=128)
    assert model.continuous_batching_context_manager(continuous_batching_config=config, workload_hints=hints, block=True) == "manager"
    got = model.opened[-1]
    assert got["continuous_batching_config"].num_blocks == 1344 and got["block"] is True
    assert config.num_blocks == 3136  # TRL's own config object is untouched
    # never above the config's size; no hints or no num_blocks (a GPU: transformers sizes it): unchanged
    model.continuous_batching_context_manager(continuous_batching_config=SimpleNamespace(num_blocks=100, page_size=16),
                                              workload_hints=hints)
    assert model.opened[-1]["continuous_batching_config"].num_blocks == 100
    gpu = SimpleNamespace(num_blocks=None, page_size=256)
    model.continuous_batching_context_manager(continuous_batching_config=gpu, workload_hints=hints)
    model.continuous_batching_context_manager(continuous_batching_config=config)
    assert model.opened[-2]["continuous_batching_config"] is gpu and model.opened[-1]["continuous_batching_config"] is config
    assert sizing.sizes == [1344, 100]
