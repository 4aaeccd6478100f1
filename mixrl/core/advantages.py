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
  is applied (the included row gets 0, excluded rows ``r - mean``);
* a zero-variance group gives ``(r - mean) / eps``: 0 for its included rows, but an
  excluded row whose reward differs gets a very large advantage. Use ``dr_grpo`` (as
  LUFFY's script does) when excluded rows can differ from an all-equal group.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mixrl.core.registry import Registry

ADVANTAGES = Registry("advantage", runtime=("include", "token_rewards", "values", "mask"))  # the last three: per-token inputs (gae)


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
    """Per-row (broadcast) group count, sum, mean and std over included rows."""
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
    return r, inc, count[inv], total[inv], mean[inv], std[inv]


def _batch_stats(rewards: Tensor, include: Tensor | None, unbiased: bool = True):
    r, inc = _prepare(rewards, include)
    w = inc.to(r.dtype)
    count = w.sum()
    mean = (r * w).sum() / count.clamp(min=1.0)
    dof = (count - 1.0) if unbiased else count
    std = (((r - mean).pow(2) * w).sum() / dof.clamp(min=1.0)).sqrt()
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
) -> Tensor:
    """GRPO group-normalised advantage: ``A_i = (r_i - mean_g) / (std_g + eps)``.

    ``std_g`` is the *unbiased* (Bessel, n - 1) sample std of the included rows of the
    group, as ``torch.std`` in TRL, verl and CHORD's Trinity-RFT code; ``unbiased=False``
    gives the population std. CHORD: ``(r - mean) / (std + 1e-6)``.

    Formula: ``A_i = (R_i - mean_g R) / (std_g R + {eps})`` over the prompt's group g, unbiased (n - 1) std: {unbiased}

    Paper: GRPO, "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open
    Language Models"; CHORD.

    Parameters:
        include (None): bool [N], rows counted in the statistics (default all).
        eps (1e-6): added to the std.
        unbiased (True): n - 1 (True) or n (False) in the variance.
    """
    r, _, count, _, mean, std = _group_stats(rewards, group_ids, include, unbiased)
    return _normalise(r, count, mean, std, eps)


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


@ADVANTAGES.register("rloo")
def rloo(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    include: Tensor | None = None,
) -> Tensor:
    """RLOO: leave-one-out baseline ``A_i = r_i - mean_{j != i, j included, same group} r_j``.

    An excluded row's baseline is the mean of all included rows of its group. An
    included row that is alone in its group has no baseline: advantage 0.

    Formula: ``A_i = R_i - mean_{j != i in g} R_j`` (leave-one-out baseline within the group g)

    Paper: RLOO, "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from
    Human Feedback in LLMs" (Ahmadian et al. 2024); "Buy 4 REINFORCE Samples, Get a Baseline
    for Free!" (Kool et al. 2019).

    Parameters:
        include (None): bool [N], rows that serve as baselines (default all).
    """
    r, inc, count, total, _, _ = _group_stats(rewards, group_ids, include)
    w = inc.to(r.dtype)
    others = count - w  # number of included rows other than this one
    baseline = (total - r * w) / others.clamp(min=1.0)
    return torch.where(others >= 1, r - baseline, torch.zeros_like(r))


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

    Formula: ``A_i = (R_i - mean_batch R) / (std_batch R + {eps})``, unbiased (n - 1) std: {unbiased}

    Paper: the global normalisation of "REINFORCE++: A Simple and Efficient Approach for
    Aligning Large Language Models".

    Parameters:
        include (None): bool [N], rows counted in the statistics (default all).
        eps (1e-6): added to the std.
        unbiased (True): n - 1 (True) or n (False) in the variance.
    """
    r, count, mean, std = _batch_stats(rewards, include, unbiased)
    return _normalise(r, count, mean, std, eps)
