"""Sequence-level ratios: GSPO (the row's length-normalised ratio, GSPO-token form). The
other sequence-level losses have their own modules: :mod:`mixrl.core.gmpo` (geometric mean of
the token ratios) and :mod:`mixrl.core.vespo` (the row's product of ratios).

Signature and conventions: :mod:`mixrl.core.policy_base`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mixrl.core._tensor import (
    bool_mask,
    log_ratio,
    masked_inputs,
    token_advantages,
    zero_masked,
)
from mixrl.core.policy_base import POLICY_LOSSES, PolicyLossOutput, _finish


@POLICY_LOSSES.register("gspo", bounds={
    "clip_low": ("[0, 1]", "the sequence ratio is clipped below at 1 - clip_low"),
    "clip_high": (">= 0", "the sequence ratio is clipped above at 1 + clip_high"),
})
def gspo(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    seq_log_ratio_max: float | None = None,
) -> PolicyLossOutput:
    """GSPO: sequence-level (length-normalised) ratio with a PPO clip.

    Formula: ``l_t = max(-A s_t, -A clip(s_t, 1 - {clip_low}, 1 + {clip_high}))``,
    ``s_t = sg(s) p_t / sg(p_t)``, ``s = exp(mean_t log r_t)`` over the row's tokens

    ``s`` is the row's geometric-mean (length-normalised) ratio; per token (GSPO-token
    form) ``s_t`` has value s and gradient ``s grad log p_t``. With ``seq-mean-token-mean``
    aggregation this is exactly GSPO's sequence objective and gradient. Clipped: all valid
    tokens of rows whose s is clipped.

    ``seq_log_ratio_max`` (default none) clamps ``log s_t`` from above, as verl's
    ``compute_policy_loss_gspo`` does at 10.0 (``torch.clamp(log_seq_importance_ratio, max=10.0)``,
    verl b178a3cd core_algos.py): a row whose mean log-ratio is above it gets ratio exp(max) and no
    gradient through the ratio.

    Paper: "Group Sequence Policy Optimization" (GSPO, Qwen, Zheng et al. 2025); defaults
    3e-4 / 4e-4 from the paper.

    Parameters:
        clip_low (3e-4): sequence-ratio lower bound 1 - clip_low.
        clip_high (4e-4): sequence-ratio upper bound 1 + clip_high.
        seq_log_ratio_max (None): clamp log s_t at this value from above (verl: 10.0); none: no clamp.
    """
    logp, old_logp, advantages = masked_inputs(logp, old_logp, advantages, mask)
    m = bool_mask(mask)
    lr = zero_masked(log_ratio(logp, old_logp), m)
    count = m.sum(-1, keepdim=True).clamp(min=1).to(logp.dtype)
    seq_lr = (lr.sum(-1, keepdim=True) / count).detach()
    seq_ratio = torch.exp(seq_lr)
    if seq_log_ratio_max is None:
        s_tok = seq_ratio * torch.exp(logp - logp.detach())
    else:  # verl's clamp of the per-token log sequence ratio (value and gradient)
        s_tok = torch.exp(torch.clamp(seq_lr + (logp - logp.detach()), max=float(seq_log_ratio_max)))
    adv = token_advantages(advantages, logp)
    loss1 = -adv * s_tok
    loss2 = -adv * torch.clamp(s_tok, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss1, loss2)
    clipped = loss2 > loss1
    rows = m.any(-1)
    metrics = {
        "seq_ratio_mean": (seq_ratio.squeeze(-1) * rows).sum() / rows.sum().clamp(min=1),
    }
    return _finish(loss, clipped, mask, metrics)

