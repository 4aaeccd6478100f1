"""Off-policy stability losses beyond the clip and the mask (axis A1, ``loss/``): the minimum
prefix ratio (``minpro``), advantage-scaled clip bounds (``etr``) and the ratio-variance penalty
(``r2vpo``, whose coefficient the ``r2vpo_dual`` controller of :mod:`mixrl.core.stability_controllers`
sets by dual ascent).

Signature and conventions: :mod:`mixrl.core.policy_base` (``r = exp(clamp(logp - old_logp,
-20, 20))``, ``A`` the advantage, ``sg`` stop-gradient).
"""

from __future__ import annotations

import torch
from torch import Tensor

from mixrl.core._tensor import bool_mask, log_ratio, masked_inputs, masked_mean, token_advantages, zero_masked
from mixrl.core.policy_base import POLICY_LOSSES, PolicyLossOutput, _finish, _ratio_metrics


def prefix_min_log_ratio(lr: Tensor, mask: Tensor) -> Tensor:
    """``log m_t = min_{j < t, j valid} log r_j`` per row (0, i.e. m = 1, where the prefix is empty).

    Exclusive of token t itself; padded positions never enter a minimum. No gradient."""
    m = bool_mask(mask)
    inf = torch.full_like(lr, float("inf"))
    running = torch.cummin(torch.where(m, lr.detach(), inf), dim=-1).values
    shifted = torch.cat([inf[..., :1], running[..., :-1]], dim=-1)
    return torch.where(torch.isinf(shifted), torch.zeros_like(shifted), shifted)


@POLICY_LOSSES.register("minpro", bounds={
    "weight_max": ("> 0", "the prefix weight m_t is a ratio, > 0; a cap <= 0 would zero or flip every gradient"),
    "clip_low": ("[0, 1]", "the token ratio is clipped below at 1 - clip_low"),
    "clip_high": (">= 0", "the token ratio is clipped above at 1 + clip_high"),
})
def minpro(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    weight_max: float | None = None,
    clip_low: float | None = None,
    clip_high: float | None = None,
) -> PolicyLossOutput:
    """MinPRO: the token's ratio times the minimum ratio of its preceding prefix (instead of the prefix's product).

    Formula: ``l_t = -sg(m_t) A r_t``, ``m_t = min(min_{j<t} r_j, {weight_max|inf})`` over the row's earlier tokens (``m_1 = 1``); token clip [1 - {clip_low|none}, 1 + {clip_high|none}] when set: ``l_t = sg(m_t) max(-A r_t, -A clip(r_t))``

    The exact off-policy correction of token t is the prefix ratio ``prod_{j<t} r_j`` times
    ``r_t``; the usual token-level surrogate drops the prefix and the product explodes or
    vanishes with length. MinPRO keeps one factor of the prefix: its smallest token ratio, so a
    token whose context the current policy has moved away from (some ``r_j`` small) gets a small
    gradient, without the product's exponential growth. Gradient:
    ``-m_t A r_t grad log p_t``. ``clipped`` marks tokens with ``m_t < 0.5`` (or the token
    clip active); metric ``prefix_weight_mean``.

    Our reading (the abstract and the method's description; the authors' code was not found):
    the minimum is over the tokens strictly before t, uncapped (``weight_max`` none) and with
    no token clip (``clip_low`` / ``clip_high`` none); both options are mixrl's.

    Paper: "A Step Back: Prefix Importance Ratio Stabilizes Policy Optimization" (Lei, Cheng,
    Tao 2026, arXiv 2601.22718).

    Parameters:
        weight_max (None): cap on the prefix weight m_t (none: no cap).
        clip_low (None): with clip_high, PPO's clip of r_t at 1 - clip_low (none: no token clip).
        clip_high (None): PPO's clip of r_t at 1 + clip_high (none: no token clip).
    """
    if (clip_low is None) != (clip_high is None):
        raise ValueError("minpro: set both clip_low and clip_high, or neither")
    logp, old_logp, advantages = masked_inputs(logp, old_logp, advantages, mask)
    lr = log_ratio(logp, old_logp)
    ratio = torch.exp(lr)
    weight = torch.exp(prefix_min_log_ratio(lr, mask))
    if weight_max is not None:
        weight = weight.clamp(max=float(weight_max))
    adv = token_advantages(advantages, logp)
    loss = -adv * ratio
    clipped = weight < 0.5
    if clip_low is not None:
        loss2 = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
        clipped = clipped | (loss2 > loss)
        loss = torch.maximum(loss, loss2)
    metrics = _ratio_metrics(ratio, mask)
    metrics["prefix_weight_mean"] = masked_mean(weight, mask)
    return _finish(weight * loss, clipped, mask, metrics)


@POLICY_LOSSES.register("etr", bounds={
    "clip_low": ("[0, 1]", "the ratio is clipped below at 1 - eps_low, a probability ratio is >= 0"),
    "clip_high": (">= 0", "the ratio is clipped above at 1 + eps_high"),
    "alpha": (">= 0", "the bounds widen with |A|; a negative alpha would narrow them below the base"),
    "clip_max": (">= 0", "a cap on the scaled epsilon"),
})
def etr(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    alpha: float = 0.5,
    clip_max: float | None = None,
) -> PolicyLossOutput:
    """ETR: PPO's clip with bounds that widen with the row's advantage magnitude (elastic trust region).

    Formula: ``l_t = max(-A r_t, -A clip(r_t, 1 - e_low, 1 + e_high))``, ``e = eps (1 + {alpha} |A|)`` for eps = ({clip_low}, {clip_high}), capped at {clip_max|no cap} (the lower one also at 1)

    Micro level: a row with a large |A| (a confident outcome signal) gets a wider trust region,
    a row near its group's mean a tighter one. Macro level (the paper: the group's reward
    variance allocates the budget): with advantages that are not divided by the group's std
    (``dr_grpo``: ``A = R - mean``), a group's mean |A| is ``2 p (1 - p)`` for 0/1 rewards, its
    variance times 2, so groups in the "learning zone" (p near 1/2) get the larger bounds; the
    preset uses that advantage. Clipped tokens: where the constant branch is active; metric
    ``clip_high_mean`` (the mean upper epsilon).

    Our reading (from the abstract; the authors' code was not found): the linear scaling
    ``1 + alpha |A|``, its default alpha 0.5 and the macro level through ``dr_grpo``'s
    advantages are mixrl's, not the paper's equations.

    Paper: "ETR: Outcome-Guided Elastic Trust Regions for Policy Optimization" (Zhang et al.
    2026, arXiv 2601.03723).

    Parameters:
        clip_low (0.2): base epsilon below 1.
        clip_high (0.2): base epsilon above 1.
        alpha (0.5): how fast the epsilons grow with |A|.
        clip_max (None): cap on each scaled epsilon (none: no cap; the lower one is always <= 1).
    """
    logp, old_logp, advantages = masked_inputs(logp, old_logp, advantages, mask)
    ratio = torch.exp(log_ratio(logp, old_logp))
    adv = token_advantages(advantages, logp)
    scale = 1.0 + alpha * adv.abs()
    e_low, e_high = clip_low * scale, clip_high * scale
    if clip_max is not None:
        e_low, e_high = e_low.clamp(max=float(clip_max)), e_high.clamp(max=float(clip_max))
    e_low = e_low.clamp(max=1.0)
    loss1 = -adv * ratio
    loss2 = -adv * torch.minimum(torch.maximum(ratio, 1.0 - e_low), 1.0 + e_high)
    loss = torch.maximum(loss1, loss2)
    metrics = _ratio_metrics(ratio, mask)
    metrics["clip_high_mean"] = masked_mean(e_high, mask)
    return _finish(loss, loss2 > loss1, mask, metrics)


@POLICY_LOSSES.register("r2vpo", bounds={
    "var_coef": (">= 0", "a Lagrange multiplier on Var(r) <= delta is >= 0"),
})
def r2vpo(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    var_coef: float = 1.0,
) -> PolicyLossOutput:
    """R²VPO: the unclipped surrogate plus a penalty on the variance of the token ratios (no hard clip).

    Formula: ``l_t = -A r_t + {var_coef} (r_t - sg(rbar))^2``, ``rbar`` the mean ratio over this call's valid tokens

    With token-mean aggregation the penalty sums to ``var_coef * Var(r)`` over the micro-batch,
    and its gradient is exactly that of the variance (the mean's own gradient sums to 0 over
    the tokens). Tokens whose ratio moved far from the rest (stale or aggressive ones) are
    pulled back in proportion to the distance instead of being cut at a bound. ``var_coef`` is
    the Lagrange multiplier of the constraint ``Var(r) <= delta``: the ``r2vpo_dual`` controller
    updates it every step (primal-dual); fixed when run without it. ``clipped`` is all False;
    metric ``ratio_var``.

    Our reading (from the abstract; the authors' code was not found): the penalty on the
    micro-batch's token ratios with a stopped mean; the paper's replay-buffer reweighting of
    stale samples is not implemented (mixrl's stale rows come from ``trainer.staleness``).

    Paper: "Ratio-Variance Regularized Policy Optimization for Efficient LLM Fine-tuning"
    (Luo et al. 2026, arXiv 2601.03320).

    Parameters:
        var_coef (1.0): the multiplier lambda on (r - rbar)^2 (set each step by r2vpo_dual when that controller is on).
    """
    logp, old_logp, advantages = masked_inputs(logp, old_logp, advantages, mask)
    ratio = torch.exp(log_ratio(logp, old_logp))
    adv = token_advantages(advantages, logp)
    rbar = masked_mean(ratio.detach(), mask)
    dev = zero_masked(ratio - rbar, mask)
    loss = -adv * ratio + var_coef * dev.pow(2)
    metrics = _ratio_metrics(ratio, mask)
    metrics["ratio_var"] = masked_mean(dev.detach().pow(2), mask)
    return _finish(loss, torch.zeros_like(logp, dtype=torch.bool), mask, metrics)
