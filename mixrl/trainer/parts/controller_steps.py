"""When a controller (``mixrl.core.CONTROLLERS``) steps during training.

``after_rewards`` controllers (PALU) reshape a generation batch's rollout rewards before its
advantages; ``step_start`` controllers (BAPO) decide from the policy term's tokens (ratios and
advantages summed over processes) on the first micro-batch of each optimizer step, or on every
micro-batch when the controller says ``per_micro_batch`` (BAPO's ``every: micro_batch``, the
authors'; every process runs as many micro-batches, so the sums meet); ``step_end``
controllers (EntroPIC) see the step's mean entropy after its last micro-batch. The loss reads
the controller's knobs and metrics through :meth:`ControllerSteps.knobs` and :meth:`ControllerSteps.metrics`;
an ``optimizer.lr_scale`` knob (VCPO) multiplies the optimizer's learning rates for the step it was
decided in (:meth:`ControllerSteps.scale_lr`: the scheduler's values, restored at the next decision).

Owns: the controller (its state is shared: written once, by the saving process, into
``mixrl_state.json``) and the entropies of the running step's micro-batches. Receives at
construction the policy term's token populations and the process collectives (``reduce``,
``gather``; None with one process); per call: the micro-batch, its log-probs, the micro-step
and whether gradients sync. Returns reshaped rewards; the controller's own metrics on request.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mixrl.core import provenance as prov


class ControllerSteps:
    """Stepping the controller at its moment (``controller.when``)."""

    def __init__(self, controller, *, policy_tokens: tuple, reduce_sum: Callable | None, reduce_mean: Callable,
                 gather: Callable, device, param_groups: Callable | None = None):
        self.controller = controller
        self.policy_tokens = tuple(policy_tokens)  # the policy term's token populations
        self.reduce_sum = reduce_sum  # None with one process
        self.reduce_mean = reduce_mean
        self.gather = gather
        self.device = device
        self.entropy_window: list[float] = []  # step_end controllers: entropies of the step's micro-batches
        self.param_groups = param_groups  # () -> the optimizer's param groups (None before it exists)
        self.lr_set: list[tuple[float, float]] = []  # (base, scaled) learning rate per group, as last set

    def step_start(self, logps: torch.Tensor, inputs: dict, *, micro_step: int, accumulation: int) -> None:
        """``step_start`` controllers (BAPO) decide on the first micro-batch of each step (or on
        every micro-batch: ``controller.per_micro_batch``) from the policy term's tokens (ratios
        and advantages summed over processes)."""
        c = self.controller
        if c.when != "step_start":
            return
        if not getattr(c, "per_micro_batch", False) and micro_step % accumulation != 0:
            return
        old = inputs.get("old_per_token_logps")
        old = logps.detach() if old is None else old
        sel = inputs["completion_mask"].bool() & prov.select(inputs["token_source"], self.policy_tokens)
        ratio = torch.exp((logps.detach() - torch.where(sel, old, logps.detach())).clamp(-20, 20))
        c.step({"ratio": ratio, "advantages": inputs["advantages"], "mask": sel.float()}, reduce=self.reduce_sum)
        if "optimizer.lr_scale" in getattr(c, "knob_names", ()):
            self.scale_lr(float(c.knobs()["optimizer.lr_scale"]))

    def scale_lr(self, scale: float) -> None:
        """Set every param group's learning rate to its base times ``scale``. The base is the
        group's current value, or the base this part last scaled when the value is still the one
        it set (a scheduler that did not step since keeps it from compounding)."""
        groups = self.param_groups() if self.param_groups is not None else None
        if not groups:
            return
        previous = self.lr_set if len(self.lr_set) == len(groups) else [(None, None)] * len(groups)
        self.lr_set = []
        for group, (base, scaled) in zip(groups, previous):
            base = base if scaled is not None and group["lr"] == scaled else group["lr"]
            group["lr"] = base * scale
            self.lr_set.append((base, group["lr"]))

    def after_rewards(self, out: dict, rewards: torch.Tensor, primary: torch.Tensor) -> torch.Tensor:
        """``after_rewards`` controllers (PALU) see the generation batch's rollouts (gathered
        rewards, lengths and successes: the first reward function >= 1) before the advantages,
        and return the rewards the advantages are computed from."""
        c = self.controller
        if getattr(c, "when", None) != "after_rewards":
            return rewards
        lengths = self.gather(out["completion_mask"].sum(-1))
        rows = self.gather(out["row_source"]) == prov.ON_POLICY
        shaped = c.step({"rewards": rewards[rows], "lengths": lengths[rows], "correct": primary[rows] >= 1.0 - 1e-6})
        rewards = rewards.clone()
        rewards[rows] = shaped.to(rewards.dtype)
        return rewards

    def step_end(self, metrics: dict, *, sync_gradients: bool) -> None:
        """``step_end`` controllers (EntroPIC) see the step's mean entropy after its last micro-batch."""
        c = self.controller
        if c.when != "step_end":
            return
        self.entropy_window.append(metrics.get("entropy", 0.0))
        if sync_gradients:
            window = torch.tensor(self.entropy_window, dtype=torch.float32, device=self.device).mean()
            window = self.reduce_mean(window)
            c.step({"entropy": float(window)})
            self.entropy_window = []

    def knobs(self) -> dict:
        return self.controller.knobs()

    def metrics(self) -> dict:
        out = dict(self.controller.metrics())
        if self.lr_set:  # the learning rate this step trains with (TRL's learning_rate is the scheduler's)
            out["optimizer/scaled_lr"] = self.lr_set[0][1]
        return out

    # ------------------------------------------------------------------ checkpoints (shared, JSON)
    def state_dict(self) -> dict:
        return self.controller.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.controller.load_state_dict(state)
