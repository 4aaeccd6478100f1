"""Outcome advantages, one per row (axis A6, ``advantage/``).

Signature of every registered estimator::

    fn(rewards [N], group_ids [N] long, *, include=None, <params>) -> Tensor [N]

``group_ids`` gives each row its prompt group (any integer labels; they need not be
contiguous). ``include`` (bool [N], default all True) marks the rows that count in the
group / batch statistics; rows excluded from it (e.g. expert rows in LUFFY's
"on-policy statistics only" option) still get an advantage, computed against the
statistics of the included rows. The result is detached and floating point.

Degenerate groups (documented, tested):
* a group with no included row: advantage 0 for all its rows (no baseline, no signal);
* std needs at least 2 included rows; with one, the std is undefined and no scaling
  is applied (the included row gets 0, excluded rows ``r - mean``). LUFFY's ``grpo_split``
  and verl's ``grpo`` differ here: they take mean 0 and std 1 for a one-row group, so
  every row of it gets ``r / (1 + eps)``;
* a zero-spread normaliser (every included reward of the group, or of the batch, equal)
  divides by 1 instead of 0, as LUFFY's ``compute_grpo_outcome_advantage_split`` (its std
  0 becomes 1): the included rows get 0 and an excluded row ``(r - mean) / (1 + eps)``,
  not ``(r - mean) / eps`` (about 10^6 for an expert row beside all-equal rollouts). The
  same rule holds for every normaliser here whose statistics can leave rows out: ``grpo``
  (``scale`` group and batch), ``batch_norm``, the whitening of ``reinforce_pp`` /
  ``reinforce_pp_baseline`` and ``gae``. mixrl tests the spread (max == min of the included
  values), not a computed std of exactly 0: the same for 0/1 rewards, and also right where
  ``torch.std`` of equal non-dyadic values comes out about 1e-8 (seven float32 0.1s: 8e-9).
"""

from __future__ import annotations

import torch
from torch import Tensor

from mixrl.core.advantage_shaping import sign_weight  # positive_amplified is dr_grpo / grpo + this shaping
from mixrl.core.registry import Registry

#: runtime inputs the trainer supplies besides ``include``, to the estimators that list them in
#: their ``needs`` attribute: ``lengths`` (float [N], completion tokens of each row) and
#: ``baseline_rewards`` (float [N], the reward of a greedy completion of each row's prompt)
ADVANTAGES = Registry("advantage", runtime=("include", "lengths", "baseline_rewards", "token_rewards", "values", "mask", "turn_rewards", "turn_ids",
                                         "token_credit", "answer_ids", "turn_matched"))
#: (``token_rewards``, ``values``, ``mask``: the per-token inputs of ``gae``; ``turn_rewards``, ``turn_ids``: ``mt_grpo``'s;
#: ``token_credit``, ``mask``: ``capo``'s; ``answer_ids``: ``polychromic``'s; ``turn_matched``: ``uis1``'s)


#: the values of ``grpo``'s ``scale`` (TRL's ``scale_rewards``), checked by config validation
GRPO_SCALES = ("group", "batch", "none")


def advantage_needs(fn) -> tuple[str, ...]:
    """The runtime inputs (besides ``include``) an estimator needs: its ``needs`` attribute."""
    return tuple(getattr(fn, "needs", ()))


def _prepare(rewards: Tensor, include: Tensor | None) -> tuple[Tensor, Tensor]:
    r = rewards.detach()
    if not torch.is_floating_point(r):
        r = r.to(torch.float32)
    if include is None:
        inc = torch.ones_like(r, dtype=torch.bool)
    else:
        inc = include.to(device=r.device).bool()
        if inc.shape != r.shape:
            raise ValueError(f"include has shape {tuple(inc.shape)}, rewards {tuple(r.shape)}")
    return r, inc


def _group_stats(rewards: Tensor, group_ids: Tensor, include: Tensor | None, unbiased: bool = True):
    """Per-row (broadcast) group count, sum, mean and std over included rows; a group whose
    included rewards are all equal (zero spread) gets that value as its mean exactly and std 1
    (LUFFY's ``compute_grpo_outcome_advantage_split``: std 0 becomes 1)."""
    r, inc = _prepare(rewards, include)
    if group_ids.shape != r.shape:
        raise ValueError(f"group_ids has shape {tuple(group_ids.shape)}, rewards {tuple(r.shape)}")
    _, inv = torch.unique(group_ids.to(r.device), return_inverse=True)
    n_groups = int(inv.max().item()) + 1 if inv.numel() else 0
    w = inc.to(r.dtype)
    zeros = torch.zeros(n_groups, dtype=r.dtype, device=r.device)
    count = zeros.index_add(0, inv, w)
    total = zeros.index_add(0, inv, r * w)
    mean = total / count.clamp(min=1.0)
    sq = zeros.index_add(0, inv, (r - mean[inv]).pow(2) * w)
    dof = (count - 1.0) if unbiased else count
    std = (sq / dof.clamp(min=1.0)).sqrt()
    big = torch.finfo(r.dtype).max
    hi = zeros.scatter_reduce(0, inv, torch.where(inc, r, torch.full_like(r, -big)), "amax", include_self=False)
    lo = zeros.scatter_reduce(0, inv, torch.where(inc, r, torch.full_like(r, big)), "amin", include_self=False)
    flat = (count >= 1) & (hi == lo)
    mean = torch.where(flat, lo, mean)
    std = torch.where(flat, torch.ones_like(std), std)
    return r, inc, count[inv], total[inv], mean[inv], std[inv]


def _batch_stats(rewards: Tensor, include: Tensor | None, unbiased: bool = True):
    """Count, mean and std of the included rewards of the batch; zero spread: mean exact, std 1
    (the rule of :func:`_group_stats`)."""
    r, inc = _prepare(rewards, include)
    w = inc.to(r.dtype)
    count = w.sum()
    mean = (r * w).sum() / count.clamp(min=1.0)
    dof = (count - 1.0) if unbiased else count
    std = (((r - mean).pow(2) * w).sum() / dof.clamp(min=1.0)).sqrt()
    if bool(inc.any()) and bool(r[inc].max() == r[inc].min()):
        mean, std = r[inc].min(), torch.ones_like(std)
    return r, count, mean, std


def _normalise(r, count, mean, std, eps):
    adv = torch.where(count >= 2, (r - mean) / (std + eps), r - mean)
    return torch.where(count >= 1, adv, torch.zeros_like(adv))


@ADVANTAGES.register("grpo", bounds={"eps": ("> 0", "(r - mean) / (std + eps) divides by zero for equal rewards when eps = 0")})
def grpo(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    include: Tensor | None = None,
    eps: float = 1e-6,
    unbiased: bool = True,
    scale: str = "group",
) -> Tensor:
    """GRPO group-normalised advantage: ``A_i = (r_i - mean_g) / (std_g + eps)``.

    ``std_g`` is the *unbiased* (Bessel, n - 1) sample std of the included rows of the
    group, as ``torch.std`` in TRL, verl and CHORD's Trinity-RFT code; ``unbiased=False``
    gives the population std. CHORD: ``(r - mean) / (std + 1e-6)``.

    ``scale`` is TRL's ``scale_rewards``: ``group`` (default) divides by the group's std,
    ``batch`` by the std of the included rewards of the whole batch around the batch mean (as
    TRL's ``nanstd(rewards)``; the group mean is still subtracted), ``none`` does not divide
    (then it equals ``dr_grpo``). With ``batch`` and fewer than 2 included rows in the batch no
    scaling is applied. TRL adds 1e-4 to the std, mixrl ``eps`` (default 1e-6).

    Rows left out of the statistics (``include``; ``algo.advantage_include_offpolicy=false`` is
    LUFFY's ``adv_estimator=grpo_split``) are normalised with the included rows' mean and std.
    When those are all equal, the std is 0 and LUFFY divides by 1 instead (its
    ``compute_grpo_outcome_advantage_split``): so does mixrl, for ``scale`` group and batch
    alike, so an expert row beside all-equal rollouts gets ``(r - mean) / (1 + eps)``, not
    about 10^6.

    Formula: ``A_i = (R_i - mean_g R) / (std_g R + {eps})`` over the prompt's group g, unbiased (n - 1) std: {unbiased}; scale={scale} (group: as written; batch: the batch's std instead of std_g; none: no division); a std of 0 (all included rewards equal) counts as 1 (LUFFY's grpo_split), a group with one included row is only centred (LUFFY, verl: r / (1 + eps))

    Paper: GRPO, "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open
    Language Models"; CHORD.

    Parameters:
        include (None): bool [N], rows counted in the statistics (default all).
        eps (1e-6): added to the std.
        unbiased (True): n - 1 (True) or n (False) in the variance.
        scale (group): group | batch | none, the std the centred reward is divided by (TRL's scale_rewards).
    """
    r, _, count, _, mean, std = _group_stats(rewards, group_ids, include, unbiased)
    if scale == "group":
        return _normalise(r, count, mean, std, eps)
    if scale not in GRPO_SCALES:
        raise ValueError(f"grpo scale must be group, batch or none, got {scale!r}")
    centred = torch.where(count >= 1, r - mean, torch.zeros_like(r))
    if scale == "none":
        return centred
    _, n_batch, _, batch_std = _batch_stats(rewards, include, unbiased)
    return centred / (batch_std + eps) if float(n_batch) >= 2 else centred


@ADVANTAGES.register("dr_grpo")
def dr_grpo(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    include: Tensor | None = None,
) -> Tensor:
    """Dr.GRPO: mean-centred, no std division: ``A_i = r_i - mean_g``.

    Formula: ``A_i = R_i - mean_g R`` over the prompt's group g (no std division)

    Paper: Dr.GRPO, "Understanding R1-Zero-Like Training: A Critical Perspective"; LUFFY's
    script (std normalisation off).

    Parameters:
        include (None): bool [N], rows counted in the group mean (default all).
    """
    r, _, count, _, mean, _ = _group_stats(rewards, group_ids, include)
    return torch.where(count >= 1, r - mean, torch.zeros_like(r))


@ADVANTAGES.register("positive_amplified", bounds={
    "amplify": (">= 1", "the factor on non-negative advantages of failed rows; below 1 would damp them"),
    "eps": ("> 0", "(r - mean) / (std + eps) divides by zero for equal rewards when eps = 0"),
})
def positive_amplified(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    include: Tensor | None = None,
    success: float = 1.0,
    success_advantage: float = 1.0,
    amplify: float = 3.0,
    std: bool = False,
    eps: float = 1e-6,
) -> Tensor:
    """R³L's Positive Amplification: successful rows get a fixed positive advantage, and the
    non-negative advantages of the others are multiplied, so the few successes of a
    failure-dominated group (with its retries) still lead the update.

    ``a_i = R_i - mean_g R`` (``std``: divided by ``std_g + eps``, as ``grpo``); then
    ``A_i = success_advantage`` if ``R_i >= success``, ``amplify * a_i`` if ``a_i >= 0``, else
    ``a_i``. As the authors' ``opmd_reweight_adv`` (``std=false``, used by their full R³L) and
    ``grpo_reweight_adv`` (``std=true``), shiweijiezero/R3L @ d503f6c,
    ``trinity/algorithm/advantage_fn/opmd_advantage.py`` and ``grpo_advantage.py``:
    success advantage 1.0, amplification 3.

    Formula: ``a_i = R_i - mean_g R`` (std: {std}, then / (std_g R + {eps})); ``A_i = {success_advantage}`` if ``R_i >= {success}``, ``{amplify} a_i`` if ``a_i >= 0``, else ``a_i``

    Paper: R³L, "R³L: Reflect-then-Retry Reinforcement Learning with Language-Guided
    Exploration, Pivotal Credit, and Positive Amplification" (arXiv 2601.03715).

    Parameters:
        include (None): bool [N], rows counted in the group statistics (default all).
        success (1.0): a row whose reward is at least this has succeeded.
        success_advantage (1.0): the advantage of a successful row.
        amplify (3.0): factor on the non-negative advantages of rows that did not succeed.
        std (False): divide the centred reward by the group std (grpo_reweight_adv) or not (opmd_reweight_adv).
        eps (1e-6): added to the std.
    """
    r, _, count, _, mean, sd = _group_stats(rewards, group_ids, include)
    a = _normalise(r, count, mean, sd, eps) if std else torch.where(count >= 1, r - mean, torch.zeros_like(r))
    return sign_weight(a, rewards=r, positive=amplify, negative=1.0, success=success, success_advantage=success_advantage)


@ADVANTAGES.register("rloo")
def rloo(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    include: Tensor | None = None,
    singleton_reward: bool = False,
) -> Tensor:
    """RLOO: leave-one-out baseline ``A_i = r_i - mean_{j != i, j included, same group} r_j``.

    An excluded row's baseline is the mean of all included rows of its group. An
    included row that is alone in its group has no baseline: advantage 0, as verl's
    ``rloo_vectorized`` (``(c > 1)`` zeroes it); ``singleton_reward=True`` gives it ``A = R``
    instead, as verl's ``rloo`` (which leaves a one-response group's score as it is).

    Formula: ``A_i = R_i - mean_{j != i in g} R_j`` (leave-one-out baseline within the group g); an included row alone in g: A_i = R_i if singleton_reward (verl rloo), else 0 (verl rloo_vectorized); singleton_reward: {singleton_reward}

    Paper: RLOO, "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from
    Human Feedback in LLMs" (Ahmadian et al. 2024); "Buy 4 REINFORCE Samples, Get a Baseline
    for Free!" (Kool et al. 2019).

    Parameters:
        include (None): bool [N], rows that serve as baselines (default all).
        singleton_reward (False): an included row alone in its group gets R (verl rloo) instead of 0 (verl rloo_vectorized).
    """
    r, inc, count, total, _, _ = _group_stats(rewards, group_ids, include)
    w = inc.to(r.dtype)
    others = count - w  # number of included rows other than this one
    baseline = (total - r * w) / others.clamp(min=1.0)
    alone = r if singleton_reward else torch.zeros_like(r)
    return torch.where(others >= 1, r - baseline, alone)


@ADVANTAGES.register("reinforce")
def reinforce_baseline(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    include: Tensor | None = None,
) -> Tensor:
    """REINFORCE with a batch-mean baseline: ``A_i = r_i - mean_batch`` (groups ignored).

    No included row: advantage 0.

    Formula: ``A_i = R_i - mean_batch R`` (batch baseline, groups ignored)

    Paper: the REINFORCE baseline of "Tapered Off-Policy REINFORCE: Stable and efficient
    reinforcement learning for LLMs" and "Group-Relative REINFORCE Is Secretly an
    Off-Policy Algorithm: Demystifying Some Myths About GRPO and Its Friends".

    Parameters:
        include (None): bool [N], rows counted in the batch mean (default all).
    """
    r, count, mean, _ = _batch_stats(rewards, include)
    return torch.where(count >= 1, r - mean, torch.zeros_like(r))


@ADVANTAGES.register("batch_norm", bounds={"eps": ("> 0", "(r - mean) / (std + eps) divides by zero for equal rewards when eps = 0")})
def batch_norm(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    include: Tensor | None = None,
    eps: float = 1e-6,
    unbiased: bool = True,
) -> Tensor:
    """Batch-normalised advantage: ``A_i = (r_i - mean_batch) / (std_batch + eps)``.

    Groups are ignored; the std is unbiased (n - 1) by default, as in ``grpo``.

    Formula: ``A_i = (R_i - mean_batch R) / (std_batch R + {eps})``, unbiased (n - 1) std: {unbiased}; a std of 0 (all included rewards equal) counts as 1 (LUFFY's grpo_split rule)

    Paper: the global normalisation of "REINFORCE++: A Simple and Efficient Approach for
    Aligning Large Language Models".

    Parameters:
        include (None): bool [N], rows counted in the statistics (default all).
        eps (1e-6): added to the std.
        unbiased (True): n - 1 (True) or n (False) in the variance.
    """
    r, count, mean, std = _batch_stats(rewards, include, unbiased)
    return _normalise(r, count, mean, std, eps)


