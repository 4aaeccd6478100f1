"""``algo.inject.refine: all``: the Critique-GRPO authors' refinement, every rollout refined, the best one kept.

The authors (zhangxy-2019/critique-GRPO @ e8f03a20b49511e10e71f361c70e46aae3ae8753,
verl/verl/critique_grpo/critique_vllm_rollout_spmd.py) sample n responses per question
(lines 321-333), score each with math-verify and write a critique for EVERY one, right or wrong
("The generated solution is correct/incorrect, the ground truth is X.": critique_prompts.py:120-125;
lines 350-387 here), let the policy refine each once (n = 1, lines 438-447), score the refinements
(459-500) and keep one per question: the first refinement scored 1, else the highest-scored one
(``process_refinement_groups``, lines 61-97; Python's ``max`` returns the first of equal scores).
That refinement takes the question's first ``n_prefix`` response slots (lines 549-581, 599-605:
the same refinement in each; the run's name "rollout7_critique_1" says n_prefix 1: 7 initial
responses + 1 refinement, although the fork's config leaves n_prefix at -1,
verl/verl/critique_grpo/config/critique_ppo_trainer.yaml:155, which the code would turn into a
refinement in every slot). The refinement is kept whatever its score.

Here: every eligible rollout (on-policy, not already guided) is refined by the ``refine``
injection's feedback and template; the refinements are scored with the run's first reward
function (gathered over processes, so every process makes the same choice); per group the first
refinement (in slot order) with reward >= ``success`` is kept, else the highest-scored one (the
first of equal scores), and it replaces the group's first ``per_group`` eligible slots. A kept
refinement may come from another process than the slots it fills: its tokens and behaviour
log-probs (recorded under its feedback context) travel by one gather.
"""

from __future__ import annotations

import torch

from mixrl.core import provenance as prov
from mixrl.sources.base import InjectContext, Rollouts


def keep_best(has: list[bool], scores: list[float], eligible: list[bool], G: int, per_group: int,
              success: float) -> dict[int, tuple[int, list[int]]]:
    """Per group g: (the global row whose refinement is kept, the global rows it fills).

    The kept refinement is the first (in slot order) scored at least ``success``, else the
    highest-scored (the first of equal scores); it fills the group's first ``per_group`` eligible
    slots. Groups without a refinement are left out."""
    plan = {}
    for g in range(len(has) // G):
        rows = [g * G + s for s in range(G) if has[g * G + s]]
        if not rows:
            continue
        ok = [j for j in rows if scores[j] >= success - 1e-6]
        best = ok[0] if ok else max(rows, key=lambda j: scores[j])  # max: the first of equal scores
        plan[g] = (best, [g * G + s for s in range(G) if eligible[g * G + s]][:per_group])
    return plan


def refine_every_rollout(inj, ctx: InjectContext, inputs: list[dict], rollouts: Rollouts) -> Rollouts:
    """``RefineFromFeedback.after_generation`` with ``refine: all`` (see the module docstring)."""
    n, G, L = len(rollouts.completion_ids), ctx.num_generations, ctx.max_completion_length
    start, dev = ctx.process_index * n, ctx.device
    refined_code = prov.code("refined")  # registered by mixrl.sources.with_feedback (which imports this module)
    primary = torch.nan_to_num(ctx.score(inputs, rollouts.completion_ids)[:, 0], nan=0.0)
    local = primary[start:start + n].tolist()
    mine = [rollouts.row_source[i] == prov.ON_POLICY and not rollouts.guided[i] for i in range(n)]
    jobs = []  # (local row, regeneration context ids)
    # a module:function builder's handle on the policy (Attempt.policy); feedback: self is refused with refine: all
    calls = ctx.policy_calls(f"algo.inject.feedback={inj.feedback_name!r}") if ctx.policy_calls is not None else None
    for a in range(n):
        if mine[a]:
            correct = local[a] >= inj.success - 1e-6
            job = inj.regeneration(ctx, inputs[a], list(rollouts.completion_ids[a]), float(local[a]), correct, policy=calls)
            if job is not None:
                jobs.append((a, job[0]))
    if calls is not None:  # every process joins the others' builder calls of the policy
        calls.sync(ctx.gather, device=dev)
    new_ids, _ = ctx.generate([gen for _, gen in jobs])  # every process calls it, even with no job
    refined: list[list[int] | None] = [None] * n
    context: list[list[int] | None] = [None] * n
    for (a, gen), cont in zip(jobs, new_ids):
        refined[a], context[a] = list(cont)[:L], gen
    # the refinements' scores, on every process (a row without one scores its own rollout again, not read)
    scored = [r if r is not None else rollouts.completion_ids[a] for a, r in enumerate(refined)]
    scores = torch.nan_to_num(ctx.score(inputs, scored)[:, 0], nan=-float("inf"))
    has = ctx.gather(torch.tensor([r is not None for r in refined], dtype=torch.bool, device=dev)).tolist()
    eligible = ctx.gather(torch.tensor(mine, dtype=torch.bool, device=dev)).tolist()
    plan = keep_best(has, scores.tolist(), eligible, G, inj.per_group, inj.success)
    kept = sorted(best - start for best, _ in plan.values() if start <= best < start + n)
    behaviour = ctx.behaviour_logps([context[a] for a in kept], [refined[a] for a in kept])  # every process joins
    ids = torch.full((n, L), -1, dtype=torch.long, device=dev)  # the kept refinements, padded, for the gather
    logps = torch.zeros((n, L), dtype=torch.float32, device=dev)
    for a, lp in zip(kept, behaviour):
        ids[a, :len(refined[a])] = torch.tensor(refined[a], dtype=torch.long, device=dev)
        logps[a, :len(lp)] = torch.tensor([float(v) for v in lp], dtype=torch.float32, device=dev)
    ids, logps = ctx.gather(ids), ctx.gather(logps)
    for a in range(n):
        if refined[a] is not None and a not in kept:
            rollouts.discarded_tokens.append(len(refined[a]))  # generated, not kept: counted in the rollout budget
    for best, targets in plan.values():
        width = int((ids[best] >= 0).sum())
        for t in (t - start for t in targets if start <= t < start + n):
            rollouts.discarded_tokens.append(len(rollouts.completion_ids[t]))
            rollouts.completion_ids[t] = ids[best, :width].tolist()
            rollouts.token_source[t] = [refined_code] * width
            rollouts.behaviour_logp[t] = logps[best, :width].tolist()
            rollouts.guided[t] = 2
            if rollouts.logprobs is not None:  # sampled under the feedback context: no engine correction against pi_old(. | x)
                rollouts.logprobs[t] = [None] * width
    if ctx.log is not None:
        ctx.log("refine/rows", float(sum(len(t) for _, t in plan.values())))
        ctx.log("refine/generated", float(sum(has)))
        ctx.log("refine/first_pass_success", float((primary >= inj.success - 1e-6).float().mean()))
        if plan:  # the kept refinements' success rate, per group
            ctx.log("refine/success", sum(float(scores[b] >= inj.success - 1e-6) for b, _ in plan.values()) / len(plan))
    return rollouts

