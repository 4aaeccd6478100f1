"""The periodic benchmark evaluation on the run's own vLLM engine (``hardware.use_vllm`` colocate).

A run that generates its rollouts with a colocated vLLM engine (TRL's ``vllm_mode=colocate``)
already holds a fast generator of the training weights; :func:`engine_for` hands it to the
periodic benchmark evaluation (:func:`mixrl.benchmarks.live.evaluate`), which otherwise decodes
with HF ``generate`` on the training model. Papers' validation curves sample thousands of long
completions per evaluation, which is the difference between minutes and hours.

TRL pushes the training weights to the engine lazily, at the first generation of an optimizer
step (``GRPOTrainer._generate``: ``vllm_generation.sync_weights()`` when ``state.global_step !=
_last_loaded_step``). The periodic evaluation runs at a step's end, after the optimizer step and
before the next generation, so the engine still holds the previous step's weights:
:meth:`EngineGenerator.sync` pushes them first, through the trainer's own
``push_engine_weights`` (TRL's call, and the step recorded in ``_last_loaded_step`` so that the
next rollout generation does not push them again). It then generates through the trainer's
``generate_on_engine``, which wakes an engine TRL put to sleep (``vllm_enable_sleep_mode``) and puts it
back to sleep afterwards, as TRL leaves it (:mod:`mixrl.trainer.trl_hooks.async_vllm`): this module
reads only TRL's public ``vllm_generation`` and writes none of TRL's fields.

Sampled protocols seed each (problem, sample) pair (``SamplingParams.seed``, from the evaluation's
seed and the pair's index), so a sample does not depend on which process draws it nor on the
requests beside it, as :class:`mixrl.benchmarks.sampling.SeededSampling` does for HF; the two draw
from the same distribution, not the same tokens. Greedy protocols give HF's completions up to the
engine's kernels and dtype (the test compares them on the same weights).

Not used (HF ``generate`` instead): vLLM server mode (the engine belongs to another process),
tensor parallel engines (every rank of the group would have to issue the same requests), and
asynchronous generation (its engine runs ahead of the training weights).
"""

from __future__ import annotations

from typing import Any

from mixrl.errors import ConfigError


def engine_for(trainer: Any) -> "EngineGenerator | None":
    """The trainer's colocated single-GPU vLLM engine as an :class:`EngineGenerator`, or None
    (no trainer, no vLLM, server mode, tensor parallel, asynchronous generation)."""
    if trainer is None or not getattr(trainer, "use_vllm", False):
        return None
    vg = getattr(trainer, "vllm_generation", None)
    if vg is None or getattr(vg, "mode", None) != "colocate" or getattr(vg, "llm", None) is None:
        return None
    if int(getattr(vg, "tensor_parallel_size", 1) or 1) != 1:
        return None
    parts = getattr(trainer, "parts", None)
    if parts is not None and getattr(parts, "async_gen", None) is not None:
        return None
    return EngineGenerator(trainer)


def pair_seed(seed: int, pair: int) -> int:
    """The vLLM request seed of one (problem, sample) pair: ``(seed * 1_000_003 + pair) mod 2^31``."""
    return (int(seed) * 1_000_003 + int(pair)) % (2**31 - 1)


class EngineGenerator:
    """Generate benchmark completions on the trainer's colocated vLLM engine, its weights synced first."""

    name = "vllm-engine"

    def __init__(self, trainer: Any):
        self.trainer = trainer
        self.vg = trainer.vllm_generation

    def sync(self) -> bool:
        """Push the training weights to the engine unless this optimizer step's are there already
        (TRL's ``sync_weights`` and its ``_last_loaded_step`` tag); True when it pushed."""
        return self.trainer.push_engine_weights()

    def generate(self, tokenizer, prompts: list, pairs: list[int], *, temperature: float, top_p: float | None,
                 max_new_tokens: int, seed: int) -> list[str]:
        """One completion per prompt (``pairs[i]``: the pair index that seeds prompt ``i``'s sample)."""
        from vllm import SamplingParams  # deferred: vllm is optional (the vllm extras)

        if not prompts:
            return []
        self.sync()
        texts = [p if isinstance(p, str) else tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
                 for p in prompts]
        # plain prompts get the tokenizer's special tokens (bos) as HF's path adds them; a rendered chat holds them
        ids = [tokenizer(t, add_special_tokens=isinstance(p, str))["input_ids"] for t, p in zip(texts, prompts)]
        llm = self.vg.llm
        context = int(llm.llm_engine.model_config.max_model_len)
        if max(map(len, ids)) >= context:
            raise ConfigError(f"trainer.eval_benchmarks: a prompt of {max(map(len, ids))} tokens does not fit the vLLM "
                              f"engine's context of {context} tokens; raise hardware.vllm_max_model_length or "
                              "shorten the benchmark's prompt.template")
        sample = temperature > 0
        params = [SamplingParams(n=1, temperature=float(temperature) if sample else 0.0,
                                 top_p=float(top_p) if sample and top_p is not None else 1.0,
                                 max_tokens=max(1, min(int(max_new_tokens), context - len(x))), seed=pair_seed(seed, j))
                  for x, j in zip(ids, pairs)]
        # the trainer wakes a sleeping engine and puts it back to sleep as TRL leaves it after a generation
        outs = self.trainer.generate_on_engine([{"prompt_token_ids": x} for x in ids], params)
        return [tokenizer.decode(o.outputs[0].token_ids, skip_special_tokens=True) for o in outs]
