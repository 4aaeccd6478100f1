"""REINFORCE-style losses: ``-w A log p`` with a stopped token weight ``w`` (plain
``reinforce`` with optional truncated IS, ``topr``'s taper, ``cispo``'s clipped IS weight) and
the NLL of given tokens (``sft``).

Signature and conventions: :mod:`mixrl.core.policy_base`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mixrl.core._tensor import (
    LOG_RATIO_CLAMP,
    bool_mask,
    log_ratio,
    masked_inputs,
    masked_mean,
    token_advantages,
    zero_masked,
)
from mixrl.core.policy_base import POLICY_LOSSES, PolicyLossOutput, _finish, _ratio_metrics


@POLICY_LOSSES.register("reinforce", bounds={"tis_cap": (">= 1", "a truncated importance weight min(r, cap) below 1 would down-weight on-policy tokens")})
def reinforce(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    tis_cap: float | None = None,
) -> PolicyLossOutput:
    """REINFORCE / vanilla policy gradient, optionally with truncated importance sampling.

    Formula: ``l_t = -w_t A log p_t``, ``w_t = sg(min(r_t, C))`` with C = {tis_cap|unset, and then w_t = 1}

    Without a cap (None) this is plain REINFORCE, unbiased only for on-policy rows.
    Gradient: ``-w A grad log p``; on-policy (old_logp == logp) r = 1, so with any
    ``tis_cap >= 1`` the gradient equals plain REINFORCE's ``-A grad log p``.
    Clipped tokens: those with r > tis_cap (weight truncated).

    Paper: "Simple Statistical Gradient-Following Algorithms for Connectionist
    Reinforcement Learning" (Williams 1992); truncated IS as in "Stabilizing Reinforcement
    Learning with LLMs: Formulation and Practices" and "Group-Relative REINFORCE Is Secretly
    an Off-Policy Algorithm: Demystifying Some Myths About GRPO and Its Friends".

    Parameters:
        tis_cap (None): cap on the IS weight (must be >= 1); None = no IS weight.
    """
    logp, old_logp, advantages = masked_inputs(logp, old_logp, advantages, mask)
    adv = token_advantages(advantages, logp)
    if tis_cap is None:
        weight = torch.ones_like(logp)
        clipped = torch.zeros_like(logp, dtype=torch.bool)
        metrics: dict[str, Tensor] = {}
    else:
        if tis_cap < 1.0:
            raise ValueError(
                f"reinforce: tis_cap must be >= 1 (on-policy r = 1 must keep weight 1), got {tis_cap}"
            )
        ratio = torch.exp(log_ratio(logp, old_logp)).detach()
        weight = torch.clamp(ratio, max=tis_cap)
        clipped = ratio > tis_cap
        metrics = _ratio_metrics(ratio, mask)
    loss = -weight.detach() * adv * logp
    return _finish(loss, clipped, mask, metrics)



@POLICY_LOSSES.register("topr")
def topr(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    taper: str = "token",
) -> PolicyLossOutput:
    """TOPR: tapered off-policy REINFORCE (asymmetric truncated IS, no KL needed).

    Formula: ``l_t = -A log p_t`` if A >= 0 (no ratio); ``l_t = -sg(clip(w, 0, 1)) A log p_t`` if A < 0, w = r_t (taper = token) or the trajectory ratio prod_t r_t of the row (taper = trajectory); taper = {taper}

    ``taper: trajectory`` is the paper's estimator (the IS weight of a negative trajectory is
    pi(tau) / mu(tau), the product of its token ratios, truncated at 1); ``token`` is
    Trinity-RFT's per-token reading (the default, unchanged). Clipped tokens: ``A < 0`` and
    ``w > 1`` (IS weight truncated to 1).

    Paper: "Tapered Off-Policy REINFORCE: Stable and efficient reinforcement learning for
    LLMs" (TOPR, Le Roux et al. 2025).

    Parameters:
        taper (token): token (per-token ratio r_t) | trajectory (the row's ratio prod_t r_t, as in the paper).
    """
    if taper not in ("token", "trajectory"):
        raise ValueError(f"topr: taper must be 'token' or 'trajectory', got {taper!r}")
    logp, old_logp, advantages = masked_inputs(logp, old_logp, advantages, mask)
    adv = token_advantages(advantages, logp)
    lr = log_ratio(logp, old_logp).detach()
    ratio = torch.exp(lr)
    if taper == "trajectory":
        seq = zero_masked(lr, bool_mask(mask)).sum(-1, keepdim=True).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        w = torch.exp(seq).expand_as(ratio)
    else:
        w = ratio
    neg = adv < 0
    weight = torch.where(neg, torch.clamp(w, 0.0, 1.0), torch.ones_like(w))
    loss = -weight * adv * logp
    clipped = neg & (w > 1.0)
    return _finish(loss, clipped, mask, _ratio_metrics(ratio, mask))



@POLICY_LOSSES.register("cispo", bounds={
    "clip_low": ("[0, 1]", "the IS weight is clipped below at 1 - clip_low, a ratio is >= 0"),
    "clip_high": (">= 0", "the IS weight is clipped above at 1 + clip_high"),
    "mask_low": ("[0, 1]", "the trust mask drops A < 0 tokens below 1 - mask_low, a ratio is >= 0"),
    "mask_high": (">= 0", "the trust mask drops A > 0 tokens above 1 + mask_high"),
})
def cispo(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 1.0,
    clip_high: float = 0.28,
    trust_mask: bool = False,
    mask_low: float | None = None,
    mask_high: float | None = None,
) -> PolicyLossOutput:
    """CISPO: clipped IS-weight policy optimisation (every token keeps its gradient).

    Formula: ``l_t = -sg(clip(r_t, 1 - {clip_low}, 1 + {clip_high})) A log p_t``, times ``M_t`` if trust_mask ({trust_mask}): ``M_t = 0`` where A > 0 and r_t > 1 + {mask_high|clip_high} or A < 0 and r_t < 1 - {mask_low|clip_low}, else 1

    Clipped tokens: those whose IS weight was truncated (r outside the bounds), and with
    ``trust_mask`` those masked. The paper sets no lower bound ("setting eps_low to a large
    value"); clip_low = 1.0 makes the lower bound 0, i.e. no lower bound, as in Trinity-RFT's
    implementation, whose clip_high default 0.28 we also use.

    ``trust_mask: true`` is the token mask M_t of the report's unified objective (its eq. with
    M_t, which recovers the PPO trust region): a token whose ratio already left the band in the
    direction its advantage pushes gets no gradient. Its band is ``1 - mask_low .. 1 +
    mask_high``, by default the weight's clip bounds. Trinity-RFT's ``cispo`` applies it with
    ``enable_mask_clip: true`` (off by default) and its own bounds ``mask_clip_range_low`` /
    ``mask_clip_range_high`` (= ``mask_low`` / ``mask_high``; Trinity's defaults 1.0 / 0.28).
    ``false`` (the default) is the CISPO objective itself (M_t = 1), as in verl's ``cispo``
    loss mode, TRL's ``loss_type=cispo`` and Trinity's default.

    Paper: CISPO, in "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning
    Attention" (2025, arXiv 2506.13585).

    Parameters:
        clip_low (1.0): IS-weight lower bound is 1 - clip_low (1.0 = no lower bound).
        clip_high (0.28): IS-weight upper bound is 1 + clip_high.
        trust_mask (false): drop tokens with A > 0 and r > 1 + mask_high, or A < 0 and r < 1 - mask_low (Trinity-RFT's enable_mask_clip).
        mask_low (None): the mask's lower band 1 - mask_low (None: clip_low; Trinity's mask_clip_range_low).
        mask_high (None): the mask's upper band 1 + mask_high (None: clip_high; Trinity's mask_clip_range_high).
    """
    logp, old_logp, advantages = masked_inputs(logp, old_logp, advantages, mask)
    adv = token_advantages(advantages, logp)
    ratio = torch.exp(log_ratio(logp, old_logp)).detach()
    lo, hi = 1.0 - clip_low, 1.0 + clip_high
    weight = torch.clamp(ratio, lo, hi)
    loss = -weight * adv * logp
    clipped = (ratio > hi) | (ratio < lo)
    metrics = _ratio_metrics(ratio, mask)
    if trust_mask:
        m_lo = lo if mask_low is None else 1.0 - mask_low
        m_hi = hi if mask_high is None else 1.0 + mask_high
        dropped = ((adv > 0) & (ratio > m_hi)) | ((adv < 0) & (ratio < m_lo))
        loss = torch.where(dropped, torch.zeros_like(loss), loss)
        metrics["masked_frac"] = masked_mean(dropped.to(logp.dtype), mask)
    return _finish(loss, clipped, mask, metrics)



@POLICY_LOSSES.register("sft")
def sft(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
) -> PolicyLossOutput:
    """Supervised fine-tuning: negative log-likelihood of the given tokens.

    Formula: ``l_t = -log p_t`` (advantage and behaviour log-prob ignored)

    Paper: supervised fine-tuning; the SFT term of CHORD and the SFT->RL baselines.

    Parameters: none.
    """
    logp, old_logp, advantages = masked_inputs(logp, old_logp, advantages, mask)
    return _finish(-logp, torch.zeros_like(logp, dtype=torch.bool), mask)
