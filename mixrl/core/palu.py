"""PALU's length controller (registered in ``CONTROLLERS`` as ``palu``).

"Concise Reasoning in the Lens of Lagrangian Optimization" (performance-aware length updating,
PALU). What its abstract fixes: concise reasoning as ``min E[length]`` subject to a performance
constraint, turned into an unconstrained problem by a Lagrangian, with three approximations:
(i) performance estimated with off-policy rollouts, (ii) the Lagrange multiplier truncated to
two extremes, (iii) quantile-driven length adjustments instead of gradient updates.

Our reading (the abstract does not give the update rule; these are our choices):

* the constraint is ``P >= target``, ``P`` the accuracy (first reward function >= 1, as the
  ``accuracy`` metric) of the step's rollouts: they were sampled by the policy before this
  update, so no fresh evaluation rollouts are spent (approximation i);
* the multiplier takes one of its two extremes each step (ii): ``lambda = lambda_max`` (logged
  as ``palu/lambda = 1``) when ``P < target``: performance alone counts and the rewards are left
  as they are; ``lambda = 0`` (``palu/lambda = 0``) when ``P >= target``: length is minimised;
* the length step is a quantile (iii): with ``lambda = 0`` the length budget becomes
  ``L <- min(L, q-quantile of the lengths of this step's correct rollouts)`` and a rollout's
  reward is kept only within it, ``R' = R 1[len <= L]`` (a correct answer past the budget
  counts as a failure); the budget is never raised and starts unbounded.

The trainer steps it once per generation batch, after the rewards and before the advantages
(``when = "after_rewards"``), on every process with the same gathered rewards and lengths.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from mixrl.core.controllers import CONTROLLERS


def budgeted_rewards(rewards: Tensor, lengths: Tensor, budget: float | None, rows: Tensor | None = None) -> Tensor:
    """``R' = R 1[len <= budget]`` on ``rows`` (default all), ``R`` elsewhere; no budget: ``R``."""
    if budget is None:
        return rewards
    over = lengths.to(rewards.device).float() > float(budget)
    if rows is not None:
        over = over & rows.to(rewards.device).bool()
    return torch.where(over, torch.zeros_like(rewards), rewards)


@CONTROLLERS.register("palu", bounds={
    "target": ("[0, 1]", "an accuracy"),
    "quantile": ("(0, 1]", "a quantile of the correct rollouts' lengths"),
    "min_budget": (">= 1", "a length in tokens"),
})
class PaluController:
    """PALU: a length budget that shrinks by quantiles while the rollouts' accuracy meets its target.

    Formula: P = accuracy of the step's rollouts; lambda = lambda_max if P < {target} else 0 (two extremes); if lambda = 0: L <- max({min_budget}, min(L, quantile_{quantile}(len of correct rollouts))) and R' = R 1[len <= L]; else R' = R
    Paper: PALU, "Concise Reasoning in the Lens of Lagrangian Optimization": the abstract fixes the constrained problem, off-policy performance estimates, the two-extreme multiplier and quantile length updates; the update rule above is our reading.

    Parameters:
        target (0.5): accuracy the constraint asks of the rollouts (P >= target).
        quantile (0.8): the budget moves to this quantile of the correct rollouts' lengths.
        min_budget (1): the budget never goes below this many tokens.
    """

    when = "after_rewards"
    needs = ("rewards", "lengths", "correct")
    knob_names = ()

    def __init__(self, *, target: float = 0.5, quantile: float = 0.8, min_budget: int = 1):
        if not 0.0 <= target <= 1.0:
            raise ValueError(f"palu: target must be in [0, 1], got {target}")
        if not 0.0 < quantile <= 1.0:
            raise ValueError(f"palu: quantile must be in (0, 1], got {quantile}")
        self.target, self.quantile, self.min_budget = float(target), float(quantile), int(min_budget)
        self.budget: float | None = None
        self.lam = 1.0  # the multiplier's extreme, as a share of lambda_max: 1 = performance only, 0 = length
        self.accuracy = float("nan")
        self.clipped = 0.0  # share of rollouts whose reward the budget removed this step
        self.num_updates = 0

    def update(self, rewards: Tensor, lengths: Tensor, correct: Tensor) -> Tensor:
        """One generation batch (global, rollout rows only): decide lambda, move the budget,
        return the rewards to compute advantages from."""
        correct = correct.bool()
        n = correct.numel()
        self.accuracy = float(correct.float().mean()) if n else float("nan")
        self.num_updates += 1
        if not n or self.accuracy < self.target:
            self.lam = 1.0
            self.clipped = 0.0
            return rewards
        self.lam = 0.0
        good = lengths[correct].float()
        if good.numel():
            q = float(torch.quantile(good, self.quantile))
            q = max(float(self.min_budget), math.floor(q))
            self.budget = q if self.budget is None else min(self.budget, q)
        out = budgeted_rewards(rewards, lengths, self.budget)
        self.clipped = float((out != rewards).float().mean()) if n else 0.0
        return out

    def step(self, stats: dict[str, Tensor], reduce=None) -> Tensor:
        return self.update(stats["rewards"], stats["lengths"], stats["correct"])

    @staticmethod
    def check(objective) -> None:
        """It shapes rewards, which only a term that reads advantages turns into a gradient."""
        if not any(t.kind == "policy" for t in objective.terms):
            raise ValueError("it shapes the rollouts' rewards, but the objective has no policy term to train on them")

    def knobs(self) -> dict[str, float]:
        return {}

    def metrics(self) -> dict[str, float]:
        return {
            "palu/lambda": self.lam,
            "palu/budget": float(self.budget) if self.budget is not None else float("nan"),
            "palu/accuracy": self.accuracy,
            "palu/clipped": self.clipped,
        }

    def state_dict(self) -> dict[str, Any]:
        return {"budget": self.budget, "lam": self.lam, "accuracy": self.accuracy, "clipped": self.clipped,
                "num_updates": self.num_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.budget = None if state.get("budget") is None else float(state["budget"])
        self.lam = float(state["lam"])
        self.accuracy = float(state["accuracy"])
        self.clipped = float(state.get("clipped", 0.0))
        self.num_updates = int(state["num_updates"])
