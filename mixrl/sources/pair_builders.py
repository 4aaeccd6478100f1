"""More pair constructors: SPIN's (demonstration, own rollout) pairs, RSO's pairs drawn by
statistical rejection sampling from the estimated optimal policy, and SeRA's pairs kept by their
implicit reward margin.

Both append their pairs after advantages, as the pair injections of :mod:`mixrl.sources.pairs` do
(the rows and links of :func:`mixrl.sources.pair_rows.append_sides`), and both read the policy's
rollouts of this step: groups held whole by this process, every row a rollout.

* ``spin_pairs``: chosen = the prompt's demonstration (the training data's expert column, through
  ``offpolicy=expert``; provenance ``pair_off_policy``), rejected = one of the policy's own rollouts of
  the prompt (``pair_on_policy``). SPIN iterates this with the opponent being the previous
  iteration's model: pair it with ``algo.kl.reset_every`` (:mod:`mixrl.config.ref_reset`).
* ``rso_pairs``: in each group, the rollouts are candidates from the policy; statistical rejection
  sampling with the group's rewards keeps up to ``accept`` of them as draws from
  pi*(y|x) ~ pi(y|x) exp(r(x, y) / beta), and consecutive accepted draws are paired and labelled by
  the reward (ties give no pair).
* ``sera_pairs``: off-policy pairs kept by the policy's implicit reward margin, plus rollout pairs
  labelled by the implicit reward itself (no external reward).
"""

from __future__ import annotations

import math
import random

from mixrl.core import provenance as prov
from mixrl.errors import ConfigError
from mixrl.sources.base import INJECTIONS, InjectContext
from mixrl.sources.pair_rows import Side, append_sides, row_side
from mixrl.sources.pairs import PAIR_OFF_POLICY, PAIR_ON_POLICY, GroupPairs


def local_groups(ctx: InjectContext, out: dict) -> dict[int, list[int]]:
    """Group id -> local row indices, for the groups held whole by this process whose rows are all rollouts."""
    group, source = out["group_id"].tolist(), out["row_source"].tolist()
    rows: dict[int, list[int]] = {}
    for i, g in enumerate(group):
        if g >= 0:
            rows.setdefault(g, []).append(i)
    return {g: m for g, m in rows.items() if len(m) == ctx.num_generations and all(source[i] == prov.ON_POLICY for i in m)}


def whole_micro_batches(n_pairs: int, geometry) -> int:
    """The most pairs <= n_pairs whose 2 rows per pair split evenly into the gradient-accumulation micro-batches."""
    ga = geometry.grad_accum if geometry is not None else 1
    unit = ga // math.gcd(2, ga)
    return n_pairs - n_pairs % unit


@INJECTIONS.register("spin_pairs", bounds={"pairs": (">= 1", "pairs appended per step, all processes")})
class SpinPairs(GroupPairs):
    """SPIN's self-play pairs: the prompt's human demonstration (chosen) against one of the policy's own
    rollouts of it (rejected), for up to ``pairs`` prompts per step.

    Formula: y_w = the demonstration of x (data.expert_column), y_l ~ pi_theta(.|x) (one rollout of x's group, drawn uniformly); pairs whose two completions are the same tokens are skipped; up to {pairs} pairs per step
    Paper: SPIN, "Self-Play Fine-Tuning Converts Weak Language Models to Strong Language Models" (arXiv 2401.01335): the main player
    learns to tell the SFT data (real) from the opponent's (the previous iteration's model's) generations; with
    algo.kl.reset_every the reference, which SPIN's loss uses as the opponent, is the policy of the previous iteration.
    The authors' loss (uclaml/SPIN, spin/alignment/trainer.py, spin_loss, lines 416-450 at commit
    a12ba808a51c23bb98c7cc892d261e9c2f71ff8e) is DPO's on (real, generated) with the opponent as reference
    (loss_type sigmoid: the dpo term; hinge: the slic term with reference: true, delta 1).

    Parameters:
        pairs (8): pairs per optimizer step, all processes (a multiple of the processes).
    """

    needs_source = True
    sources = ("expert",)
    provenances = ("pair_on_policy", "pair_off_policy")

    def after_advantages(self, ctx: InjectContext, inputs: list[dict], out: dict) -> dict:
        rng = self._rng(ctx)
        per_process = self.pairs // max(ctx.num_processes, 1)
        cm = out["completion_mask"].bool()
        picks, same, missing = [], 0, 0
        for g, members in local_groups(ctx, out).items():
            demos = self.source.for_prompt(inputs[members[0]]) if members[0] < len(inputs) else []
            if not demos:
                missing += 1
                continue
            i = members[rng.randrange(len(members))]
            demo = ctx.completion_ids(demos[rng.randrange(len(demos))])
            if out["completion_ids"][i][cm[i]].tolist() == demo:
                same += 1  # the rollout is the demonstration: a zero margin teaches nothing
                continue
            picks.append((i, demo))
        if len(picks) > per_process:
            picks = sorted(rng.sample(picks, per_process))
        picks = picks[: whole_micro_batches(len(picks), self.geometry)]
        self.metrics = {"pairs/on_policy": 0.0, "pairs/off_policy": 0.0, "pairs/spin": float(len(picks)),
                        "pairs/spin_same_as_demo": float(same), "pairs/spin_no_demo": float(missing)}
        if not picks:
            return out
        sides = []
        for i, demo in picks:
            rejected = row_side(out, i, PAIR_ON_POLICY)
            sides += [Side(prompt=rejected.prompt, completion=demo, code=PAIR_OFF_POLICY), rejected]
        return append_sides(ctx, out, sides)


def rejection_sample(rewards: list[float], accept: int, beta: float, rng: random.Random) -> list[int]:
    """Statistical rejection sampling (RSO's Algorithm 1): indices of up to ``accept`` candidates
    accepted as draws from pi* ~ pi exp(r / beta), given candidates drawn from pi. Each pass takes
    the best remaining reward r_max and accepts each remaining candidate, in order, with probability
    exp((r - r_max) / beta) (the best one always), removing the accepted ones, until ``accept`` are
    accepted or none remains."""
    remaining, accepted = list(range(len(rewards))), []
    while remaining and len(accepted) < accept:
        r_max = max(rewards[i] for i in remaining)
        kept = []
        for i in remaining:
            if len(accepted) < accept and rng.random() < math.exp((rewards[i] - r_max) / beta):
                accepted.append(i)
            else:
                kept.append(i)
        remaining = kept
    return accepted


@INJECTIONS.register("rso_pairs", bounds={
    "pairs": (">= 1", "pairs appended per step, all processes"),
    "beta": ("> 0", "the temperature of the target policy pi ~ pi_sft exp(r / beta); beta <= 0 is no distribution"),
    "accept": (">= 2", "draws accepted per group; a pair needs two"),
})
class RsoPairs(GroupPairs):
    """RSO's pairs: per group, statistical rejection sampling keeps up to ``accept`` rollouts as draws
    from the optimal policy pi*(y|x) ~ pi(y|x) exp(r(x, y) / beta); the accepted draws are paired in
    the order accepted ((1st, 2nd), (3rd, 4th), ...) and each pair labelled by its rewards.

    Formula: {y_1..y_G} ~ pi_old(.|x); accept y_i w.p. exp((r_i - r_max) / {beta}) per pass over the remaining ones, up to {accept} accepted; pairs (a_1, a_2), (a_3, a_4), ... with y_w the higher reward (ties skipped); up to {pairs} pairs per step
    Paper: RSO, "Statistical Rejection Sampling Improves Preference Optimization" (arXiv 2309.06657): preference pairs
    sampled from the estimated optimal policy by rejection sampling with the reward model, then labelled by it.
    The candidates here are the policy's own rollouts of this step (the paper's come from the SFT policy, once).

    Parameters:
        pairs (8): pairs per optimizer step, all processes (a multiple of the processes).
        beta (0.5): temperature of the target policy (the paper's beta of the rejection sampler).
        accept (4): draws accepted per group.
    """

    def __init__(self, *, pairs: int = 8, beta: float = 0.5, accept: int = 4, source=None, geometry=None, seed: int = 0):
        super().__init__(pairs=pairs, source=source, geometry=geometry, seed=seed)
        if not float(beta) > 0:
            raise ConfigError(f"algo.inject.beta={beta} must be > 0 (the temperature of the target policy)")
        if int(accept) < 2:
            raise ConfigError(f"algo.inject.accept={accept} must be >= 2: a pair needs two accepted draws")
        self.beta, self.accept = float(beta), int(accept)

    def after_advantages(self, ctx: InjectContext, inputs: list[dict], out: dict) -> dict:
        if "mixrl_reward" not in out:
            return out
        rng = self._rng(ctx)
        per_process = self.pairs // max(ctx.num_processes, 1)
        reward = out["mixrl_reward"].tolist()
        found, tied, accepted_n = [], 0, 0
        for g, members in sorted(local_groups(ctx, out).items()):
            acc = [members[k] for k in rejection_sample([reward[i] for i in members], self.accept, self.beta, rng)]
            accepted_n += len(acc)
            for a, b in zip(acc[0::2], acc[1::2]):
                if reward[a] == reward[b]:
                    tied += 1
                    continue
                found.append((a, b) if reward[a] > reward[b] else (b, a))
        if len(found) > per_process:
            found = sorted(rng.sample(found, per_process))
        found = found[: whole_micro_batches(len(found), self.geometry)]
        self.metrics = {"pairs/on_policy": float(len(found)), "pairs/off_policy": 0.0,
                        "pairs/rso_accepted": float(accepted_n), "pairs/rso_tied": float(tied)}
        if not found:
            return out
        return append_sides(ctx, out, [row_side(out, i, PAIR_ON_POLICY) for pair in found for i in pair])


def implicit_rewards(ctx: InjectContext, sides: list[Side], beta: float) -> list[float]:
    """Per side, the implicit reward beta [s(y) - s_ref(y)] under the policy now (sequence sums);
    fills each side's ``ref`` where it was unknown."""
    if not sides:
        return []
    policy = ctx.behaviour_logps([s.prompt for s in sides], [s.completion for s in sides])
    todo = [k for k, s in enumerate(sides) if s.ref is None]
    scored = ctx.ref_logps([sides[k].prompt for k in todo], [sides[k].completion for k in todo]) if todo else []
    for k, lp in zip(todo, scored):
        sides[k].ref = list(lp)
    return [beta * (sum(policy[k]) - sum(s.ref)) for k, s in enumerate(sides)]


@INJECTIONS.register("sera_pairs", bounds={
    "pairs": (">= 1", "pairs appended per step, all processes"),
    "pool": (">= 1", "candidate pairs drawn per kept off-policy pair"),
    "beta": ("> 0", "the scale of the implicit reward beta log(pi / pi_ref)"),
    "bootstrap": ("[0, 1]", "the share of bootstrapped (self-labelled rollout) pairs among the appended pairs"),
})
class SeraPairs(GroupPairs):
    """SeRA's self-reviewed pairs: off-policy pairs kept by their implicit reward margin (the largest
    ``1 / pool`` of the drawn candidates), plus bootstrapped pairs from the policy's own rollouts,
    labelled by the implicit reward (each group's highest vs lowest beta log(pi / pi_ref)), also kept by margin.

    Formula: m(y_w, y_l) = {beta} [log(pi / pi_ref)(y_w) - log(pi / pi_ref)(y_l)] under the policy now; off-policy: keep the top 1/{pool} of {pool} x n_off source pairs by m; bootstrapped: per group y_w = argmax_i r_hat(y_i), y_l = argmin_i, keep the top n_on by m; n_on = round({bootstrap} x {pairs})
    Paper: SeRA, "SeRA: Self-Reviewing and Alignment of Large Language Models using Implicit Reward Margins" (arXiv 2410.09362).
    Keeping the LARGEST margins is our reading of "sample selection using implicit reward margins" (the abstract
    does not say which end is kept); the paper's selection ratio and bootstrapping schedule are not reproduced.

    Parameters:
        pairs (8): pairs per optimizer step, all processes (a multiple of the processes).
        pool (2): candidate off-policy pairs drawn per kept one.
        beta (0.1): scale of the implicit reward (DPO's beta).
        bootstrap (0.5): share of bootstrapped rollout pairs, in [0, 1].
    """

    needs_source = True
    sources = ("pairs",)
    provenances = ("pair_on_policy", "pair_off_policy")
    may_leave_untrained = ()

    def __init__(self, *, pairs: int = 8, pool: int = 2, beta: float = 0.1, bootstrap: float = 0.5, source=None,
                 geometry=None, seed: int = 0):
        super().__init__(pairs=pairs, source=source, geometry=geometry, seed=seed)
        if int(pool) < 1 or not float(beta) > 0 or not 0.0 <= float(bootstrap) <= 1.0:
            raise ConfigError(f"sera_pairs: pool={pool} must be >= 1, beta={beta} > 0 and bootstrap={bootstrap} in [0, 1]")
        self.pool, self.beta, self.on_policy_share = int(pool), float(beta), float(bootstrap)

    def after_advantages(self, ctx: InjectContext, inputs: list[dict], out: dict) -> dict:
        rng = self._rng(ctx)
        n_on, n_off = self._targets(ctx)
        boot = []
        if n_on:
            for g, members in sorted(local_groups(ctx, out).items()):
                sides = [row_side(out, i, PAIR_ON_POLICY) for i in members]
                r_hat = implicit_rewards(ctx, sides, self.beta)
                hi, lo = max(range(len(sides)), key=r_hat.__getitem__), min(range(len(sides)), key=r_hat.__getitem__)
                if r_hat[hi] - r_hat[lo] > 1e-6:  # a smaller gap is a tie (float noise at the start, when pi = pi_ref)
                    boot.append((r_hat[hi] - r_hat[lo], sides[hi], sides[lo]))
        boot = sorted(boot, key=lambda t: -t[0])[:n_on]
        off = []
        if n_off and self.source is not None:
            cand = self.source.sample(rng, self.pool * n_off)
            prompts = ctx.tokenize_prompts([p for p, _, _ in cand])
            sides = [Side(prompt=list(p), completion=ctx.completion_ids(t), code=PAIR_OFF_POLICY)
                     for p, (_, c, r) in zip(prompts, cand) for t in (c, r)]
            r_hat = implicit_rewards(ctx, sides, self.beta)
            margins = [r_hat[2 * j] - r_hat[2 * j + 1] for j in range(len(cand))]
            off = sorted(((m, sides[2 * j], sides[2 * j + 1]) for j, m in enumerate(margins)), key=lambda t: -t[0])[:n_off]
        keep = whole_micro_batches(len(boot) + len(off), self.geometry)
        boot = boot[: min(len(boot), keep)]
        off = off[: keep - len(boot)]
        self.metrics = {"pairs/on_policy": float(len(boot)), "pairs/off_policy": float(len(off))}
        if off:
            self.metrics["pairs/sera_off_margin"] = sum(m for m, _, _ in off) / len(off)
        if not boot and not off:
            return out
        return append_sides(ctx, out, [s for _, w, l in (*boot, *off) for s in (w, l)])
