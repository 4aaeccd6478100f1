"""Off-policy group REINFORCE losses (OPMD, AsymRE, REC) and sPPO (axis A1, ``loss/``).

The REINFORCE family of "Group-Relative REINFORCE Is Secretly an Off-Policy Algorithm:
Demystifying Some Myths About GRPO and Its Friends" (arXiv 2509.24203) and its neighbours,
as Trinity-RFT ships them: plain ``-A log p`` on possibly stale or replayed rows, made safe
by a regulariser (OPMD), a shifted baseline (AsymRE) or token clipping (REC).

Same signature and conventions as :mod:`mixrl.core.policy_base`: per-token loss, not
aggregated, 0 on padding (padded ``logp`` / ``old_logp`` are replaced by 0 before any use).
Notation: ``r_t = exp(clamp(log p_t - log p_old,t, -20, 20))``, ``A`` the advantage, ``sg``
stop-gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mixrl.core._tensor import log_ratio, masked_inputs, masked_mean, token_advantages
from mixrl.core.policy_base import POLICY_LOSSES, PolicyLossOutput, _finish, _ratio_metrics

OPMD_FORMS = ("k2", "trinity")
REC_CLIP_MODES = ("none", "one-side", "two-side", "ring")
REC_WEIGHTS = ("none", "importance_sampling", "truncated_importance_sampling", "advantage")
REC_REGULARIZERS = ("none", "k2", "forward-kl")
#: the string parameters of these losses and their allowed values (checked at compose time)
LOSS_CHOICES: dict[str, dict[str, tuple[str, ...]]] = {
    "opmd": {"form": OPMD_FORMS},
    "rec": {"clip_mode": REC_CLIP_MODES, "weight": REC_WEIGHTS, "regularizer": REC_REGULARIZERS},
}


def _choice(loss: str, param: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{loss}: {param} must be one of {', '.join(choices)}, got {value!r}")


def _no_clip(logp: Tensor) -> Tensor:
    return torch.zeros_like(logp, dtype=torch.bool)


@POLICY_LOSSES.register("opmd", bounds={
    "tau": (">= 0", "tau weighs the pull towards the behaviour policy (k2) or divides by 1 + tau (trinity); a negative tau pushes away or divides by <= 1"),
})
def opmd(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    tau: float = 1.0,
    form: str = "k2",
) -> PolicyLossOutput:
    """OPMD: online policy mirror descent, REINFORCE regularised towards the behaviour policy.

    Formula: form = {form}; k2: ``l_t = -A log p_t + ({tau} / 2) (log p_t - log p_old,t)^2``; trinity: ``l_t = -A log p_t / (1 + {tau})``

    ``k2`` is the paper's OPMD (Kimi k1.5's gradient ``(r - mean r) grad log pi - (tau / 2)
    grad (log pi / pi_old)^2``, the "REP" family of the group-relative REINFORCE paper; in
    Trinity-RFT: ``rec`` with ``regularizer: k2, regularizer_coef: tau / 2``), applied per
    token (Kimi k1.5 squares the sequence log-ratio). Its gradient is
    ``(-A + tau log r_t) grad log p_t``: plain REINFORCE on fresh rows (r = 1), pulled back
    towards pi_old on stale ones. ``trinity`` is Trinity-RFT's ``opmd`` policy loss: plain
    REINFORCE scaled by ``1 / (1 + tau)`` (the behaviour log-prob is not used). Nothing is
    clipped; metric ``ratio_mean``.

    Paper: "Kimi k1.5: Scaling Reinforcement Learning with LLMs" (arXiv 2501.12599, OPMD);
    "Group-Relative REINFORCE Is Secretly an Off-Policy Algorithm: Demystifying Some Myths
    About GRPO and Its Friends" (arXiv 2509.24203); Trinity-RFT (arXiv 2505.17826).

    Parameters:
        tau (1.0): regularisation strength (k2: coefficient tau / 2 on (log r)^2; trinity: loss divided by 1 + tau).
        form (k2): k2 (the paper: -A log p + (tau / 2)(log r)^2) | trinity (Trinity-RFT's code: -A log p / (1 + tau)).
    """
    _choice("opmd", "form", form, OPMD_FORMS)
    if tau < 0:
        raise ValueError(f"opmd: tau must be >= 0, got {tau}")
    logp, old_logp, advantages = masked_inputs(logp, old_logp, advantages, mask)
    adv = token_advantages(advantages, logp)
    lr = log_ratio(logp, old_logp)
    if form == "k2":
        loss = -adv * logp + 0.5 * tau * lr.pow(2)
    else:
        loss = -adv * logp / (1.0 + tau)
    metrics = _ratio_metrics(torch.exp(lr), mask)
    metrics["log_ratio_sq_mean"] = masked_mean(lr.detach().pow(2), mask)
    return _finish(loss, _no_clip(logp), mask, metrics)


@POLICY_LOSSES.register("asymre", bounds={
    "baseline_shift": ("<= 0", "AsymRE's guarantee needs the baseline at or below the expected reward (mean + shift, shift <= 0); a positive shift favours negative rewards, which the paper shows collapses off-policy"),
})
def asymre(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    baseline_shift: float = -0.1,
) -> PolicyLossOutput:
    """AsymRE: asymmetric REINFORCE, the baseline shifted below the group mean.

    Formula: ``l_t = -(A - ({baseline_shift})) log p_t``: baseline V = mean + {baseline_shift}, A = R - mean (use a mean-centred advantage without std scaling: dr_grpo / reinforce); a row alone in its group trains with A - ({baseline_shift}) = -({baseline_shift}) (Trinity-RFT: A = R, no shift)

    Off-policy REINFORCE without an importance ratio; a baseline below the expected reward
    (shift < 0) weighs positive rewards more than negative ones, which the paper shows keeps
    off-policy training stable. Equivalent to ``-A log p_t - |shift| log p_t`` (Trinity-RFT's
    ``rec`` with ``regularizer: forward-kl, regularizer_coef: -shift``). Trinity-RFT ships
    AsymRE as an advantage (``asymre``: group mean + ``baseline_shift``) with the plain
    REINFORCE loss; here the shift is applied to the advantage inside the loss, so
    ``A`` must be mean-centred and not std-scaled for the shift to be in reward units.
    Nothing is clipped.

    A row alone in its group differs from Trinity-RFT: there ``dr_grpo`` gives it A = 0 (its
    own reward is the mean), so it trains with ``A - shift = -shift`` (0.1 by default), while
    Trinity-RFT's ``asymre`` advantage (``asymre_advantage.py``) and verl's GRPO give a
    one-row group the baseline 0 and no shift: ``A = R``. mixrl keeps its form (a lone row is
    pushed up by |shift| whatever its reward, the same push every row gets on top of
    ``R - mean``); only a group with one included row (``algo.advantage_include_offpolicy=false``) has one.

    Paper: "Asymmetric REINFORCE for off-Policy Reinforcement Learning: Balancing positive
    and negative rewards" (Arnal et al. 2025, arXiv 2506.20520); default -0.1 as in
    Trinity-RFT.

    Parameters:
        baseline_shift (-0.1): delta added to the group-mean baseline (<= 0; Trinity-RFT's baseline_shift).
    """
    if baseline_shift > 0:
        raise ValueError(f"asymre: baseline_shift must be <= 0, got {baseline_shift}")
    logp, old_logp, advantages = masked_inputs(logp, old_logp, advantages, mask)
    adv = token_advantages(advantages, logp) - baseline_shift
    loss = -adv * logp
    return _finish(loss, _no_clip(logp), mask, _ratio_metrics(torch.exp(log_ratio(logp, old_logp)), mask))


@POLICY_LOSSES.register("rec", bounds={
    "clip_low": ("(0, 1]", "tokens with r < 1 - clip_low are dropped; a probability ratio is >= 0"),
    "clip_high": ("> 0", "tokens with r > 1 + clip_high are dropped"),
    "ring_low": ("(0, 1]", "the ring keeps A >= 0 tokens with r <= 1 - ring_low (and truncated IS clamps at it)"),
    "ring_high": ("> 0", "the ring keeps A <= 0 tokens with r >= 1 + ring_high (and truncated IS clamps at it)"),
    "regularizer_coef": (">= 0", "a negative coefficient turns the regulariser into a reward for moving away"),
    "temp": ("> 0", "the advantage weight is exp(A / temp)"),
})
def rec(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_mode: str = "one-side",
    weight: str = "none",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ring_low: float = 0.6,
    ring_high: float = 2.0,
    regularizer: str = "none",
    regularizer_coef: float = 0.0,
    temp: float = 1.0,
) -> PolicyLossOutput:
    """REC: group-relative REINFORCE with token clipping (and optional IS weight, regulariser).

    Formula: ``l_t = -keep_t w_t A log p_t + reg_t``; keep ({clip_mode}): none = all; one-side = (A >= 0 and r_t <= 1 + {clip_high}) or (A <= 0 and r_t >= 1 - {clip_low}); two-side = 1 - {clip_low} <= r_t <= 1 + {clip_high}; ring = two-side or (A >= 0 and r_t <= 1 - {ring_low}) or (A <= 0 and r_t >= 1 + {ring_high}); w ({weight}): none = 1, importance_sampling = sg(r_t), truncated_importance_sampling = sg(clip(r_t, 1 - {ring_low}, 1 + {ring_high})), advantage = exp(A / {temp}); reg ({regularizer}): k2 = {regularizer_coef} (log r_t)^2, forward-kl = -{regularizer_coef} log p_t

    A dropped token (keep = 0) gets no gradient; the r_t tests use the detached ratio. The
    paper's variants: REC-OneSide-NoIS (``clip_mode: one-side``, the default), REC-OneSide-IS
    (+ ``weight: importance_sampling``; this is GRPO's clipped gradient), REC-TwoSide-IS,
    REC-Ring-NoIS (``clip_mode: ring``); REP: ``regularizer: forward-kl`` (= AsymRE with
    shift -coef) or ``k2`` (= Kimi's OPMD with tau = 2 coef); RED-Weight: ``weight: advantage``.
    Plain REINFORCE: ``clip_mode: none``. As in Trinity-RFT, the ring and the truncated IS
    weight share ``ring_low`` / ``ring_high`` (its epsilon_low_prime / epsilon_high_prime);
    Trinity-RFT's ``gspo-one-side`` clip, ``gspo_importance_sampling`` weight and OPD fix
    are not offered. Clipped tokens: the dropped ones.

    Paper: "Group-Relative REINFORCE Is Secretly an Off-Policy Algorithm: Demystifying Some
    Myths About GRPO and Its Friends" (arXiv 2509.24203); defaults from Trinity-RFT's
    ``rec`` policy loss (clip 0.2 / 0.2, ring 0.6 / 2.0), with ``clip_mode: one-side``.

    Parameters:
        clip_mode (one-side): none | one-side | two-side | ring (which tokens keep their gradient).
        weight (none): none | importance_sampling | truncated_importance_sampling | advantage.
        clip_low (0.2): tokens need r >= 1 - clip_low (A <= 0 in one-side; all in two-side).
        clip_high (0.2): tokens need r <= 1 + clip_high (A >= 0 in one-side; all in two-side).
        ring_low (0.6): ring: A >= 0 tokens with r <= 1 - ring_low are kept too; truncated IS lower bound.
        ring_high (2.0): ring: A <= 0 tokens with r >= 1 + ring_high are kept too; truncated IS upper bound 1 + ring_high.
        regularizer (none): none | k2 (coef (log r)^2) | forward-kl (-coef log p).
        regularizer_coef (0.0): coefficient of the regulariser.
        temp (1.0): temperature of the advantage weight exp(A / temp).
    """
    _choice("rec", "clip_mode", clip_mode, REC_CLIP_MODES)
    _choice("rec", "weight", weight, REC_WEIGHTS)
    _choice("rec", "regularizer", regularizer, REC_REGULARIZERS)
    logp, old_logp, advantages = masked_inputs(logp, old_logp, advantages, mask)
    adv = token_advantages(advantages, logp)
    lr = log_ratio(logp, old_logp)
    ratio = torch.exp(lr).detach()
    pos, neg = adv >= 0, adv <= 0
    inside = (ratio >= 1.0 - clip_low) & (ratio <= 1.0 + clip_high)
    if clip_mode == "two-side":
        keep = inside
    elif clip_mode == "one-side":
        keep = (pos & (ratio <= 1.0 + clip_high)) | (neg & (ratio >= 1.0 - clip_low))
    elif clip_mode == "ring":
        keep = inside | (pos & (ratio <= 1.0 - ring_low)) | (neg & (ratio >= 1.0 + ring_high))
    else:
        keep = torch.ones_like(inside)
    if weight == "importance_sampling":
        w = ratio
    elif weight == "truncated_importance_sampling":
        w = torch.clamp(ratio, 1.0 - ring_low, 1.0 + ring_high)
    elif weight == "advantage":
        w = torch.exp(adv / temp)
    else:
        w = torch.ones_like(ratio)
    loss = -keep.to(logp.dtype) * w * adv * logp
    if regularizer == "k2":
        loss = loss + regularizer_coef * lr.pow(2)
    elif regularizer == "forward-kl":
        loss = loss - regularizer_coef * logp
    return _finish(loss, ~keep, mask, _ratio_metrics(ratio, mask))


@POLICY_LOSSES.register("sppo", bounds={
    "clip_eps": ("> 0", "tokens need 1 / (1 + eps) <= r <= 1 + eps, an empty range for eps <= 0"),
})
def sppo(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float = 0.3,
) -> PolicyLossOutput:
    """sPPO: a log-ratio surrogate with a symmetric (log-space) hard clip.

    Formula: ``l_t = -A log r_t`` if ``1 / (1 + {clip_eps}) <= r_t <= 1 + {clip_eps}``, else 0

    Gradient ``-A grad log p_t`` on tokens whose ratio is inside ``[1 / (1 + eps), 1 + eps]``
    (symmetric around 1 in log space), zero outside, whatever the sign of A: a REINFORCE
    gradient with a trust region. The value is ``-A log r_t`` (0 on fresh rows). This is
    Trinity-RFT's ``sppo`` loss (``epsilon`` there, default 0.3). Clipped tokens: those
    outside the range.

    Paper: the paper Trinity-RFT's sPPO cites, arXiv 2108.05828 ("An Alternate Policy
    Gradient Estimator for Softmax Policies", Garg et al. 2022; its sPPO is the PPO variant
    built on that estimator).

    Parameters:
        clip_eps (0.3): tokens with r outside [1 / (1 + clip_eps), 1 + clip_eps] get no gradient.
    """
    logp, old_logp, advantages = masked_inputs(logp, old_logp, advantages, mask)
    adv = token_advantages(advantages, logp)
    lr = log_ratio(logp, old_logp)
    ratio = torch.exp(lr).detach()
    keep = (ratio >= 1.0 / (1.0 + clip_eps)) & (ratio <= 1.0 + clip_eps)
    loss = -keep.to(logp.dtype) * adv * lr
    return _finish(loss, ~keep, mask, _ratio_metrics(ratio, mask))
