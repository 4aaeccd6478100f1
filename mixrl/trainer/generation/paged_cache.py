"""``trainer.generation=continuous`` on CPU: the paged KV cache sized for each call's own prompts.

transformers' continuous-batching engine allocates, per ``generate_batch`` call, a KV cache of
``num_blocks`` pages and, for SDPA (the CPU path), a dense attention mask of ``max_batch_tokens``
x (cache tokens + ``max_batch_tokens``) floats, filled once at start (so resident). The config
(:func:`mixrl.config.generation.continuous_batching_config`) sizes both before any data is read,
from ``data.max_prompt_tokens`` or, when it is null, 512 assumed prompt tokens: on the
variable-length benchmark (prompts of ~50 tokens, 256 new ones, the tiny BPE model) that is a
200 MB cache and a 100 MB mask, 300 MB of peak RSS over padded generation.

:class:`PagedCacheSizing` wraps the policy's ``continuous_batching_context_manager`` (through which
both ``generate_batch`` and a caller driving the engine itself open it) and lowers ``num_blocks``
to what the call's requests need: :func:`blocks_needed` (at most :data:`CACHE_ROWS` rows of the
call's longest prompt + its most new tokens, in pages, plus one page per row), never above the
config's. Rows beyond those wait for the pages that finished rows free, as with the config's size.
"""

from __future__ import annotations

import copy
import math

from mixrl.config.generation import CPU_MAX_REQUESTS

#: rows the cache holds at full length: the rows one forward decodes (CPU_MAX_REQUESTS) and as
#: many again admitted meanwhile (their prefill), as the config's size assumes
CACHE_ROWS = 2 * CPU_MAX_REQUESTS


def blocks_needed(*, max_prompt: int, max_new: int, requests: int, page_size: int, rows: int = CACHE_ROWS) -> int:
    """Pages for ``min(requests, rows)`` rows of ``max_prompt + max_new`` tokens, one spare page each:
    ``min(requests, rows) * (ceil((max_prompt + max_new) / page_size) + 1)``."""
    per_row = math.ceil((int(max_prompt) + int(max_new)) / int(page_size)) + 1
    return max(1, min(int(requests), int(rows))) * per_row


class PagedCacheSizing:
    """Installed on a model: each continuous-batching manager it opens gets a cache of
    :func:`blocks_needed` pages for the call's workload (``workload_hints``), at most the
    config's ``num_blocks``. ``sizes``: the ``num_blocks`` of each call (for tests)."""

    def __init__(self, model, rows: int = CACHE_ROWS):
        self.rows = int(rows)
        self._open = model.continuous_batching_context_manager
        model.continuous_batching_context_manager = self.open
        self.sizes: list[int] = []

    def open(self, *args, **kwargs):
        config, hints = kwargs.get("continuous_batching_config"), kwargs.get("workload_hints")
        if config is not None and hints is not None and getattr(config, "num_blocks", None) and hints.num_requests > 0:
            need = blocks_needed(max_prompt=hints.max_prompt_length, max_new=hints.max_generated_length,
                                 requests=hints.num_requests, page_size=config.page_size, rows=self.rows)
            if need < config.num_blocks:
                config = copy.deepcopy(config)  # the caller's (TRL's) config object is kept as it is
                config.num_blocks = need
                kwargs["continuous_batching_config"] = config
            self.sizes.append(int(kwargs["continuous_batching_config"].num_blocks))
        return self._open(*args, **kwargs)
