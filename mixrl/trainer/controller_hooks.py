"""When a controller (``mixrl.core.CONTROLLERS``) steps during training.

``after_rewards`` controllers (PALU) reshape a generation batch's rollout rewards before its
advantages; ``step_start`` controllers (BAPO) decide on the first micro-batch of each optimizer step from
the policy term's tokens (ratios and advantages summed over processes); ``step_end``
controllers (EntroPIC) see the step's mean entropy after its last micro-batch. This mixin of
:class:`mixrl.trainer.grpo.MixrlGRPOTrainer` feeds them; ``_compute_loss`` calls it and reads
the controller's knobs and metrics.
"""

from __future__ import annotations

import torch

from mixrl.core import provenance as prov


class ControllerHooks:
    """Stepping the controller (mixin; reads the trainer's ``controller``, ``objective``,
    ``accelerator``, ``_step``, ``current_gradient_accumulation_steps``, ``_entropy_window``)."""

    def _reduce_sum(self):
        return (lambda t: self.accelerator.reduce(t, "sum")) if self.accelerator.num_processes > 1 else None

    def _controller_step_start(self, logps, inputs) -> None:
        """``step_start`` controllers (BAPO) decide on the first micro-batch of each step from
        the policy term's tokens (ratios and advantages summed over processes)."""
        c = self.controller
        if c is None or c.when != "step_start" or self._step % self.current_gradient_accumulation_steps != 0:
            return
        old = inputs.get("old_per_token_logps")
        old = logps.detach() if old is None else old
        tokens = next((t.tokens for t in self.objective.terms if t.kind == "policy"), ("on_policy",))
        sel = inputs["completion_mask"].bool() & prov.select(inputs["token_source"], tokens)
        ratio = torch.exp((logps.detach() - torch.where(sel, old, logps.detach())).clamp(-20, 20))
        c.step({"ratio": ratio, "advantages": inputs["advantages"], "mask": sel.float()}, reduce=self._reduce_sum())

    def _controller_after_rewards(self, out: dict, rewards: torch.Tensor, primary: torch.Tensor) -> torch.Tensor:
        """``after_rewards`` controllers (PALU) see the generation batch's rollouts (gathered
        rewards, lengths and successes: the first reward function >= 1) before the advantages,
        and return the rewards the advantages are computed from."""
        c = self.controller
        if c is None or getattr(c, "when", None) != "after_rewards":
            return rewards
        lengths = self.accelerator.gather(out["completion_mask"].sum(-1))
        rows = self.accelerator.gather(out["row_source"]) == prov.ON_POLICY
        shaped = c.step({"rewards": rewards[rows], "lengths": lengths[rows], "correct": primary[rows] >= 1.0 - 1e-6})
        rewards = rewards.clone()
        rewards[rows] = shaped.to(rewards.dtype)
        return rewards

    def _controller_step_end(self, metrics: dict) -> None:
        """``step_end`` controllers (EntroPIC) see the step's mean entropy after its last micro-batch."""
        c = self.controller
        if c is None or c.when != "step_end":
            return
        self._entropy_window.append(metrics.get("entropy", 0.0))
        if self.accelerator.sync_gradients:
            window = torch.tensor(self._entropy_window, dtype=torch.float32, device=self.accelerator.device).mean()
            window = self.accelerator.reduce(window, "mean")
            c.step({"entropy": float(window)})
            self._entropy_window = []
