"""Advantages with a batch-wide whitening or a length-weighted baseline (axis A6, ``advantage/``; the
signature and conventions of :mod:`mixrl.core.advantages`, whose registry they join): REINFORCE++ and its
group-baseline variant, OPO's length-weighted baseline, ReMax's greedy baseline."""

from __future__ import annotations

import torch
from torch import Tensor

from mixrl.core.advantages import ADVANTAGES, _prepare


def _whiten(x: Tensor, w: Tensor, eps: float) -> Tensor:
    """``(x - mean_w) / sqrt(var_w + eps)`` with weights ``w`` (0 = not counted): the weighted
    mean, and the weighted variance with the correction ``W / (W - 1)``, W = sum w, as verl's
    ``masked_whiten`` over the tokens of a batch (a row of L tokens has weight L). W < 1:
    zeros; W <= 1 (no variance): centred only. Zero spread (every counted value equal): that
    value is the mean and the variance counts as 1, so a value with weight 0 (a row left out
    of the statistics) is divided by ``sqrt(1 + eps)``, not ``sqrt(eps)`` (LUFFY's rule for a
    std of 0, see the module docstring)."""
    total = w.sum()
    if float(total) < 1.0:
        return torch.zeros_like(x)
    counted = w > 0
    if bool(x[counted].max() == x[counted].min()):
        return (x - x[counted].min()) * torch.rsqrt(torch.ones_like(total) + eps)
    mean = (x * w).sum() / total
    if float(total) <= 1.0:
        return x - mean
    var = ((x - mean).pow(2) * w).sum() / total * (total / (total - 1.0))
    return (x - mean) * torch.rsqrt(var + eps)


def _weights(r: Tensor, inc: Tensor, lengths: Tensor | None, token_weighted: bool) -> Tensor:
    w = inc.to(r.dtype)
    if token_weighted:
        if lengths is None:
            raise ValueError("token_weighted=True needs the completion lengths (the trainer passes them)")
        if lengths.shape != r.shape:
            raise ValueError(f"lengths has shape {tuple(lengths.shape)}, rewards {tuple(r.shape)}")
        w = w * lengths.to(device=r.device, dtype=r.dtype)
    return w


@ADVANTAGES.register("reinforce_pp", bounds={"eps": ("> 0", "(r - mean) / sqrt(var + eps) divides by zero for equal rewards when eps = 0")})
def reinforce_pp(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    include: Tensor | None = None,
    lengths: Tensor | None = None,
    mask: Tensor | None = None,
    eps: float = 1e-8,
    token_weighted: bool = True,
) -> Tensor:
    """REINFORCE++ (outcome reward): the return whitened over the whole batch, groups ignored.

    With one reward at the last token and gamma = 1 every token of row i has the return R_i;
    verl (``adv_estimator=reinforce_plus_plus``) whitens the returns over all response tokens of
    the batch, so a row weighs as many tokens as it has (``token_weighted=True``, default);
    ``token_weighted=False`` weighs rows equally (then it is ``batch_norm`` up to where eps sits).
    REINFORCE++'s KL penalty folded into the token reward is not part of the advantage here:
    in mixrl it is the ``kl`` term of the objective (``algo.kl.coef``, estimator k1 or k2).

    A loss mask with holes (``mask`` [N, T], 0 on tokens the policy did not write, e.g. the
    observations of a multi-turn rollout): verl computes the return backwards from the reward
    on the row's last token (position ``lengths_i - 1``, or the last 1 of ``mask``) and resets
    it to 0 after each masked token (``running_return * response_mask[:, t]``), so the tokens
    before the last hole get return 0 and only the last turn gets R_i; mixrl does the same and
    returns [N, T] advantages (0 off the mask), whitened over the mask's tokens of the included
    rows. Without holes this equals the per-row form. The trainer calls the per-row form, also
    for multi-turn rows (env=tools, env=arith_retry), where verl would reset after each hole.

    Formula: ``A_i = (R_i - mean_w R) / sqrt(var_w R + {eps})`` over the batch, weights w_i = L_i (completion tokens) when token_weighted={token_weighted} else 1, variance corrected by W / (W - 1), W = sum w; a variance of 0 counts as 1; with a loss mask m: G_t = R_i on the tokens after the row's last masked token, 0 before it (verl's reset), whitened over the tokens of m

    Paper: REINFORCE++, "REINFORCE++: A Simple and Efficient Approach for Aligning Large
    Language Models" (arXiv 2501.03262); verl ``compute_reinforce_plus_plus_outcome_advantage``.

    Parameters:
        include (None): bool [N], rows counted in the statistics (default all).
        lengths (None): float [N], completion tokens per row (runtime, from the trainer).
        mask (None): [N, T] loss mask, possibly with holes (per-token returns as verl; runtime).
        eps (1e-8): added to the variance (verl's masked_whiten).
        token_weighted (True): weigh each row by its token count (verl), or equally.
    """
    r, inc = _prepare(rewards, include)
    if mask is not None and token_weighted:
        return _reinforce_pp_tokens(r, inc, mask, lengths, eps)
    return _whiten(r, _weights(r, inc, lengths, token_weighted), eps)


def _reinforce_pp_tokens(r: Tensor, inc: Tensor, mask: Tensor, lengths: Tensor | None, eps: float) -> Tensor:
    """verl's ``compute_reinforce_plus_plus_outcome_advantage`` with gamma = 1: the reward R_i on
    token ``lengths_i - 1`` (default: the last 1 of the mask), returns summed backwards and reset to
    0 after every masked token, whitened over the mask's tokens of the included rows, 0 off the mask."""
    if mask.dim() != 2 or mask.shape[0] != r.shape[0]:
        raise ValueError(f"mask has shape {tuple(mask.shape)}, rewards {tuple(r.shape)}")
    m = mask.to(device=r.device).bool()
    n, width = m.shape
    pos = torch.arange(width, device=r.device)
    if lengths is None:
        last = torch.where(m, pos, torch.full_like(pos, -1)).amax(dim=1)
    else:
        last = lengths.to(device=r.device).long() - 1
    token_rewards = torch.where(pos.unsqueeze(0) == last.unsqueeze(1), r.unsqueeze(1), torch.zeros((), dtype=r.dtype, device=r.device))
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros(n, dtype=r.dtype, device=r.device)
    for t in reversed(range(width)):
        running = token_rewards[:, t] + running
        returns[:, t] = running
        running = running * m[:, t].to(r.dtype)  # verl: "Reset after EOS", i.e. after every masked token
    w = (m & inc.unsqueeze(1)).to(r.dtype)
    return _whiten(returns, w, eps) * m.to(r.dtype)


reinforce_pp.needs = ("lengths",)


def _group_baseline(rewards: Tensor, group_ids: Tensor, include: Tensor | None, weights: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(r, per-row baseline): the (weighted) mean of the included rows of the row's group, or 0
    when the group has fewer than 2 included rows (verl's single-response groups)."""
    r, inc = _prepare(rewards, include)
    if group_ids.shape != r.shape:
        raise ValueError(f"group_ids has shape {tuple(group_ids.shape)}, rewards {tuple(r.shape)}")
    _, inv = torch.unique(group_ids.to(r.device), return_inverse=True)
    n_groups = int(inv.max().item()) + 1 if inv.numel() else 0
    zeros = torch.zeros(n_groups, dtype=r.dtype, device=r.device)
    w_inc = inc.to(r.dtype)
    w = w_inc if weights is None else w_inc * weights.to(device=r.device, dtype=r.dtype)
    count = zeros.index_add(0, inv, w_inc)[inv]
    mean = (zeros.index_add(0, inv, r * w) / zeros.index_add(0, inv, w).clamp(min=1e-12))[inv]
    return r, torch.where(count >= 2, mean, torch.zeros_like(r))


@ADVANTAGES.register("reinforce_pp_baseline", bounds={"eps": ("> 0", "x / sqrt(var + eps) divides by zero for equal rewards when eps = 0")})
def reinforce_pp_baseline(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    include: Tensor | None = None,
    lengths: Tensor | None = None,
    eps: float = 1e-8,
    token_weighted: bool = True,
) -> Tensor:
    """REINFORCE++ with a group baseline: subtract the group mean, then whiten over the batch.

    verl ``adv_estimator=reinforce_plus_plus_baseline``: the group mean of the included rows is
    subtracted (none for a group with fewer than 2 included rows), then the result is whitened
    over the batch's tokens (each row weighs its token count when ``token_weighted``; the
    whitening re-centres on the batch mean).

    Formula: ``x_i = R_i - mean_g R``; ``A_i = (x_i - mean_w x) / sqrt(var_w x + {eps})`` over the batch, w_i = L_i when token_weighted={token_weighted} else 1, variance corrected by W / (W - 1)

    Paper: REINFORCE++, "REINFORCE++: A Simple and Efficient Approach for Aligning Large
    Language Models" (arXiv 2501.03262), its group-baseline variant; verl
    ``compute_reinforce_plus_plus_baseline_outcome_advantage``.

    Parameters:
        include (None): bool [N], rows counted in the statistics (default all).
        lengths (None): float [N], completion tokens per row (runtime, from the trainer).
        eps (1e-8): added to the variance.
        token_weighted (True): weigh each row by its token count (verl), or equally.
    """
    r, baseline = _group_baseline(rewards, group_ids, include)
    _, inc = _prepare(rewards, include)
    return _whiten(r - baseline, _weights(r, inc, lengths, token_weighted), eps)


reinforce_pp_baseline.needs = ("lengths",)


@ADVANTAGES.register("opo")
def opo(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    include: Tensor | None = None,
    lengths: Tensor | None = None,
) -> Tensor:
    """OPO: the group's length-weighted mean reward as baseline, ``A_i = r_i - sum L_j r_j / sum L_j``.

    The optimal baseline of a sequence-level policy gradient under the approximation that a
    sequence's gradient norm grows with its length; no std division. A group with fewer than 2
    included rows gets baseline 0 (verl).

    Formula: ``A_i = R_i - (sum_{j in g} L_j R_j) / (sum_{j in g} L_j)``, L_j the completion tokens of row j, over the included rows of the prompt's group g

    Paper: OPO, "On-Policy RL with Optimal Reward Baseline" (arXiv 2505.23585); verl
    ``compute_opo_outcome_advantage``.

    Parameters:
        include (None): bool [N], rows counted in the baseline (default all).
        lengths (None): float [N], completion tokens per row (runtime, from the trainer).
    """
    if lengths is None:
        raise ValueError("opo needs the completion lengths (the trainer passes them)")
    if lengths.shape != rewards.shape:
        raise ValueError(f"lengths has shape {tuple(lengths.shape)}, rewards {tuple(rewards.shape)}")
    r, baseline = _group_baseline(rewards, group_ids, include, weights=lengths.detach())
    return r - baseline


opo.needs = ("lengths",)


@ADVANTAGES.register("remax")
def remax(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    include: Tensor | None = None,
    baseline_rewards: Tensor | None = None,
) -> Tensor:
    """ReMax: the reward of the greedy completion of the same prompt as baseline, ``A_i = r_i - r_greedy``.

    The trainer generates one greedy completion per prompt and scores it
    (:mod:`mixrl.trainer.parts.remax_baseline`); ``include`` does not change the baseline.

    Formula: ``A_i = R_i - R(x, y_greedy(x))``, y_greedy the greedy (argmax) completion of row i's prompt x

    Paper: ReMax, "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for
    Aligning Large Language Models" (arXiv 2310.10505); verl ``compute_remax_outcome_advantage``.

    Parameters:
        include (None): bool [N], unused (the baseline is the greedy completion's reward).
        baseline_rewards (None): float [N], the greedy completion's reward per row (runtime).
    """
    r, _ = _prepare(rewards, include)
    if baseline_rewards is None:
        raise ValueError("remax needs the greedy completions' rewards (the trainer passes them)")
    if baseline_rewards.shape != r.shape:
        raise ValueError(f"baseline_rewards has shape {tuple(baseline_rewards.shape)}, rewards {tuple(r.shape)}")
    return r - baseline_rewards.detach().to(device=r.device, dtype=r.dtype)


remax.needs = ("baseline_rewards",)
