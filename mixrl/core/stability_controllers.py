"""Controllers for off-policy stability (axis A5; the interface is :mod:`mixrl.core.controllers`):
the ESS learning-rate scale of VCPO (``vcpo_ess``) and the dual ascent on R²VPO's ratio-variance
multiplier (``r2vpo_dual``). Both decide on the first micro-batch of each optimizer step from the
policy term's tokens (ratios against the behaviour policy, summed over processes).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from mixrl.core._tensor import LOG_RATIO_CLAMP, bool_mask
from mixrl.core.controllers import CONTROLLERS

SCALING_RULES = ("sqrt", "linear")


def ess_stats(ratio: Tensor, mask: Tensor) -> Tensor:
    """``[sum_i w_i, sum_i w_i^2, n]`` (float64) over the rows with tokens, ``w_i = exp(clamp(sum_t log r_it, -20, 20))``
    the row's sequence importance weight."""
    m = bool_mask(mask)
    lr = torch.where(m, ratio.detach().to(torch.float64).clamp(min=1e-300).log(), torch.zeros((), dtype=torch.float64))
    rows = m.any(-1)
    w = torch.exp(lr.sum(-1).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))[rows]
    return torch.stack([w.sum(), w.pow(2).sum(), torch.tensor(float(w.numel()), dtype=torch.float64)])


@CONTROLLERS.register("vcpo_ess", bounds={
    "base_ess_ratio": ("> 0", "the ESS ratio at which the learning rate is unscaled; ESS / N is in (0, 1]"),
})
class VcpoEssController:
    """VCPO's learning-rate scale from the effective sample size of the step's rollouts.

    Each step (its first micro-batch): the rows' sequence IS weights
    ``w_i = prod_t pi_theta / pi_behaviour`` (current policy against the rollouts' behaviour
    log-probs), ``ESS = (sum w)^2 / (sum w^2 + 1e-8)`` and ``ess_ratio = ESS / N`` over every
    process's rows; the optimizer's learning rate for this step is the scheduler's times
    ``s = min(1, ess_ratio / base_ess_ratio)^(1/2)`` (``scaling_rule: sqrt``) or ``^1``
    (``linear``), and back to the scheduler's at the next. Fresh rollouts have ``w = 1``,
    ESS = N, s = 1; a few dominating stale rows shrink the step.

    As the authors' code (mit-han-lab/vcpo @ c7f030f0b77237cfb0e75e720669e2917a1bb56e:
    ``compute_ess_info`` in recipe/fully_async_policy/staleness_utils.py:274-330, the lr scale in
    verl/workers/actor/megatron_actor.py:881-894; their scripts use ``sqrt`` with
    ``base_ess_ratio`` 1.0, recipe/fully_async_policy/shell/vcpo/math/vcpo_k=10.sh:101-105).
    Differences: their weights are over the whole optimizer step's rows, here over the step's
    first micro-batch (the same with one micro-batch per step); the summed log-ratio is clamped
    to [-20, 20] before ``exp`` (their float sum would overflow instead). Their second part, the
    minimum-variance off-policy baseline (``compute_opob_baseline``: a group's reward baseline
    weighted by each row's squared gradient norm times w_i^2), needs one backward per row and is
    not here.

    Formula: w_i = exp(sum_t log r_it), ess_ratio = (sum w)^2 / (N sum w^2); lr = lr_sched * s, s = min(1, ess_ratio / {base_ess_ratio})^e, e = 1/2 (sqrt) or 1 (linear): {scaling_rule}

    Paper: "Stable Asynchrony: Variance-Controlled Off-Policy RL for LLMs" (VCPO, arXiv 2602.17616).

    Parameters:
        base_ess_ratio (1.0): the ESS ratio at and above which the learning rate is unscaled.
        scaling_rule ('sqrt'): ``sqrt`` or ``linear`` in the ESS ratio.
    """

    when = "step_start"
    needs = ("ratio", "mask")
    knob_names = ("optimizer.lr_scale",)

    def __init__(self, *, base_ess_ratio: float = 1.0, scaling_rule: str = "sqrt"):
        if scaling_rule not in SCALING_RULES:
            raise ValueError(f"scaling_rule must be one of {', '.join(SCALING_RULES)}, got {scaling_rule!r}")
        if not base_ess_ratio > 0:
            raise ValueError(f"base_ess_ratio must be > 0, got {base_ess_ratio}")
        self.base_ess_ratio, self.scaling_rule = float(base_ess_ratio), scaling_rule
        self.ess_ratio = 1.0
        self.lr_scale = 1.0
        self.num_updates = 0

    def update(self, stats: Tensor) -> float:
        """From ``[sum w, sum w^2, n]`` (summed over processes): the learning-rate scale."""
        total, squares, n = (float(x) for x in stats)
        self.ess_ratio = (total * total / (squares + 1e-8)) / n if n > 0 else 0.0
        scale = min(1.0, self.ess_ratio / self.base_ess_ratio)
        self.lr_scale = math.sqrt(scale) if self.scaling_rule == "sqrt" else scale
        self.num_updates += 1
        return self.lr_scale

    @staticmethod
    def check(objective) -> None:
        """Needs a policy term (its tokens' ratios give the weights)."""
        if not any(t.kind == "policy" for t in objective.terms):
            raise ValueError("it weighs the policy term's rows, but the objective has no policy term")

    def step(self, stats: dict[str, Tensor], reduce: Callable[[Tensor], Tensor] | None = None) -> None:
        s = ess_stats(stats["ratio"], stats["mask"])
        self.update(reduce(s) if reduce is not None else s)

    def knobs(self) -> dict[str, float]:
        return {"optimizer.lr_scale": self.lr_scale}

    def metrics(self) -> dict[str, float]:
        return {"vcpo/ess_ratio": self.ess_ratio, "vcpo/lr_scale": self.lr_scale}

    def state_dict(self) -> dict[str, Any]:
        return {"ess_ratio": self.ess_ratio, "lr_scale": self.lr_scale, "num_updates": self.num_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ess_ratio = float(state["ess_ratio"])
        self.lr_scale = float(state["lr_scale"])
        self.num_updates = int(state["num_updates"])


@CONTROLLERS.register("r2vpo_dual", bounds={
    "delta": (">= 0", "a bound on a variance, which is >= 0"),
    "dual_lr": ("> 0", "the dual step size; <= 0 never moves (or reverses) the multiplier"),
    "coef_init": (">= 0", "a Lagrange multiplier of an inequality constraint is >= 0"),
    "coef_max": ("> 0", "a cap on the multiplier"),
})
class R2vpoDualController:
    """R²VPO's primal-dual update of the ratio-variance multiplier.

    Each step (its first micro-batch): ``V = Var(r)`` over the policy term's tokens of every
    process (``sum r``, ``sum r^2``, token count summed over processes), then dual ascent on the
    constraint ``V <= delta``: ``lam = clamp(lam + dual_lr (V - delta), 0, coef_max)``; the
    policy loss ``r2vpo`` uses ``var_coef = lam``. Fresh rollouts give V = 0, so lam decays to 0
    on-policy; stale ones raise it until the variance meets its budget.

    Our reading (from the abstract; the authors' code was not found): projected gradient ascent
    with a fixed step, on the first micro-batch's ratios (which, at the start of a step, are the
    current policy's against the behaviour policy's). delta 0.05, dual_lr 1.0 and coef_init 1.0
    are mixrl's defaults, not the paper's.

    Formula: V = Var(r) over the step's tokens; lam <- clamp(lam + {dual_lr} (V - {delta}), 0, {coef_max}); loss.var_coef = lam (from {coef_init})

    Paper: "Ratio-Variance Regularized Policy Optimization for Efficient LLM Fine-tuning"
    (Luo et al. 2026, arXiv 2601.03320).

    Parameters:
        delta (0.05): the variance budget.
        dual_lr (1.0): the dual step size.
        coef_init (1.0): the multiplier before the first step.
        coef_max (100.0): cap on the multiplier.
    """

    when = "step_start"
    needs = ("ratio", "mask")
    knob_names = ("loss.var_coef",)

    def __init__(self, *, delta: float = 0.05, dual_lr: float = 1.0, coef_init: float = 1.0, coef_max: float = 100.0):
        if delta < 0 or not dual_lr > 0 or coef_init < 0 or not coef_max > 0:
            raise ValueError("need delta >= 0, dual_lr > 0, coef_init >= 0 and coef_max > 0")
        self.delta, self.dual_lr, self.coef_max = float(delta), float(dual_lr), float(coef_max)
        self.coef = min(float(coef_init), self.coef_max)
        self.variance = 0.0
        self.num_updates = 0

    @staticmethod
    def variance_stats(ratio: Tensor, mask: Tensor) -> Tensor:
        """``[sum r, sum r^2, n]`` (float64) over the valid tokens."""
        m = bool_mask(mask)
        r = ratio.detach().to(torch.float64)[m]
        return torch.stack([r.sum(), r.pow(2).sum(), torch.tensor(float(r.numel()), dtype=torch.float64)])

    def update(self, stats: Tensor) -> float:
        """From ``[sum r, sum r^2, n]`` (summed over processes): the new multiplier."""
        total, squares, n = (float(x) for x in stats)
        self.variance = max(squares / n - (total / n) ** 2, 0.0) if n > 0 else 0.0
        self.coef = min(max(self.coef + self.dual_lr * (self.variance - self.delta), 0.0), self.coef_max)
        self.num_updates += 1
        return self.coef

    @staticmethod
    def check(objective) -> None:
        """Sets ``var_coef``: every policy term must use the r2vpo loss."""
        for t in objective.terms:
            if t.kind != "policy":
                continue
            loss = (t.params.get("loss") or {}).get("name")
            if loss != "r2vpo":
                raise ValueError(f"it sets the ratio-variance multiplier, but algo.loss.name={loss} has none; use algo.loss.name=r2vpo")

    def step(self, stats: dict[str, Tensor], reduce: Callable[[Tensor], Tensor] | None = None) -> None:
        s = self.variance_stats(stats["ratio"], stats["mask"])
        self.update(reduce(s) if reduce is not None else s)

    def knobs(self) -> dict[str, float]:
        return {"loss.var_coef": self.coef}

    def metrics(self) -> dict[str, float]:
        return {"r2vpo/var_coef": self.coef, "r2vpo/ratio_var": self.variance}

    def state_dict(self) -> dict[str, Any]:
        return {"coef": self.coef, "variance": self.variance, "num_updates": self.num_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.coef = float(state["coef"])
        self.variance = float(state["variance"])
        self.num_updates = int(state["num_updates"])
