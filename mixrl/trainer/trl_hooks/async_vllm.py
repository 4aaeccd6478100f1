"""``hardware.vllm_async=true``: TRL's vLLM client routed through the async part, and the generation
batch scored under the weights of the version that generated it. Also the colocated engine lent to
the periodic benchmark evaluation (:mod:`mixrl.benchmarks.engine`, through the trainer's
``push_engine_weights`` / ``generate_on_engine``): the step's weights pushed, and a generation
that leaves TRL's sleep-mode bookkeeping as TRL's own does.

Owns nothing: the async part (``t.parts.async_gen``, a
:class:`~mixrl.trainer.generation.async_generation.AsyncPipeline`) owns the pipeline and the
weight snapshots. Receives the trainer ``t`` (a :class:`~mixrl.trainer.grpo.MixrlGRPOTrainer`):
its TRL ``vllm_generation`` (whose public ``generate`` / ``sync_weights`` it replaces, listed in
:mod:`mixrl.trainer.trl_contract`, and whose ``_llm_weights_sleeping`` it sets), TRL's
``_last_loaded_step``, the step and the policy.
"""

from __future__ import annotations

import contextlib

from trl import GRPOTrainer

from mixrl.trainer.generation.lagged_weights import swapped


def wrap_vllm(t) -> None:
    """Route TRL's vLLM calls through the async pipeline (server mode, one process)."""
    a = t.parts.async_gen
    t.vllm_generation.generate = lambda prompts, images, num_generations, profiler=None: a.engine_generate(
        prompts, images, num_generations, training=t.model.training, step=t.state.global_step,
        max_steps=t.state.max_steps)
    t.vllm_generation.sync_weights = lambda: a.engine.sync(int(t.state.global_step), training=t.model.training)


def generate_and_score(t, inputs) -> tuple[dict, int]:
    """TRL's generation and scoring in async mode: push the weights first (when the step
    changed), then score under the weights of the version that generated the batch, so that
    ``old_per_token_logps`` (the behaviour log-probs) are that version's."""
    a = t.parts.async_gen.engine
    step = int(t.state.global_step)
    if step != t._last_loaded_step:
        t.vllm_generation.sync_weights()
        t._last_loaded_step = step
    expected = a.expected_version()
    with weights_of_version(t, expected):
        out = GRPOTrainer._generate_and_score_completions(t, inputs)
        version = a.last_version
        if version != expected:  # the batch in flight was for other prompts (dropped): TRL scored under other weights
            out["old_per_token_logps"] = None
    if out.get("old_per_token_logps") is None:
        with weights_of_version(t, version):
            out["old_per_token_logps"] = t.parts.forwards.behaviour_logps(t.model, out)
    return out, version


def push_engine_weights(t) -> bool:
    """The training weights pushed to the colocated vLLM engine unless this optimizer step's are
    there already (TRL's ``sync_weights`` and its ``_last_loaded_step`` tag, which TRL's next
    rollout generation reads: it does not push them again); True when pushed."""
    step = int(t.state.global_step)
    if getattr(t, "_last_loaded_step", None) == step and not getattr(t.vllm_generation, "_llm_weights_sleeping", False):
        return False
    t.vllm_generation.sync_weights()
    t._last_loaded_step = step
    return True


def generate_on_engine(t, requests: list, params: list) -> list:
    """vLLM's outputs for ``requests`` (with their ``SamplingParams``) on the colocated engine. With
    TRL's sleep mode the engine's KV cache is woken first, and the engine is put back to sleep after
    as TRL leaves it after a generation: level 2 drops the weights, so TRL's ``_llm_weights_sleeping``
    is set (the weights are pushed again before the next generation)."""
    vg = t.vllm_generation
    llm = vg.llm
    sleep = bool(getattr(vg, "enable_sleep_mode", False))
    if sleep:
        llm.wake_up(tags=["kv_cache"])
    try:
        return llm.generate(requests, params, use_tqdm=False)
    finally:
        if sleep:
            llm.sleep(level=2)
            vg._llm_weights_sleeping = True


def weights_of_version(t, version: int):
    """The trainable weights of policy ``version`` swapped in (nothing to do for the current step)."""
    if version == int(t.state.global_step):
        return contextlib.nullcontext()
    return swapped(t._params(), t.parts.async_gen.engine.weights_of(version))
