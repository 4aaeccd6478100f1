"""Stateful controllers that set a loss knob from training statistics (axis A5).

Registered entries are *classes*; their keyword-only constructor parameters are the
config parameters. One interface, statistics in and knob values out:

* ``when``: ``"step_start"`` (consulted on the first micro-batch of each optimizer step,
  before its loss), ``"step_end"`` (after the step's last micro-batch) or ``"after_rewards"``
  (once per generation batch, before the advantages: ``step`` returns the rollouts' rewards,
  reshaped; PALU in :mod:`mixrl.core.palu`);
* ``needs``: the statistics ``step`` reads: ``ratio``, ``advantages``, ``mask`` (the policy
  term's tokens) or ``entropy`` (the step's token-mean entropy of on-policy tokens);
* ``step(stats, reduce=None)``: update from ``stats``; ``reduce(tensor)`` sums a tensor
  over processes so every process decides the same;
* ``knobs()``: the values it sets, by name: ``loss.<param>`` for a policy-loss parameter,
  any other name for an objective coefficient (e.g. ``entropy_coef``);
* ``knob_names``: the names ``knobs()`` may return (config validation reads them);
* ``check(objective)``: raise ``ValueError`` if the objective has nothing it can act on;
* ``state_dict()`` / ``load_state_dict(state)`` (plain floats / ints, saved with
  checkpoints) and ``metrics()`` (scalars to log).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from mixrl.core._tensor import bool_mask, token_advantages
from mixrl.core.registry import Registry

CONTROLLERS = Registry("controller")


@CONTROLLERS.register("bapo", bounds={
    "rho0": ("[0, 1]", "a share of the loss contribution"),
    "low_min": ("(0, 1]", "a lower ratio bound c_low <= 1"), "low_max": ("(0, 1]", "a lower ratio bound c_low <= 1"),
    "high_min": (">= 1", "an upper ratio bound c_high >= 1"), "high_max": (">= 1", "an upper ratio bound c_high >= 1"),
    "step_low": (">= 0", "bounds are only raised"), "step_high": (">= 0", "bounds are only raised"),
})
class BapoClipController:
    """BAPO adaptive clipping: widen PPO's clip bounds until positive-advantage tokens carry
    at least ``rho0`` of the loss contribution.

    Bounds are ratio bounds ``c_low <= 1 <= c_high``. A token's contribution is
    ``|A| * min(r, c_high)`` if A > 0 and ``|A| * max(r, c_low)`` if A < 0 (the absolute
    value of its clipped surrogate), and
    ``rho = sum_{A>0} contribution / sum_{A != 0} contribution`` (1 if there is none). The
    two sums are summed over processes (``reduce``) before every comparison, so that every
    process picks the same bounds. Each search restarts from ``(c_low, c_high) = (low_min, high_min)``:

    * ``search: sequential`` (the authors' code, WooooDyy/BAPO @ 7287044
      recipe/bapo/policy_loss.py:126-152): while ``rho < rho0``, raise ``c_low`` by ``step_low``
      (capped at ``low_max``) until rho is met or ``c_low`` is at ``low_max``; then, while
      still unmet, raise ``c_high`` by ``step_high`` (capped at ``high_max``). A larger
      ``c_low`` adds to the negative side, so while rho is unmet the lower bound ends at its maximum.
    * ``search: joint`` (mixrl's earlier reading): each round raises both bounds by one step.

    ``every: micro_batch`` (the authors': their loss function runs the search on every
    micro-batch, policy_loss.py:117-152 called from verl dp_actor.py:456) or ``step`` (the
    first micro-batch of each optimizer step; the bounds hold for the whole step). ``update()``
    returns ``(clip_low, clip_high)`` as PPO *epsilons* (``1 - c_low``, ``c_high - 1``) for
    ``ppo_clip``. State: the last chosen bounds and rho. Ranges [0.6, 0.9] / [1.2, 3.0] and
    rho0 = 0.5 from the authors' README; steps 0.05 / 0.05 from their
    recipe/bapo/config/bapo_trainer.yaml:18,21. Their criterion is the ratio
    ``pos / (neg + 1e-8) >= target`` (policy_loss.py:57-60); ``rho0`` is the same condition
    written as a share (target = rho0 / (1 - rho0)), without the 1e-8.

    Formula: [c_low, c_high] start at [{low_min}, {high_min}] ({search} search, every {every}): raised by
    ({step_low}, {step_high}) up to ({low_max}, {high_max}) until
    rho = sum_{A>0} A min(r, c_high) / sum_{A!=0} |A| clip(r) >= {rho0}; clip_low = 1 - c_low, clip_high = c_high - 1

    Paper: "BAPO: Stabilizing Off-Policy Reinforcement Learning for LLMs via Balanced Policy
    Optimization with Adaptive Clipping" (Xi et al. 2025).

    Parameters:
        rho0 (0.5): target share of the positive-advantage contribution.
        low_min (0.6): starting (loosest) lower ratio bound a-.
        low_max (0.9): highest lower ratio bound b-.
        high_min (1.2): starting (tightest) upper ratio bound a+.
        high_max (3.0): highest upper ratio bound b+.
        step_low (0.05): increment of the lower bound.
        step_high (0.05): increment of the upper bound.
        search ('sequential'): ``sequential`` (lower bound first, then upper: the authors') or ``joint`` (both per round).
        every ('micro_batch'): search on every ``micro_batch`` (the authors') or once per optimizer ``step``.
    """

    when = "step_start"
    needs = ("ratio", "advantages", "mask")
    knob_names = ("loss.clip_low", "loss.clip_high")
    SEARCHES = ("sequential", "joint")
    EVERY = ("micro_batch", "step")

    def __init__(
        self,
        *,
        rho0: float = 0.5,
        low_min: float = 0.6,
        low_max: float = 0.9,
        high_min: float = 1.2,
        high_max: float = 3.0,
        step_low: float = 0.05,
        step_high: float = 0.05,
        search: str = "sequential",
        every: str = "micro_batch",
    ):
        if not (0.0 < low_min <= low_max <= 1.0 <= high_min <= high_max):
            raise ValueError(
                "bapo: need 0 < low_min <= low_max <= 1 <= high_min <= high_max, got "
                f"{low_min}, {low_max}, {high_min}, {high_max}"
            )
        if step_low < 0 or step_high < 0:
            raise ValueError("bapo: step_low and step_high must be >= 0")
        if search not in self.SEARCHES:
            raise ValueError(f"bapo: search must be one of {', '.join(self.SEARCHES)}, got {search!r}")
        if every not in self.EVERY:
            raise ValueError(f"bapo: every must be one of {', '.join(self.EVERY)}, got {every!r}")
        self.rho0 = rho0
        self.low_min, self.low_max, self.step_low = low_min, low_max, step_low
        self.high_min, self.high_max, self.step_high = high_min, high_max, step_high
        self.search, self.every = search, every
        self.ratio_low = low_min
        self.ratio_high = high_min
        self.rho = float("nan")
        self.num_updates = 0

    @property
    def per_micro_batch(self) -> bool:
        """Does the trainer consult this controller on every micro-batch (else the step's first)?"""
        return self.every == "micro_batch"

    @property
    def clip_low(self) -> float:
        """Current lower epsilon (``1 - c_low``)."""
        return 1.0 - self.ratio_low

    @property
    def clip_high(self) -> float:
        """Current upper epsilon (``c_high - 1``)."""
        return self.ratio_high - 1.0

    @staticmethod
    def contributions(
        ratio: Tensor, advantages_tok: Tensor, mask: Tensor, ratio_low: float, ratio_high: float
    ) -> Tensor:
        """``[positive, negative]`` absolute clipped-surrogate contributions (float64)."""
        r = ratio.detach().to(torch.float64)
        adv = token_advantages(advantages_tok, r)
        m = bool_mask(mask)
        pos = (adv > 0) & m
        neg = (adv < 0) & m
        c_pos = (adv * torch.clamp(r, max=ratio_high))[pos].sum()
        c_neg = (-adv * torch.clamp(r, min=ratio_low))[neg].sum()
        return torch.stack([c_pos, c_neg])

    @staticmethod
    def _share(stats: Tensor) -> float:
        pos, neg = float(stats[0]), float(stats[1])
        total = pos + neg
        return 1.0 if total <= 0 else pos / total

    def update(
        self,
        ratio: Tensor,
        advantages_tok: Tensor,
        mask: Tensor,
        reduce: Callable[[Tensor], Tensor] | None = None,
    ) -> tuple[float, float]:
        """Choose the bounds; returns ``(clip_low, clip_high)`` epsilons.

        ``ratio``: [B, T] importance ratios; ``advantages_tok``: [B, T] or [B];
        ``mask``: [B, T]. ``reduce``: optional function applied to the 2-vector of
        contributions before every comparison (:func:`sum_over_processes`, a DDP all-reduce
        sum) so that every rank picks the same bounds.
        """

        def share(lo: float, hi: float) -> float:
            stats = self.contributions(ratio, advantages_tok, mask, lo, hi)
            if reduce is not None:
                stats = reduce(stats)
            return self._share(stats)

        lo, hi = self.low_min, self.high_min
        rho = share(lo, hi)
        if self.search == "sequential":
            # the authors' order: the lower bound to its maximum first, then the upper
            while rho < self.rho0 and lo < self.low_max and self.step_low > 0:
                lo = min(lo + self.step_low, self.low_max)
                rho = share(lo, hi)
            while rho < self.rho0 and hi < self.high_max and self.step_high > 0:
                hi = min(hi + self.step_high, self.high_max)
                rho = share(lo, hi)
        else:
            n_high = _n_steps(self.high_min, self.high_max, self.step_high)
            n_low = _n_steps(self.low_min, self.low_max, self.step_low)
            i_low = i_high = 0
            while rho < self.rho0 and (i_low < n_low or i_high < n_high):
                if i_high < n_high:
                    i_high += 1
                if i_low < n_low:
                    i_low += 1
                lo = self.low_min + i_low * self.step_low
                hi = self.high_min + i_high * self.step_high
                rho = share(lo, hi)
        self.ratio_low, self.ratio_high, self.rho = lo, hi, rho
        self.num_updates += 1
        return self.clip_low, self.clip_high

    @staticmethod
    def check(objective) -> None:
        """BAPO moves PPO's clip bounds: every policy term must use ppo_clip."""
        for t in objective.terms:
            loss = (t.params.get("loss") or {}).get("name") if t.kind == "policy" else "ppo_clip"
            if loss != "ppo_clip":
                raise ValueError(f"it sets PPO clip bounds, but algo.loss.name={loss} has no PPO clip; use algo.loss.name=ppo_clip")

    def step(self, stats: dict[str, Tensor], reduce: Callable[[Tensor], Tensor] | None = None) -> None:
        self.update(stats["ratio"], stats["advantages"], stats["mask"], reduce=reduce)

    def knobs(self) -> dict[str, float]:
        return {"loss.clip_low": self.clip_low, "loss.clip_high": self.clip_high}

    def metrics(self) -> dict[str, float]:
        return {
            "bapo/ratio_low": self.ratio_low,
            "bapo/ratio_high": self.ratio_high,
            "bapo/positive_share": self.rho,
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "ratio_low": self.ratio_low,
            "ratio_high": self.ratio_high,
            "rho": self.rho,
            "num_updates": self.num_updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ratio_low = float(state["ratio_low"])
        self.ratio_high = float(state["ratio_high"])
        self.rho = float(state["rho"])
        self.num_updates = int(state["num_updates"])


def sum_over_processes(t: Tensor) -> Tensor:
    """``t`` summed over the processes of the default ``torch.distributed`` group (an all-reduce
    on a copy); ``t`` itself with one process or without a process group. BAPO's bound search
    passes its ``[positive, negative]`` contributions through it before every comparison (the
    authors' policy_loss.py:49-55), so every process picks the same bounds."""
    import torch.distributed as dist  # deferred: only runs with several processes

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
        return t
    out = t.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def _n_steps(start: float, stop: float, step: float) -> int:
    """How many increments of ``step`` fit in ``[start, stop]`` (float-safe)."""
    if step <= 0:
        return 0
    return int(math.floor((stop - start) / step + 1e-9))


@CONTROLLERS.register("entropic", bounds={
    "target": (">= 0", "an entropy in nats, which is >= 0"),
    "kp": (">= 0", "a negative gain pushes the entropy away from its target"),
    "ki": (">= 0", "a negative gain pushes the entropy away from its target"),
    "integral_limit": (">= 0", "a clamp on |I|"),
})
class EntropicController:
    """EntroPIC-style PI controller on the policy entropy.

    Each ``update(entropy)``: error ``e = target - entropy``; integral ``I += e``;
    ``coef = clamp(kp * e + ki * I, coef_min, coef_max)``. If ``integral_limit`` is set,
    ``I`` is clamped to ``[-integral_limit, integral_limit]`` (anti-windup). A positive
    coef means "entropy is too low": the trainer raises entropy with it (e.g. as an
    entropy-bonus coefficient, or, as in EntroPIC, by down-weighting positive /
    up-weighting negative samples). State: the integral and the last coef. The gains and
    range are our defaults (not from the paper), sized for token entropies of order
    0.1 - 1 nats.

    Formula: after each step e = {target} - H, I += e (|I| <= {integral_limit}),
    c_ent = clamp({kp} e + {ki} I, {coef_min}, {coef_max})

    Paper: "EntroPIC: Towards Stable Long-Term Training of LLMs via Entropy Stabilization
    with Proportional-Integral Control" (2025).

    Parameters:
        target (0.2): target entropy (nats per token).
        kp (1.0): proportional gain.
        ki (0.05): integral gain.
        coef_min (-1.0): lower bound of the output.
        coef_max (1.0): upper bound of the output.
        integral_limit (None): clamp on |integral| (None = no anti-windup).
    """

    when = "step_end"
    needs = ("entropy",)
    knob_names = ("entropy_coef",)

    def __init__(
        self,
        *,
        target: float = 0.2,
        kp: float = 1.0,
        ki: float = 0.05,
        coef_min: float = -1.0,
        coef_max: float = 1.0,
        integral_limit: float | None = None,
    ):
        if coef_min > coef_max:
            raise ValueError(f"entropic: coef_min {coef_min} > coef_max {coef_max}")
        self.target, self.kp, self.ki = target, kp, ki
        self.coef_min, self.coef_max = coef_min, coef_max
        self.integral_limit = integral_limit
        self.integral = 0.0
        self.coef = min(max(0.0, coef_min), coef_max)
        self.last_error = 0.0
        self.num_updates = 0

    def update(self, entropy: float) -> float:
        """Feed this step's (token-mean) entropy; returns the new coefficient."""
        e = self.target - float(entropy)
        self.integral += e
        if self.integral_limit is not None:
            lim = abs(self.integral_limit)
            self.integral = min(max(self.integral, -lim), lim)
        raw = self.kp * e + self.ki * self.integral
        self.coef = min(max(raw, self.coef_min), self.coef_max)
        self.last_error = e
        self.num_updates += 1
        return self.coef

    @staticmethod
    def check(objective) -> None:
        """Nothing to check beyond the coefficient it sets (checked by the config layer)."""

    def step(self, stats: dict[str, Any], reduce: Callable[[Tensor], Tensor] | None = None) -> None:
        entropy = torch.as_tensor(float(stats["entropy"]), dtype=torch.float64)
        if reduce is not None:
            entropy = reduce(entropy)
        self.update(float(entropy))

    def knobs(self) -> dict[str, float]:
        """The entropy coefficient, once the first step has been seen (before: the config's)."""
        return {"entropy_coef": self.coef} if self.num_updates else {}

    def metrics(self) -> dict[str, float]:
        return {
            "entropic/coef": self.coef,
            "entropic/error": self.last_error,
            "entropic/integral": self.integral,
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "integral": self.integral,
            "coef": self.coef,
            "last_error": self.last_error,
            "num_updates": self.num_updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.integral = float(state["integral"])
        self.coef = float(state["coef"])
        self.last_error = float(state.get("last_error", 0.0))
        self.num_updates = int(state.get("num_updates", 0))
