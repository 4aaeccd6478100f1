"""The gen stage of a generation batch: which prompts, which rows, TRL's generation and scoring
under the right weights, and the injections around TRL's single-turn generation.

Owns nothing: the parts it calls own their state (the sampler, the injections, the lagged
weights, the async pipeline). Receives the trainer ``t`` (a
:class:`~mixrl.trainer.grpo.MixrlGRPOTrainer`): its parts, the step, the policy, TRL's own
``_generate_and_score_completions`` / ``_generate_single_turn`` (called past mixrl's overrides)
and generation settings, and the batch in flight (``t.batch_in_flight``: its rows, rollouts and
reward matrix), which it writes for the later stages (:mod:`mixrl.trainer.trl_hooks.scoring`).
"""

from __future__ import annotations

import contextlib

from trl import GRPOTrainer

from mixrl.core import provenance as prov
from mixrl.sources.base import Rollouts
from mixrl.sources.rows import splice_prefixes
from mixrl.trainer.parts.sampler_rounds import Round
from mixrl.trainer.trl_hooks import async_vllm


def stage_gen(t, inputs, training: bool, mode: str):
    """gen: the sampler's prompts, the injections' rows, TRL's generation and scoring (under
    lagged weights, or through the async pipeline), and the rows' behaviour log-probs.
    Returns the batch, its rows and the policy version that generated it (None: the current)."""
    p = t.parts
    sampling = training and p.sampler is not None
    if sampling:
        inputs, prompt_indices = p.sampler.pick(inputs)
    if training and p.injections:
        inputs = p.injections.before_generation(t._context(), inputs)
    t.batch_in_flight.rollouts = None
    t.batch_in_flight.rows = inputs
    lagged = training and p.lag is not None
    lag = 0
    try:
        if training and p.async_gen is not None:
            out, version = async_vllm.generate_and_score(t, inputs)
        else:
            with p.lag.swapped_in(t._params(), t.state.global_step) if lagged else contextlib.nullcontext(0) as lag:
                if sampling:
                    out, inputs = t._sampler_rounds(inputs, prompt_indices)
                else:
                    out = GRPOTrainer._generate_and_score_completions(t, inputs)
                if lagged:
                    out["old_per_token_logps"] = p.forwards.behaviour_logps(t.model, out)
            version = int(t.state.global_step) - lag if lagged else None
    finally:
        t.batch_in_flight.rows = None
    if lagged:
        t._metrics[mode]["staleness"].append(float(lag))
    return out, inputs, version


def sampler_rounds(t, inputs, indices):
    """The sampler's rounds (:meth:`mixrl.trainer.parts.sampler_rounds.SamplerRounds.generate`),
    each TRL's generation and scoring, under the length curriculum's max completion length."""
    p = t.parts

    def one_round(rows):
        t.batch_in_flight.rows = rows
        t.batch_in_flight.rollouts = None  # a new round's first turn (TRL's tool loop skips injections after it)
        out = GRPOTrainer._generate_and_score_completions(t, rows)
        return Round(out, t.batch_in_flight.rollouts, t.batch_in_flight.rewards_per_func, rows)

    prepare = (lambda rows: p.injections.before_generation(t._context(), rows)) if p.injections else (lambda rows: rows)
    length = p.sampler.length_at(t.state.global_step, t.max_completion_length) if hasattr(t, "generation_config") else None
    if length is not None:
        t._metrics["train"]["sampler/max_completion_length"].append(float(length))
    with max_new_tokens(t, length):
        r = p.sampler.generate(inputs, indices, step=int(t.state.global_step), generate=one_round, prepare=prepare)
    t.batch_in_flight.rollouts, t.batch_in_flight.rewards_per_func = r.rollouts, r.rewards_per_func
    t.mixrl_rollouts += r.extra_rollouts  # the dropped rollouts were paid for too
    t.mixrl_generated_tokens += r.extra_tokens
    t._log("train", r.metrics)
    return r.out, r.rows


@contextlib.contextmanager
def max_new_tokens(t, length: int | None):
    """TRL's generation settings with ``max_new_tokens = length`` for the block (None: unchanged)."""
    if length is None:
        yield
        return
    saved = (t.generation_config.max_new_tokens, dict(t.generation_kwargs))
    t.generation_config.max_new_tokens = length
    t.generation_kwargs["max_new_tokens"] = length
    try:
        yield
    finally:
        t.generation_config.max_new_tokens, t.generation_kwargs = saved[0], saved[1]


def single_turn(t, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
    """TRL's single-turn generation with the injections' ``after_generation`` hook (replace or extend
    completions before they are scored; each rollout continued from an injection's prefix; no
    generation when an injection writes every completion). Records the rows' :class:`Rollouts`."""
    def trl_generate(ids, n):
        return GRPOTrainer._generate_single_turn(t, ids, images, multimodal_fields, n, has_tool_images)

    if t.batch_in_flight.rollouts is not None and t.tools:  # TRL's tool loop: a later turn of rows already generated
        return trl_generate(prompt_ids, num_generations)
    inj = t.parts.injections
    injecting = bool(inj) and t.model.training and t.batch_in_flight.rows is not None
    ctx = t._context() if injecting else None
    prefixes = inj.generation_prefixes(ctx, t.batch_in_flight.rows, len(prompt_ids)) if injecting else None
    token_source = None
    if injecting and inj.skips_generation:
        # every completion will be a source's: do not spend time generating rollouts
        completion_ids, logprobs = [[t.processing_class.eos_token_id] for _ in prompt_ids], None
    elif prefixes is not None:
        # each rollout continues from its prefix: the prompts of a group differ, so one
        # completion per prompt (vLLM's server mode would otherwise sample a group from its first prompt)
        completion_ids, logprobs = trl_generate([list(p) + list(x) for p, x in zip(prompt_ids, prefixes)], 1)
        completion_ids, logprobs, token_source = splice_prefixes(
            completion_ids, logprobs, prefixes, max_len=t.max_completion_length,
            prefix_code=prov.code("prefix"), continuation_code=prov.ON_POLICY,
        )
    else:
        completion_ids, logprobs = trl_generate(prompt_ids, num_generations)
    n = len(completion_ids)
    rollouts = Rollouts(
        list(completion_ids), logprobs, [prov.ON_POLICY] * n, token_source=token_source or [],
        guided=[1 if p else 0 for p in prefixes] if prefixes is not None else [], prompt_ids=prompt_ids,
    )
    if injecting:
        rollouts = inj.after_generation(ctx, t.batch_in_flight.rows, rollouts)
        if rollouts.prompt_ids is not prompt_ids:  # a row trained under another prompt (plain hinted training)
            prompt_ids[:] = rollouts.prompt_ids  # TRL builds the batch's prompts from this very list
    t.batch_in_flight.rollouts = rollouts
    return rollouts.completion_ids, rollouts.logprobs
