"""Failed rollouts turned into requests for the policy: what Fission-GRPO and ILF share.

Both injections work after the advantages on this process's rollouts: they pick failed on-policy
rollouts (first reward below ``success``, at most a per-process budget, drawn with the run's seed),
get feedback on each from a feedback builder (:mod:`mixrl.sources.feedback`: the verifier's
message, the policy's own critique with ``feedback: self``, or ``module:function``, e.g. an error
simulator), and build the context ``template(prompt, attempt, feedback)`` in which the policy then
writes (:func:`mixrl.sources.with_feedback.refine_context`; chat prompts get it in the last user
message). The injections differ in what they do with what the policy writes:
:mod:`mixrl.sources.fission` trains it under that context as a new group,
:mod:`mixrl.sources.select_refinement` keeps the best and trains it under the original prompt.
"""

from __future__ import annotations

import random

import torch

from mixrl.core import provenance as prov
from mixrl.errors import ConfigError
from mixrl.sources.base import InjectContext
from mixrl.sources.feedback import Attempt, call_builder
from mixrl.sources.with_feedback import RefineFromFeedback, refine_context


def local_primary(ctx: InjectContext, primary: torch.Tensor | None, n: int) -> list[float]:
    """This process's share of the first reward function's gathered values (NaN: 0)."""
    start = ctx.process_index * n
    return torch.nan_to_num(primary[start:start + n].float(), nan=0.0).tolist()


def pick_failed(ctx: InjectContext, out: dict, rewards: list[float], success: float, budget: int, seed: int) -> list[int]:
    """Local rows of failed on-policy rollouts (reward below ``success``), at most ``budget``,
    drawn at random (seeded by the run's seed, the process and the step) when more failed; in order."""
    failed = [i for i, r in enumerate(rewards) if int(out["row_source"][i]) == prov.ON_POLICY and r < success - 1e-6]
    if len(failed) <= budget:
        return failed
    rng = random.Random(hash((seed, ctx.process_index, ctx.global_step, ctx.micro_step)))
    return sorted(rng.sample(failed, budget))


def whole_units(k: int, rows_each: int, unit: int) -> int:
    """The largest k' <= k whose k' x ``rows_each`` rows split evenly over ``unit`` micro-batches."""
    while k > 0 and (k * rows_each) % unit:
        k -= 1
    return k


def attempt_text(ctx: InjectContext, out: dict, i: int) -> tuple[list[int], str]:
    """Row ``i``'s completion token ids (unpadded) and text."""
    ids = out["completion_ids"][i][out["completion_mask"][i].bool()].tolist()
    return ids, ctx.tokenizer.decode(ids, skip_special_tokens=True)


def feedback_contexts(ctx: InjectContext, inputs: list[dict], out: dict, picks: list[int], rewards: list[float], *,
                      builder, feedback_name: str, template: str, calls) -> list[tuple[int, object]]:
    """(row, context) for each picked row whose builder gave feedback: ``template`` filled with the
    row's prompt, its attempt and the feedback (text, or chat messages). ``calls`` is the builders'
    handle on the policy (``Attempt.policy``)."""
    jobs = []
    for i in picks:
        row = inputs[i]
        ids, text = attempt_text(ctx, out, i)
        answer = row.get("answer")
        att = Attempt(prompt=row["prompt"], completion=text, completion_ids=ids, reward=float(rewards[i]),
                      answer=None if answer is None else str(answer), reference=RefineFromFeedback.reference(row),
                      row=row, policy=calls)
        fb = call_builder(builder, feedback_name, att)  # a raise or a wrong value: one line naming the builder
        if fb is not None:
            jobs.append((i, refine_context(row["prompt"], text, fb.text, template)))
    return jobs



def score_written(ctx: InjectContext, rows: list[dict], written: list, who: str) -> torch.Tensor:
    """The run's weighted reward of what the policy wrote, judged against the original ``rows``
    (local, rule-based reward functions: a reward model is a one-line ConfigError naming ``who``)."""
    try:
        return ctx.rewards(rows, [w.ids for w in written]).float().cpu()
    except ConfigError:
        raise ConfigError(f"{who} scores what the policy writes with the run's reward functions on each process, which "
                          "must be rule-based (not a reward model); use a rule-based reward (e.g. reward=exact)") from None
