"""AMPO's guidance on demand (``algo.inject.name=refill_failed``): the teachers' correct candidates that the
student understands best replace a failing group's rollouts (:class:`RefillFailed`, :func:`comprehension`).
The teachers themselves are :class:`mixrl.sources.teacher.TeacherSource`'s."""

from __future__ import annotations

import math
import random

import torch

from mixrl.errors import ConfigError
from mixrl.sources.base import INJECTIONS, InjectContext, Injection, Rollouts
from mixrl.sources.teacher import TEACHER


# --------------------------------------------------------------------------- AMPO
@INJECTIONS.register("refill_failed", bounds={
    "per_group": (">= 1", "rollouts of a guided group replaced"),
    "candidates": (">= 1", "completions each teacher samples"),
    "guide_below": ("(0, 1]", "a group is guided when its success rate is below it"),
})
class RefillFailed(Injection):
    """AMPO's guidance on demand: when too few rollouts of a group succeed, the teacher(s)
    generate candidates for the prompt; the correct ones (reward >= ``threshold``) that the
    student understands best (highest mean token probability under the policy:
    comprehension-based selection) replace k of the group's failed rollouts before rewards are
    computed. Groups that succeed often enough, or have no correct candidate, keep their rollouts.

    Which groups: ``guide_below: null`` guides only groups where every rollout failed; a rate
    guides every group whose success rate (rollouts at or above ``threshold``, over G) is below
    it (the authors' ``pass_num / n`` = 4/8 = 0.5, ``mix_dapo_trainer.py:1306, 1396-1403`` of
    EnigmaYYYY/AMPO @ 647e2e4). How many (k): ``per_group``, or with ``adaptive_k`` the authors'
    ``use_adaptive_k`` (``mix_dapo_trainer.py:1397-1401``): k = min(number of teachers,
    int(G * guide_below - correct rollouts)), e.g. G = 8: 4 - correct. At most the group's
    failed rollouts are replaced (``min(effective_k, num_incorrect)``, line 1453), the last
    failed slots here (the authors draw them at random, ``random.sample``, line 1455: a
    group's rollouts are exchangeable, so which failed ones is immaterial).

    Formula: if #{i: r(y_i) >= tau} / G < rho (rho = {guide_below|unset: only groups with no success}): k of the group's failed y_i are replaced by the top-k correct teacher candidates c by mean_t pi_theta(c_t | x, c_<t); k = min(#teachers, int(G rho - #correct)) if adaptive_k ({adaptive_k}) else per_group ({per_group})
    Paper: AMPO, "More Than One Teacher: Adaptive Multi-Guidance Policy Optimization for Diverse Exploration" (arXiv 2510.02227).

    Parameters:
        per_group (2): teacher completions per guided group (k) without adaptive_k, between 1 and num_generations - 1.
        candidates (2): completions each teacher generates per guided prompt.
        threshold (1.0): a rollout fails when its reward is below it; a candidate is correct at or above it.
        select (likelihood): likelihood (comprehension-based) | random | first.
        guide_below (None): a group is guided when its success rate is below this; null: only when every rollout failed.
        adaptive_k (False): k = min(#teachers, int(G * guide_below - #correct)) instead of per_group (needs guide_below).
    """

    needs_source = False  # its material comes from the teacher config group, not offpolicy
    needs_teacher = True
    provenances = ("teacher",)
    row_code = TEACHER  # the provenance of the rows it writes (refill_from_data: its source's)

    def __init__(self, *, per_group: int = 2, candidates: int = 2, threshold: float = 1.0, select: str = "likelihood",
                 guide_below: float | None = None, adaptive_k: bool = False,
                 source=None, geometry=None, seed: int = 0):
        super().__init__(source=source, geometry=geometry, seed=seed)
        if geometry is not None and not 1 <= per_group < geometry.num_generations:
            raise ConfigError(
                f"algo.inject.per_group={per_group} must be between 1 and num_generations-1={geometry.num_generations - 1}"
            )
        if candidates < 1:
            raise ConfigError(f"algo.inject.candidates={candidates} must be >= 1")
        if select not in ("likelihood", "random", "first"):
            raise ConfigError(f"algo.inject.select must be likelihood, random or first, got {select!r}")
        if guide_below is not None and not 0.0 < float(guide_below) <= 1.0:
            raise ConfigError(f"algo.inject.guide_below={guide_below} must be in (0, 1] (a success rate), or null "
                              "(guide only groups where every rollout failed)")
        if adaptive_k and guide_below is None:
            raise ConfigError("algo.inject.adaptive_k=true needs algo.inject.guide_below (k = int(G * guide_below - correct)); "
                              "set algo.inject.guide_below=0.5 (the AMPO authors') or adaptive_k=false")
        self.per_group, self.candidates, self.threshold, self.select = per_group, candidates, float(threshold), select
        self.guide_below = None if guide_below is None else float(guide_below)
        self.adaptive_k = bool(adaptive_k)
        self.last: dict[str, float] = {}

    def plan(self, ok: list[bool], n_teachers: int) -> list[int]:
        """The slots of one group (``ok[s]``: rollout s succeeded) that teacher completions fill, in
        the order they take the best candidates: the group's last k failed slots, ascending."""
        G, correct = len(ok), sum(ok)
        if self.guide_below is None:
            guided, k = correct == 0, self.per_group
        else:
            guided = correct / G < self.guide_below
            k = min(n_teachers, int(G * self.guide_below - correct)) if self.adaptive_k else self.per_group
        failed = [s for s in range(G) if not ok[s]]
        if not guided or k <= 0 or not failed:
            return []
        return failed[-min(k, len(failed)):]

    def after_generation(self, ctx: InjectContext, inputs: list[dict], rollouts: Rollouts) -> Rollouts:
        n = len(rollouts.completion_ids)
        if n == 0 or (self.needs_teacher and not ctx.teachers):
            return rollouts
        G = ctx.num_generations
        local = ctx.rewards(inputs, rollouts.completion_ids).float()
        rewards = ctx.gather(local.to(ctx.device))
        start = ctx.process_index * n
        ok = (torch.nan_to_num(rewards, nan=-math.inf) >= self.threshold).tolist()
        n_groups, avail = len(ok) // G, self.writers(ctx, inputs, len(ok))  # avail: per global row, k's cap
        slots = {g: self.plan(ok[g * G:(g + 1) * G], avail[g * G]) for g in range(n_groups)}
        stats = {"failed_groups": float(sum(bool(v) for v in slots.values())), "refilled_rows": 0.0, "candidates": 0.0,
                 "correct_candidates": 0.0}
        rng = random.Random(hash((self.seed, ctx.process_index, ctx.global_step, ctx.micro_step)))
        targets = []  # (local row, group, index among the group's refilled slots)
        for i in range(n):
            g, slot = (start + i) // G, (start + i) % G
            if slot in slots.get(g, ()):
                targets.append((i, g, slots[g].index(slot)))
        first_row: dict[int, int] = {}
        for i, g, _ in targets:
            first_row.setdefault(g, i)
        pools = {g: self._candidates(ctx, inputs[i], stats) for g, i in first_row.items()}
        picked = self._select(ctx, pools, rng)
        for i, g, j in targets:
            chosen = picked[g]
            if j >= len(chosen):
                continue
            ids, behaviour = chosen[j]
            rollouts.completion_ids[i] = ids
            if rollouts.logprobs is not None:
                rollouts.logprobs[i] = [None] * len(ids)
            rollouts.row_source[i] = self.row_code
            rollouts.behaviour_logp[i] = behaviour
            stats["refilled_rows"] += 1
        self.last = stats
        return rollouts

    def writers(self, ctx: InjectContext, inputs: list[dict], n_global: int) -> list[int]:  # the teachers, every row
        return [len(ctx.teachers)] * n_global

    def _candidates(self, ctx: InjectContext, row: dict, stats: dict) -> tuple[list[int], list[tuple[list[int], list[float]]]]:
        """``(prompt ids, correct teacher candidates with their behaviour log-probs)`` for ``row``'s
        prompt, in the teachers' order. Only the teachers run here (their forwards are local)."""
        prompt_ids = ctx.tokenize_prompts([row["prompt"]])[0]
        cands: list[list[int]] = []
        behaviour: list[list[float]] = []
        for teacher in ctx.teachers:
            ids = ctx.generate_with(teacher, prompt_ids, self.candidates)
            ids = [c for c in ids if c]
            if not ids:
                continue
            cands += ids
            behaviour += ctx.score_tokens(teacher, [prompt_ids] * len(ids), ids)
        stats["candidates"] += len(cands)
        if not cands:
            return prompt_ids, []
        ok = ctx.rewards([row] * len(cands), cands).float() >= self.threshold
        keep = [(cands[k], behaviour[k]) for k in range(len(cands)) if bool(ok[k])]
        stats["correct_candidates"] += len(keep)
        return prompt_ids, keep

    def _select(self, ctx: InjectContext, pools: dict, rng) -> dict[int, list[tuple[list[int], list[float]]]]:
        """Each guided group's candidates, best first (the caller takes the first k). ``likelihood`` scores
        the candidates of all groups in one call of the policy, made by every process even with
        none: under a sharded policy each forward needs every process (a call per group would
        leave a process with fewer failed groups behind)."""
        if self.select == "likelihood":
            flat = [(g, c) for g, (_, keep) in pools.items() for c in keep]
            student = ctx.score_tokens(ctx.policy, [pools[g][0] for g, _ in flat], [c[0] for _, c in flat])
            score = [comprehension(lp) for lp in student]
            out: dict[int, list] = {g: [] for g in pools}
            for (g, c), sc in sorted(zip(flat, score), key=lambda x: -x[1]):  # stable: ties keep the teachers' order
                out[g].append(c)
            return out
        result = {}
        for g, (_, keep) in pools.items():
            keep = list(keep)
            if self.select == "random":
                rng.shuffle(keep)
            result[g] = keep
        return result

    def metrics(self) -> dict[str, float]:
        return {f"ampo/{k}": v for k, v in self.last.items()}


def comprehension(logps: list[float]) -> float:
    """AMPO's comprehension score of a candidate: the student's mean token probability,
    ``(1/T) sum_t exp(log pi_theta(c_t | x, c_<t))`` (their ``mean_exp_log_softmax``)."""
    if not logps:
        return -math.inf
    return sum(math.exp(v) for v in logps) / len(logps)
