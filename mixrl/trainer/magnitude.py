"""Magnitude guard: an advantage or a loss term far outside its normal range stops the run.

A normalised advantage stays small (GRPO's ``|A| <= (n - 1) / sqrt(n)`` for a group of n, about
2.5 for 8 and 8 for 64; whitening over a batch of N rows reaches about ``sqrt(N)``), and a loss
term is a mean of such advantages times ratios or of log-probs. A value of 10^6 means a
statistic divided by almost nothing (an expert row normalised by the std of all-equal rollouts,
before mixrl divided by 1 there) or a diverging policy, and nothing else refuses it. So once per
micro-batch, before its backward pass, :func:`check_step` looks at the micro-batch's advantages and
at each loss term's value; one above its bound, or not finite, stops the run with one line naming
the component, the rows and the key that raises the bound:

* ``trainer.max_abs_advantage`` (default 1000; null: no bound): ``|A|`` of any row (any token
  of a per-token advantage);
* ``trainer.max_abs_loss`` (default 1e6; null: no bound): ``|loss/<term>|`` of any term of
  the objective on the micro-batch, and any non-finite one whatever the bound. The bound is
  loose on purpose: a term summed over a row's tokens (``seq-mean-token-sum``: TOPR, ALOL)
  reaches ``|A|`` or an NLL times the completion length, 10^4 and more for long completions.

The error is :class:`MagnitudeExceeded`, a :class:`~mixrl.errors.TrainingDiverged` (exit 3);
``mixrl train`` saves a checkpoint of the last finished step first (the weights have not been
updated with the micro-batch that tripped it), so the run continues with
``mixrl train resume=RUN_DIR trainer.max_abs_advantage=...`` once the bound is raised (both keys
are resume-safe). The trainer calls :func:`check_step` from one line of
``MixrlGRPOTrainer._compute_loss`` with the bounds it was built with
(:class:`~mixrl.trainer.parts_spec.PartsSpec` ``magnitude``, filled by
:func:`mixrl.trainer.build.trainer_from_config`; left out: the defaults).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from mixrl.core import provenance as prov
from mixrl.errors import TrainingDiverged

DEFAULT_MAX_ABS_ADVANTAGE = 1000.0
DEFAULT_MAX_ABS_LOSS = 1e6


@dataclass(frozen=True)
class MagnitudeBounds:
    """``trainer.max_abs_advantage`` and ``trainer.max_abs_loss`` (None: no bound on the magnitude)."""

    max_abs_advantage: float | None = DEFAULT_MAX_ABS_ADVANTAGE
    max_abs_loss: float | None = DEFAULT_MAX_ABS_LOSS

    @classmethod
    def from_config(cls, trainer_cfg: Any) -> MagnitudeBounds:
        def get(key: str, default: float) -> float | None:
            value = trainer_cfg.get(key, default) if hasattr(trainer_cfg, "get") else default
            return None if value is None else float(value)

        return cls(get("max_abs_advantage", DEFAULT_MAX_ABS_ADVANTAGE), get("max_abs_loss", DEFAULT_MAX_ABS_LOSS))


class MagnitudeExceeded(TrainingDiverged):
    """An advantage or loss term above its bound, or not finite (one line: component, rows, fix)."""


def _source_names() -> dict[int, str]:
    return {prov.code(n): n for n in prov.provenance_names()}


def _rows_text(rows: torch.Tensor, inputs: dict) -> str:
    """'2 rows (expert, groups 0, 3)' for the micro-batch rows ``rows`` (indices)."""
    idx = rows.tolist()
    names = _source_names()
    parts = []
    if "row_source" in inputs:
        kinds = Counter(names.get(int(inputs["row_source"][i]), "?") for i in idx)
        parts.append(", ".join(f"{k} x{n}" if n > 1 else k for k, n in sorted(kinds.items())))
    if "group_id" in inputs:
        groups = sorted({int(inputs["group_id"][i]) for i in idx})
        shown = ", ".join(str(g) for g in groups[:5]) + (", ..." if len(groups) > 5 else "")
        parts.append(f"group{'s' if len(groups) > 1 else ''} {shown}")
    return f"{len(idx)} row{'s' if len(idx) != 1 else ''}" + (f" ({'; '.join(parts)})" if parts else "")


def check_advantages(advantages: torch.Tensor, inputs: dict, bound: float | None, step: int) -> None:
    """Raise :class:`MagnitudeExceeded` if any row's advantage is non-finite or above ``bound`` in magnitude."""
    a = advantages.detach()
    if a.dim() == 2 and "completion_mask" in inputs:  # per-token advantages (GAE): only the completion's tokens
        a = torch.where(inputs["completion_mask"].bool(), a, torch.zeros_like(a))
    per_row = a.abs().reshape(a.shape[0], -1).amax(dim=1) if a.numel() else a.new_zeros(a.shape[:1])
    bad = ~torch.isfinite(per_row)
    if bound is not None:
        bad = bad | (per_row > bound)
    if not bool(bad.any()):
        return
    rows = torch.nonzero(bad).squeeze(1)
    worst = float(per_row[rows].max())
    kind = "not finite" if not math.isfinite(worst) else f"{worst:.3g} in magnitude, above trainer.max_abs_advantage={bound:g}"
    raise MagnitudeExceeded(
        f"training diverged at step {step}: the advantage of {_rows_text(rows, inputs)} is {kind}; "
        "a normaliser of the advantage estimator divided by almost nothing or the rewards are out of scale "
        "(check algo.advantage and the reward); raise trainer.max_abs_advantage (null: no bound) if such values are intended"
    )


def check_losses(metrics: dict, inputs: dict, bound: float | None, step: int, learning_rate: float | None = None) -> None:
    """Raise :class:`MagnitudeExceeded` if a term's ``loss/<label>`` is non-finite or above ``bound`` in magnitude."""
    for key, value in metrics.items():
        if not key.startswith("loss/") or key == "loss/total" or not isinstance(value, (int, float)):
            continue
        finite = math.isfinite(value)
        if finite and (bound is None or abs(value) <= bound):
            continue
        n = int(inputs["completion_ids"].shape[0]) if "completion_ids" in inputs else 0
        rows = _rows_text(torch.arange(n), inputs) if n else "the micro-batch"
        kind = "not finite" if not finite else f"{value:.3g}, above trainer.max_abs_loss={bound:g} in magnitude"
        lr = f" ({learning_rate:g})" if learning_rate is not None else ""
        raise MagnitudeExceeded(
            f"training diverged at step {step}: loss term '{key[5:]}' on a micro-batch of {rows} is {kind}; "
            f"likely cause: learning rate{lr} too high or an advantage out of scale; lower trainer.learning_rate, "
            "or raise trainer.max_abs_loss (null: no bound) if such values are intended"
        )


def check_step(bounds: MagnitudeBounds, inputs: dict, metrics: dict, *, step: int, learning_rate: float | None = None) -> None:
    """The trainer's one call (``MixrlGRPOTrainer._compute_loss``, training micro-batches): the
    micro-batch's advantages and the objective's term values against ``bounds`` (the trainer's
    ``spec.magnitude``); ``step``: the optimizer step being taken (1-based)."""
    check_advantages(inputs["advantages"], inputs, bounds.max_abs_advantage, step)
    check_losses(metrics, inputs, bounds.max_abs_loss, step, learning_rate)
