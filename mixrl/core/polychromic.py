"""Set-level advantage of a polychromic objective (``algo.advantage.name=polychromic``).

"Polychromic Objectives for Reinforcement Learning" (Ibn Hamid, Orney, Xu, Finn, Sadigh;
arXiv 2509.25424) scores a *set* of ``n`` rollouts from one state, not a single rollout: the
polychromic objective is the set's mean reward times the set's diversity,
``f(S) = (1/n sum_{i in S} r_i) * d(S)``, so a set scores high only when it is both successful
and diverse. A rollout's advantage is its *marginal* set advantage: the mean score of the sets
that contain it minus the mean score of all sets (the authors' own description:
jubayer-hamid.github.io/set_rl_visualizations, "a measure of the expected score of all sets
containing y, minus the average score of all sets"). A failed rollout that adds diversity to sets
whose other members succeed can thus get a positive advantage.

mixrl's reading, for a group of ``G`` completions of one prompt:

* the sets are *every* subset of size ``n`` (``set_size``) of the group's included rows,
  enumerated exactly (``C(G, n)`` sets); the paper samples ``M`` sets of size ``n`` from the
  ``N`` rollouts of a vine state and uses a learned value as the baseline at the other states;
* ``d(S)`` is the number of distinct final answers in the set divided by ``n`` (the trainer
  gives each row an ``answer_ids`` class, :mod:`mixrl.trainer.parts.answer_ids`: the arithmetic
  task's ``#### <int>`` answer, else the whole completion text). The paper's ``d`` counts
  semantically distinct trajectories with each environment's own notion of distinct (e.g. the
  rooms a BabyAI / Minigrid trajectory visits); an answer class is the toy's nearest analogue;
* vine sampling (re-rolling ``N`` rollouts from states along earlier trajectories) is left out:
  the sets come from the prompt's group, i.e. only the initial state is a "vine" state.

The authors' code had not been published when this was written (no repository found;
en.papernotes.org lists "Code: TBD"), so the values here follow the paper's definition and
the authors' description of the marginal advantage, not a code reference.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from mixrl.core.advantages import ADVANTAGES

MAX_SETS = 200_000  # C(G, n) above this: refuse (the enumeration would dominate the step)


def set_scores(rewards: Tensor, answer_ids: Tensor, sets: Tensor) -> Tensor:
    """[S] the polychromic score of each set (rows of ``sets``: [S, n] row indices).

    Formula: f(S) = (1/n sum_{i in S} r_i) * |{answer_ids_i : i in S}| / n"""
    n = sets.shape[1]
    mean_r = rewards[sets].mean(dim=1)
    ids = answer_ids[sets].sort(dim=1).values
    distinct = 1 + (ids[:, 1:] != ids[:, :-1]).sum(dim=1)
    return mean_r * distinct.to(mean_r.dtype) / n


def group_marginal_advantage(rewards: Tensor, answer_ids: Tensor, set_size: int) -> Tensor:
    """[G] each row's marginal set advantage within one group (all subsets of size ``set_size``).

    Formula: A_i = mean_{S contains i} f(S) - mean_S f(S)"""
    g = rewards.shape[0]
    if g < set_size:  # no set can be formed (rows excluded from the statistics): no signal, like GRPO's group of one
        return torch.zeros_like(rewards)
    count = math.comb(g, set_size)
    if count > MAX_SETS:
        raise ValueError(f"polychromic: C({g}, {set_size}) = {count} sets per group exceeds {MAX_SETS}; lower algo.advantage.set_size")
    sets = torch.combinations(torch.arange(g, device=rewards.device), r=set_size).reshape(count, set_size)
    f = set_scores(rewards, answer_ids, sets)
    member = torch.zeros(count, g, dtype=f.dtype, device=f.device)
    member.scatter_(1, sets, 1.0)
    per_row = (member * f.unsqueeze(1)).sum(0) / member.sum(0)
    return per_row - f.mean()


@ADVANTAGES.register("polychromic", bounds={"set_size": (">= 2", "a set of one rollout has no diversity to score")})
def polychromic(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    include: Tensor | None = None,
    answer_ids: Tensor | None = None,
    set_size: int = 4,
) -> Tensor:
    """Set-level (polychromic) advantage: the mean score of the sets of the group that contain the row minus the mean score of all its sets, a set scoring mean reward times diversity.

    The trainer passes ``answer_ids`` ([N] int: rows with the same final answer share a class).
    Excluded rows (``include`` False) are in no set and get 0; a group with fewer included rows
    than ``set_size`` forms no set and gets 0 (``set_size > num_generations`` is refused at config
    time); ``set_size`` equal to the group's size leaves one set, so every
    advantage is 0. No normalisation by a std.

    Formula: ``A_i = mean_(S in sets of group g, i in S) f(S) - mean_(S in sets of g) f(S)``, ``f(S) = (1/{set_size}) sum_(j in S) r_j * (distinct final answers in S) / {set_size}``, over every subset S of size {set_size} of the included rows of the prompt's group

    Paper: "Polychromic Objectives for Reinforcement Learning" (arXiv 2509.25424): the set's
    score is mean reward x diversity; vine sampling is left out (sets come from the prompt's group)
    and every subset is enumerated instead of sampling M sets.

    Parameters:
        include (None): bool [N], rows that enter the sets (default all).
        answer_ids (None): int [N], each row's final-answer class (runtime).
        set_size (4): n, the rollouts per set (2 <= n <= num_generations).
    """
    if answer_ids is None:
        raise ValueError("polychromic needs answer_ids (each row's final-answer class, given by the trainer)")
    if set_size < 2:
        raise ValueError(f"polychromic: set_size={set_size} < 2; a set of one rollout has no diversity")
    r = rewards.detach().float()
    ids = answer_ids.to(device=r.device).long()
    inc = torch.ones_like(r, dtype=torch.bool) if include is None else include.to(device=r.device).bool()
    gid = group_ids.to(r.device).long()
    adv = torch.zeros_like(r)
    for g in torch.unique(gid).tolist():
        rows = torch.nonzero((gid == g) & inc).flatten()
        if rows.numel() == 0:
            continue
        adv[rows] = group_marginal_advantage(r[rows], ids[rows], set_size)
    return adv


polychromic.needs = ("answer_ids",)
