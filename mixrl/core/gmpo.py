"""GMPO: the geometric mean of the token ratios, clipped per token in log space.

Same signature and conventions as :mod:`mixrl.core.policy_base`; a sequence-level loss
written per token like ``gspo`` (every valid token of a row carries the row's loss value,
its gradient goes through its own log-ratio).
"""

from __future__ import annotations

import torch
from torch import Tensor

from mixrl.core._tensor import bool_mask, log_ratio, masked_inputs, masked_mean, token_advantages, zero_masked
from mixrl.core.policy_base import POLICY_LOSSES, PolicyLossOutput, _finish


@POLICY_LOSSES.register("gmpo", bounds={
    "clip_low": (">= 0", "the log-ratio is clipped below at -clip_low (ratio exp(-clip_low) <= 1)"),
    "clip_high": (">= 0", "the log-ratio is clipped above at clip_high (ratio exp(clip_high) >= 1)"),
})
def gmpo(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.4,
    clip_high: float = 0.4,
    clip_sign: str = "row",
) -> PolicyLossOutput:
    """GMPO: sequence ratio = geometric mean of token ratios, each clipped in log space.

    Formula: ``l_t = -A g_t``, ``g_t = sg(g) exp(c_t - sg(c_t))``, ``g = exp(mean_t c_t)`` over the row's tokens, ``c_t = min(log r_t, {clip_high})`` if S > 0, ``c_t = max(log r_t, -{clip_low})`` if S <= 0 (ratio range exp(-{clip_low}) .. exp({clip_high})); clip_sign = {clip_sign}: S = A, the row's advantage (row), or S = A_t, the token's, with c_t = 0 where A_t = 0 (token, verl)

    The clip is PPO's pessimistic one-sided clip written in log space, per token, before the
    geometric mean: a clipped token keeps its value but loses its gradient. Per token, every
    valid token of a row has value ``-A g`` and gradient ``-A g grad c_t``; with
    ``seq-mean-token-mean`` aggregation this is exactly the paper's sequence objective
    ``-A (prod_t clipped r_t)^(1/|o|)`` and its gradient (as verl ``geo_mean`` and TRL's
    ``GMPOTrainer`` compute it). A per-token advantage [B, T] is averaged over the row's
    tokens first (the paper's advantage is per sequence; verl does the same). Which side a
    token is clipped on: by default (``clip_sign: row``) the sign of that row advantage, for
    every token of the row; verl's ``geo_mean`` clips each token by the sign of its own
    advantage, and a token with advantage 0 contributes 0 to the row's mean log-ratio
    (``sign(A_t) min(sign(A_t) log r_t, sign(A_t) clip(log r_t))``): ``clip_sign: token``.
    With one advantage per row (GRPO's) the two are the same. Clipped tokens:
    those whose log-ratio was clipped. Metrics: ``seq_ratio_mean`` (mean g over rows),
    ``clip_frac_high`` / ``clip_frac_low``.

    Paper: "Geometric-Mean Policy Optimization" (GMPO, Zhao et al. 2025, arXiv 2507.20673);
    clip range (exp(-0.4), exp(0.4)) from the paper (verl ``clip_ratio`` 0.4 in its GMPO
    example, TRL ``epsilon = 0.4``).

    Parameters:
        clip_low (0.4): log-space clip below: c_t >= -clip_low for A <= 0 (ratio >= exp(-clip_low)).
        clip_high (0.4): log-space clip above: c_t <= clip_high for A > 0 (ratio <= exp(clip_high)).
        clip_sign (row): row (clip by the sign of the row's advantage) | token (by each token's advantage, as verl's geo_mean).
    """
    if clip_sign not in ("row", "token"):
        raise ValueError(f"gmpo: clip_sign must be 'row' or 'token', got {clip_sign!r}")
    logp, old_logp, advantages = masked_inputs(logp, old_logp, advantages, mask)
    m = bool_mask(mask)
    count = m.sum(-1, keepdim=True).clamp(min=1).to(logp.dtype)
    adv_tok = zero_masked(token_advantages(advantages, logp), m)
    adv = (adv_tok.sum(-1, keepdim=True) / count).expand_as(logp)  # the row's advantage
    lr = log_ratio(logp, old_logp)
    side = adv if clip_sign == "row" else adv_tok
    pos = side > 0
    high = pos & (lr > clip_high)
    low = (side < 0 if clip_sign == "token" else ~pos) & (lr < -clip_low)
    c = torch.where(high, torch.full_like(lr, clip_high), torch.where(low, torch.full_like(lr, -clip_low), lr))
    if clip_sign == "token":
        c = torch.where(adv_tok == 0, torch.zeros_like(c), c)  # verl: sign(0) = 0 zeroes the token's log-ratio
    c = zero_masked(c, m)
    seq_ratio = torch.exp(c.sum(-1, keepdim=True) / count).detach()
    g_tok = seq_ratio * torch.exp(c - c.detach())
    loss = -adv * g_tok
    rows = m.any(-1)
    metrics = {
        "seq_ratio_mean": (seq_ratio.squeeze(-1) * rows).sum() / rows.sum().clamp(min=1),
        "clip_frac_high": masked_mean(high.to(logp.dtype), m),
        "clip_frac_low": masked_mean(low.to(logp.dtype), m),
    }
    return _finish(loss, (high | low) & m, m, metrics)
