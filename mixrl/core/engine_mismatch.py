"""Engine-mismatch correction: the weight that corrects for the inference engine (vLLM)
sampling with slightly different probabilities than the trainer computes.

When an inference engine generates, each sampled token comes with the log-prob the engine
sampled it with, ``log pi_engine`` (``sampling_per_token_logps`` in the batch). The trainer
scores the same tokens with its own forward, ``log pi_old`` (same weights, other kernels and
precision). The rollouts are therefore slightly off-policy for the trainer; truncated (or
masked) importance sampling between the two corrects it. Per token ``t`` of a row::

    d_t   = (log pi_old(y_t) - log pi_engine(y_t)) * m_t      (0 where the engine gave no log-prob)
    rho   = exp(d_t)            token_* modes   [B, T]
    rho   = exp(sum_t d_t)      sequence_* modes [B, 1], one value per row
    *_truncate: w = clamp(rho, C_min, C_max)            (a bound that is None is not applied)
    *_mask:     w = rho, or 0 where rho < C_min or rho > C_max

``w`` is a constant (no gradient): it multiplies the per-token policy loss of the rollout
tokens before aggregation. Reference implementation: TRL's ``GRPOTrainer`` (1.16,
``vllm_importance_sampling_correction`` / ``_mode`` / ``_clip_min`` / ``_clip_max``), whose
defaults are mixrl's (``sequence_mask``, C_min None, C_max 3). Paper: the truncated
importance-sampling fix for the train/inference mismatch, Yao et al. (2025), "Your Efficient
RL Framework Secretly Brings You Off-Policy RL Training".

Pure tensor math; no TRL import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
FORMULA = (
    "w = {how} with rho = exp({what}){level}, no gradient; "
    "multiplies the per-token policy loss of the tokens the policy sampled"
)


@dataclass(frozen=True)
class EngineCorrection:
    """The configured correction (``algo.engine_correction``): mode and bounds."""

    mode: str = "sequence_mask"
    c_min: float | None = None
    c_max: float | None = 3.0

    def __post_init__(self) -> None:
        check_bounds(self.mode, self.c_min, self.c_max)

    def formula(self) -> str:
        """The correction as one line, with its values (``mixrl explain``)."""
        level, how = self.mode.split("_")
        lo, hi = _fmt(self.c_min), _fmt(self.c_max)
        how = f"clamp(rho, C_min={lo}, C_max={hi})" if how == "truncate" else f"rho if C_min={lo} <= rho <= C_max={hi}, else 0"
        what = "sum_t (log pi_old - log pi_engine)" if level == "sequence" else "log pi_old - log pi_engine"
        where = " per row (one weight for all its tokens)" if level == "sequence" else " per token"
        return f"{self.mode}: " + FORMULA.format(how=how, what=what, level=where)


def _fmt(x: float | None) -> str:
    return "none" if x is None else f"{x:g}"


def check_bounds(mode: str, c_min: float | None, c_max: float | None) -> None:
    """``ValueError`` (one line) for an unknown mode, bounds TRL refuses (C_min >= C_max, no bound
    in a truncate mode) or a negative or infinite bound (no ratio exp(.) > 0 needs one)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if c_min is None and c_max is None and mode.endswith("_truncate"):
        raise ValueError(f"{mode} needs at least one of c_min and c_max")
    if c_min is not None and c_max is not None and not c_min < c_max:
        raise ValueError(f"c_min ({c_min:g}) must be less than c_max ({c_max:g})")
    for name, v in (("c_min", c_min), ("c_max", c_max)):
        if v is not None and not (math.isfinite(v) and v >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {v}")


def _log_diff(old_logp: Tensor, engine_logp: Tensor, mask: Tensor) -> Tensor:
    """``(log pi_old - log pi_engine) * m``, 0 where either is NaN (the engine gave none)."""
    d = (old_logp.detach() - engine_logp.detach().to(old_logp.dtype)) * mask.to(old_logp.dtype)
    return torch.nan_to_num(d, nan=0.0)


def engine_mismatch_weight(
    old_logp: Tensor,
    engine_logp: Tensor,
    mask: Tensor,
    *,
    mode: str = "sequence_mask",
    c_min: float | None = None,
    c_max: float | None = 3.0,
) -> Tensor:
    """The correction weight ``w`` (detached): [B, T] in ``token_*`` modes, [B, 1] in
    ``sequence_*`` modes (broadcast over the row's tokens). Exactly TRL 1.16's
    ``vllm_importance_sampling_ratio`` for the same inputs (see the module docstring)."""
    check_bounds(mode, c_min, c_max)
    d = _log_diff(old_logp, engine_logp, mask)
    level, how = mode.split("_")
    if level == "sequence":
        d = d.sum(dim=-1, keepdim=True)
    rho = torch.exp(d)
    if how == "truncate":
        return torch.clamp(rho, min=c_min, max=c_max)
    lo = -math.inf if c_min is None else c_min
    hi = math.inf if c_max is None else c_max
    return rho.masked_fill((rho < lo) | (rho > hi), 0.0)


def mismatch_metrics(
    old_logp: Tensor,
    engine_logp: Tensor,
    mask: Tensor,
    *,
    mode: str = "sequence_mask",
    c_min: float | None = None,
    c_max: float | None = 3.0,
) -> dict[str, float]:
    """Per-step statistics of the mismatch on the masked tokens (detached floats):

    * ``engine/logp_diff/mean``, ``/max``: mean and max |log pi_old - log pi_engine| over the
      tokens the engine gave a log-prob for;
    * ``engine/ratio/min``, ``/p05``, ``/median``, ``/p95``, ``/max``: quantiles of the raw
      ratio rho (before truncation or masking), per token or per row as the mode says;
    * ``engine/masked_frac`` (``*_mask``) or ``engine/truncated_frac`` (``*_truncate``): the
      share of tokens (rows) whose rho is outside [C_min, C_max].

    Empty (``{}``) when no masked token has an engine log-prob."""
    m = mask.bool()
    eng = engine_logp.detach().to(old_logp.dtype)
    known = m & torch.isfinite(eng)
    if not bool(known.any()):
        return {}
    delta = (old_logp.detach() - eng).abs()[known].double()
    d = _log_diff(old_logp, engine_logp, known)
    level, how = mode.split("_")
    if level == "sequence":
        rho = torch.exp(d.sum(-1).double())[known.any(-1)]
    else:
        rho = torch.exp(d.double())[known]
    lo = -math.inf if c_min is None else c_min
    hi = math.inf if c_max is None else c_max
    q = torch.quantile(rho, torch.tensor([0.05, 0.5, 0.95], dtype=rho.dtype, device=rho.device))
    return {
        "engine/logp_diff/mean": float(delta.mean()),
        "engine/logp_diff/max": float(delta.max()),
        "engine/ratio/min": float(rho.min()),
        "engine/ratio/p05": float(q[0]),
        "engine/ratio/median": float(q[1]),
        "engine/ratio/p95": float(q[2]),
        "engine/ratio/max": float(rho.max()),
        f"engine/{'masked' if how == 'mask' else 'truncated'}_frac": float(((rho < lo) | (rho > hi)).double().mean()),
    }
