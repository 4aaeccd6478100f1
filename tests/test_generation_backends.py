"""``trainer.generation`` (mixrl.config.generation): its checks, the TRL arguments it sets, and the
engines' completions: greedy completions of transformers' continuous batching are the ones of
padded ``generate``, through the trainer's own generation path."""

from __future__ import annotations

from pathlib import Path

import pytest

from mixrl.errors import ConfigError
from tests.conftest import FAST


def _cfg(extra: list[str], run_dir: Path | None = None):
    from mixrl.config.compose import compose_config

    return compose_config([*FAST, "algo=grpo", *([f"run_dir={run_dir}"] if run_dir else []), *extra])


@pytest.mark.parametrize("extra, words", [
    (["trainer.generation=paged"], "trainer.generation=paged is not one of auto, padded, shared-prefill, compact, continuous, vllm"),
    (["trainer.generation=vllm"], "trainer.generation=vllm needs hardware.use_vllm=true"),
])
def test_bad_generation_is_one_line(extra, words):
    with pytest.raises(ConfigError) as e:
        _cfg(extra)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_padded_with_vllm_contradicts():
    from mixrl.config.generation import check_generation

    cfg = _cfg([])
    cfg.hardware.use_vllm = True
    for engine in ("continuous", "compact"):
        cfg.trainer.generation = engine
        with pytest.raises(ConfigError, match=f"trainer.generation={engine} contradicts hardware.use_vllm=true"):
            check_generation(cfg)
    cfg.trainer.generation = "auto"
    check_generation(cfg)  # auto follows hardware.use_vllm


def test_continuous_refuses_trls_bf16_cast():
    """TRL 1.16 casts the policy to bf16 for continuous batching and never back: refused on a GPU
    with hardware.bf16=true unless the weights are bf16 already."""
    from mixrl.config.generation import check_generation

    cfg = _cfg(["trainer.generation=continuous"])
    cfg.hardware.device, cfg.hardware.bf16 = "cuda", True
    with pytest.raises(ConfigError, match="set model.dtype=bfloat16 or trainer.generation=padded"):
        check_generation(cfg)
    cfg.model.dtype = "bfloat16"
    check_generation(cfg)


def test_auto_resolves_and_sets_trl_flag(tmp_path):
    from mixrl.config.generation import CPU_PAGE_SIZE, resolve_generation
    from mixrl.config.geometry import geometry
    from mixrl.trainer.build import grpo_args

    padded, cont = _cfg([]), _cfg(["trainer.generation=continuous", "data.max_prompt_tokens=40"])
    assert resolve_generation(padded) == "compact" and resolve_generation(cont) == "continuous"  # auto: compact (padded generate)
    args = grpo_args(padded, tmp_path, geometry(padded))
    assert args.use_transformers_continuous_batching is False
    args = grpo_args(cont, tmp_path, geometry(cont))
    assert args.use_transformers_continuous_batching is True
    cb = args.transformers_continuous_batching_config
    # 16 rollouts (4 prompts x 4) of at most 40 prompt + 24 completion tokens: ceil(64 / 16) + 1 = 5 pages each
    assert cb["page_size"] == CPU_PAGE_SIZE == 16 and cb["num_blocks"] == 16 * 5


def test_continuous_greedy_equals_padded(tiny_model_path, tmp_path):
    """The trainer's generation (TRL's _generate_single_turn under MixrlGRPOTrainer), greedy:
    the same completion ids from padded generate and from continuous batching, row by row."""
    from mixrl.trainer import build

    outs = {}
    for mode in ("padded", "continuous"):
        cfg = _cfg([f"model.path={tiny_model_path}", f"trainer.generation={mode}", "data.max_prompt_tokens=64"],
                   tmp_path / mode)
        trainer = build.trainer_from_config(cfg, run_dir=tmp_path / mode, generation_kwargs={"do_sample": False})
        assert trainer.use_transformers_continuous_batching is (mode == "continuous")
        tok = trainer.processing_class
        texts = ["12+7=", "3*4=", "100-58=", "9+9+9="]  # prompts of different lengths: padded rows are left-padded
        prompt_ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts for _ in range(2)]
        ids, _ = trainer._generate_single_turn(prompt_ids, None, {}, 2)
        outs[mode] = [list(x) for x in ids]
        if mode == "continuous":  # its cache sized for these prompts, below the config's (64 prompt tokens assumed)
            sizes = trainer.generation_wrap.sizes
            assert sizes and sizes[-1] < trainer.continuous_batching_config.num_blocks, sizes
    assert len(outs["padded"]) == 8
    assert any(len(c) > 1 for c in outs["padded"])  # real completions, not empty ones
    assert outs["continuous"] == outs["padded"]


@pytest.mark.slow
def test_continuous_samples_in_distribution(tiny_model_path):
    """Sampled: each engine's first tokens (temperature 1, 512 draws of one prompt) follow the
    model's next-token softmax, every token of probability > 0.05 within 5 standard errors
    (sqrt(p (1 - p) / N)) of its probability. The engines draw from different random streams, so
    sampled completions agree in distribution, not token by token."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.generation import ContinuousBatchingConfig

    from mixrl.config.generation import continuous_batching_config

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    prompt = tok("12+7=", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        p = torch.softmax(model(torch.tensor([prompt])).logits[0, -1].float(), -1)
    n = 512
    gen = GenerationConfig(max_new_tokens=1, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                           pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    with torch.no_grad():
        padded = model.generate(input_ids=torch.tensor([prompt] * n), generation_config=gen)[:, -1].tolist()
        cb = model.generate_batch([prompt] * n, generation_config=gen, progress_bar=False,
                                  continuous_batching_config=ContinuousBatchingConfig(
                                      **continuous_batching_config(_cfg(["data.max_prompt_tokens=16"]), n)))
    continuous = [o.generated_tokens[0] for o in cb.values()]
    assert len(continuous) == n
    for draws in (padded, continuous):
        freq = torch.bincount(torch.tensor(draws), minlength=p.numel()).float() / n
        big = p > 0.05
        assert big.any()
        se = (p * (1 - p) / n).sqrt()
        assert ((freq - p).abs()[big] <= 5 * se[big]).all(), (freq[big], p[big])
