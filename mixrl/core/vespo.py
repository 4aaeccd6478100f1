"""VESPO: a gamma-shaped kernel on the sequence-level importance weight (axis A1, ``loss/``).

Same signature and conventions as :mod:`mixrl.core.policy_base`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mixrl.core._tensor import LOG_RATIO_CLAMP, bool_mask, log_ratio, masked_inputs, token_advantages, zero_masked
from mixrl.core.policy_base import POLICY_LOSSES, PolicyLossOutput, _finish

_SHAPE = ("> 0", "the kernel w^k exp(-lam (w - 1)) needs k > 0 to vanish at w = 0 and lam > 0 to vanish as w grows")


@POLICY_LOSSES.register("vespo", bounds={"k_pos": _SHAPE, "lambda_pos": _SHAPE, "k_neg": _SHAPE, "lambda_neg": _SHAPE})
def vespo(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
) -> PolicyLossOutput:
    """VESPO: REINFORCE weighted by a closed-form kernel of the row's sequence IS weight.

    Formula: ``l_t = -sg(phi(W)) A log p_t``, ``W = exp(clamp(sum_t log r_t, -20, 20))`` over the row's tokens (a product, no length normalisation), ``phi(W) = W^k exp(-lam (W - 1))``, (k, lam) = ({k_pos}, {lambda_pos}) if A >= 0 else ({k_neg}, {lambda_neg})

    ``phi`` is the effective coefficient on ``grad log pi`` (``W f'(W)`` of the paper's
    variational reshaping); ``phi(1) = 1``, so fresh rows get plain REINFORCE, and it peaks
    at ``W = k / lam`` and decays to 0 for W -> 0 and W -> inf: stale rows whose sequence
    weight moved far in either direction lose their gradient smoothly instead of being cut.
    A row's sign (and so its (k, lam)) is that of its advantage. Defaults: the authors'
    scripts and code (k_pos 2, lam_pos 3, k_neg 3, lam_neg 2); the authors' aggregation is
    verl's token-mean. ``clipped`` marks tokens of rows with ``phi < 0.5`` (gradient more
    than halved); metrics ``seq_weight_mean``, ``phi_mean`` over rows with tokens.

    Paper: "VESPO: Variational Sequence-Level Soft Policy Optimization for Stable Off-Policy
    LLM Training" (Shen et al. 2026, arXiv 2602.10693).

    Parameters:
        k_pos (2.0): kernel exponent k for A >= 0.
        lambda_pos (3.0): kernel rate lam for A >= 0.
        k_neg (3.0): kernel exponent k for A < 0.
        lambda_neg (2.0): kernel rate lam for A < 0.
    """
    logp, old_logp, advantages = masked_inputs(logp, old_logp, advantages, mask)
    m = bool_mask(mask)
    adv = token_advantages(advantages, logp)
    seq_lr = zero_masked(log_ratio(logp, old_logp).detach(), m).sum(-1, keepdim=True)
    seq_lr = seq_lr.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    w = torch.exp(seq_lr)
    pos = adv >= 0
    k = torch.where(pos, torch.full_like(adv, k_pos), torch.full_like(adv, k_neg))
    lam = torch.where(pos, torch.full_like(adv, lambda_pos), torch.full_like(adv, lambda_neg))
    phi = torch.exp(k * seq_lr - lam * (w - 1.0))  # [B, T]: per-token (k, lam), per-row W
    loss = -phi * adv * logp
    rows = m.any(-1)
    n_rows = rows.sum().clamp(min=1)
    phi_row = torch.where(m, phi, torch.zeros_like(phi)).amax(-1)  # one value per row (rows have one sign)
    metrics = {
        "seq_weight_mean": (w.squeeze(-1) * rows).sum() / n_rows,
        "phi_mean": (phi_row * rows).sum() / n_rows,
    }
    return _finish(loss, phi < 0.5, mask, metrics)
