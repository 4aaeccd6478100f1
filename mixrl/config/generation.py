"""``trainer.generation``: which engine generates the rollouts.

* ``padded``: transformers' ``generate`` on the step's rows left-padded to one width (TRL's
  default): every row is computed until the longest is done.
* ``shared-prefill``: ``padded``, with the prompt of each group prefilled once for its G rows (its
  keys and values computed on the distinct prompts, then expanded to every row;
  :mod:`mixrl.trainer.generation.shared_prefill`): the same rows, decoding steps and random
  stream as ``padded``, (G - 1) / G of the prefill saved.
* ``compact``: ``padded``, each decoding step computed only on the rows not yet done (a done row
  leaves the KV cache; :mod:`mixrl.trainer.generation.compact`): the same rows, sampling calls and
  random stream as ``padded``, the decoding work of the finished rows saved.
* ``continuous``: transformers' continuous-batching engine (``generate_batch``, TRL's
  ``use_transformers_continuous_batching``): a row leaves the batch when it ends and the
  prompt blocks of a group are shared (prefix caching). Greedy completions are the same as
  ``padded``'s; sampled ones follow the same distribution but not the same random stream.
* ``vllm``: vLLM (``hardware.use_vllm=true``, its extra installed; ``hardware.vllm_mode``).
* ``auto`` (default): ``vllm`` when ``hardware.use_vllm=true``, else ``compact``: the same
  completions and random stream as ``padded`` (up to last-bit differences of the smaller decoding
  batch), faster on long-tailed lengths (bench ``--lengths variable``, its ``-compact`` variants).
  ``continuous`` is exact for greedy decoding but its sampled completions come from another random
  stream than ``padded``'s, so it is not the default: a seeded run keeps its trajectory (and the
  trainer pins).

Light: no torch, no transformers (``mixrl plan`` and ``config show`` read it).
"""

from __future__ import annotations

import math

from omegaconf import DictConfig

from mixrl.errors import ConfigError

GENERATION = ("auto", "padded", "shared-prefill", "compact", "continuous", "vllm")
#: tokens per KV-cache page of the continuous engine on CPU (transformers' default, 256, wastes most of a
#: page on short completions and makes the cache, and the attention-mask buffer sized from it, large)
CPU_PAGE_SIZE = 16
#: tokens per forward of the continuous engine on CPU: its SDPA path preallocates a dense mask of
#: max_batch_tokens x (cache tokens + max_batch_tokens) floats; on the variable-length benchmark's 128 rows
#: 8192 made it gigabytes (4.4 GB peak RSS, 2x slower than 2048), 2048 still +1.0 GB over padded
#: generation, 512 +0.3 GB with the cache sized for 512 assumed prompt tokens, below padded generation's
#: peak with the cache sized per call (mixrl.trainer.generation.paged_cache); decoding runs at most
#: CPU_MAX_REQUESTS tokens per forward anyway
CPU_MAX_BATCH_TOKENS = 512
#: requests decoded together on CPU: the SDPA path attends each query over every scheduled row's
#: cache (a block-diagonal mask), a cost quadratic in the rows decoded at once
CPU_MAX_REQUESTS = 32
#: the longest prompt assumed when ``data.max_prompt_tokens`` is null (as mixrl.config.context assumes)
ASSUMED_PROMPT_TOKENS = 512


def resolve_generation(cfg: DictConfig) -> str:
    """The engine a run generates with: ``padded``, ``shared-prefill``, ``compact``, ``continuous`` or ``vllm`` (``auto`` resolved)."""
    value = str(cfg.trainer.get("generation", "auto")).strip().lower()
    if value == "auto":
        return "vllm" if bool(cfg.hardware.use_vllm) else "compact"
    return value


def check_generation(cfg: DictConfig) -> None:
    """One-line ConfigError for an unknown ``trainer.generation`` or one that contradicts ``hardware.use_vllm``."""
    raw = cfg.trainer.get("generation", "auto")
    value = str(raw).strip().lower()
    if value not in GENERATION:
        raise ConfigError(f"trainer.generation={raw} is not one of {', '.join(GENERATION)}; "
                          "set trainer.generation=auto (vLLM when hardware.use_vllm=true, else compact)")
    use_vllm = bool(cfg.hardware.use_vllm)
    if value == "vllm" and not use_vllm:
        raise ConfigError("trainer.generation=vllm needs hardware.use_vllm=true (and the vllm extra: pip install 'mixrl[vllm]'); "
                          "set hardware.use_vllm=true, or trainer.generation=padded")
    if value in ("padded", "shared-prefill", "compact", "continuous") and use_vllm:
        raise ConfigError(f"trainer.generation={value} contradicts hardware.use_vllm=true (vLLM generates); "
                          "set trainer.generation=vllm (or auto), or hardware.use_vllm=false")
    hw = cfg.hardware
    if value == "continuous" and bool(hw.bf16) and str(hw.device) != "cpu" and str(cfg.model.dtype) != "bfloat16":
        # trl/trainer/grpo_trainer.py (1.16.0), _generate_single_turn: `unwrapped_model.to(torch.bfloat16)`, never undone
        raise ConfigError(f"trainer.generation=continuous with hardware.bf16=true: TRL casts the policy to bf16 for it and never back "
                          f"(its model.dtype={cfg.model.dtype} weights would then train in bf16); set model.dtype=bfloat16 "
                          "or trainer.generation=padded")


def continuous_batching_config(cfg: DictConfig, rows: int) -> dict | None:
    """TRL's ``transformers_continuous_batching_config`` for ``trainer.generation=continuous``.
    On CPU the cache is sized from the run's geometry (``rows`` sequences of the longest prompt +
    ``max_completion_length`` tokens, in pages of :data:`CPU_PAGE_SIZE`), at most
    :data:`CPU_MAX_BATCH_TOKENS` tokens and :data:`CPU_MAX_REQUESTS` rows per forward:
    transformers sizes the cache from free device memory, which on CPU is the host's RAM (a cache
    of gigabytes, tens of seconds to allocate per call). This size is an upper bound: the trainer
    lowers it for each call to what the call's own prompts need
    (:mod:`mixrl.trainer.generation.paged_cache`). On a GPU: TRL's default (half of the free
    memory)."""
    if str(cfg.hardware.device) != "cpu":
        return None
    prompt = int(cfg.data.max_prompt_tokens or ASSUMED_PROMPT_TOKENS)
    per_row = math.ceil((prompt + int(cfg.trainer.max_completion_length)) / CPU_PAGE_SIZE) + 1
    # the cache holds 2 x CPU_MAX_REQUESTS rows at full length (the rest wait for pages that finished rows free)
    return {"page_size": CPU_PAGE_SIZE, "num_blocks": min(int(rows), 2 * CPU_MAX_REQUESTS) * per_row,
            "max_batch_tokens": CPU_MAX_BATCH_TOKENS,
            "max_requests_per_batch": CPU_MAX_REQUESTS}


def generation_args(cfg: DictConfig, rows: int) -> dict:
    """The ``GRPOConfig`` fields of the run's engine (``use_vllm`` is set from ``hardware.use_vllm``)."""
    if resolve_generation(cfg) != "continuous":
        return {"use_transformers_continuous_batching": False}
    return {"use_transformers_continuous_batching": True,
            "transformers_continuous_batching_config": continuous_batching_config(cfg, rows)}
