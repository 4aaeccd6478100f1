"""Small tensor helpers shared by the core modules (private)."""

from __future__ import annotations

import torch
from torch import Tensor

#: log-ratios are clamped to this range before ``exp`` (as verl / Trinity-RFT do).
LOG_RATIO_CLAMP = 20.0


def bool_mask(mask: Tensor) -> Tensor:
    """A bool view of a bool or 0/1 float mask."""
    return mask if mask.dtype == torch.bool else mask != 0


def float_mask(mask: Tensor, like: Tensor) -> Tensor:
    """A 0/1 mask in ``like``'s dtype and device."""
    return bool_mask(mask).to(dtype=like.dtype, device=like.device)


def zero_masked(x: Tensor, mask: Tensor) -> Tensor:
    """``x`` where ``mask`` else 0 (NaN/inf on padding cannot leak, gradient included)."""
    return torch.where(bool_mask(mask), x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_inputs(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """``logp``, ``old_logp`` and per-token ``advantages`` with padded positions set to 0.

    Padding may hold anything (NaN, -inf from a masked softmax); selecting with
    ``torch.where`` before any ``exp`` or ratio keeps it out of the loss and gives those
    positions an exact zero gradient. Per-row advantages ``[B]`` are returned unchanged.
    """
    m = bool_mask(mask)
    logp = torch.where(m, logp, torch.zeros((), dtype=logp.dtype, device=logp.device))
    old_logp = torch.where(m, old_logp, torch.zeros((), dtype=old_logp.dtype, device=old_logp.device))
    if advantages.dim() == m.dim():
        advantages = torch.where(m, advantages, torch.zeros_like(advantages))
    return logp, old_logp, advantages


def log_ratio(logp: Tensor, old_logp: Tensor) -> Tensor:
    """``clamp(logp - sg(old_logp), -20, 20)``: the safe log importance ratio."""
    return torch.clamp(logp - old_logp.detach(), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def token_advantages(advantages: Tensor, like: Tensor) -> Tensor:
    """Broadcast per-row advantages ``[B]`` (or per-token ``[B, T]``) to ``like``'s shape."""
    adv = advantages.detach().to(dtype=like.dtype, device=like.device)
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1)
    return adv.expand_as(like)


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over ``mask``; 0 (not NaN) when the mask is empty."""
    m = float_mask(mask, x)
    return (zero_masked(x, mask)).sum() / m.sum().clamp(min=1.0)
