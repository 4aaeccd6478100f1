"""``trainer.staleness = k``: generation under the weights of k optimizer steps ago.

Every generation batch is sampled by the weights as they were k optimizer steps earlier: CPU
snapshots of the trainable parameters (one per generation step, kept in ``_lag_snapshots``)
are swapped in for generation and swapped back; the first k steps use the oldest snapshot, the
initial weights. The rollouts' behaviour log-probs (``old_per_token_logps``) are that lagged
policy's, from a no-grad forward under the same weights. Deterministic; one machine.

This mixin of :class:`mixrl.trainer.grpo.MixrlGRPOTrainer` owns the swap and the behaviour
forward (the latter is also used by asynchronous generation and the engine-sync check). The
snapshots travel with checkpoints (:mod:`mixrl.trainer.checkpoint_state`).
"""

from __future__ import annotations

import contextlib

import torch


class LaggedWeights:
    """Lagged weights and behaviour log-probs (mixin; reads the trainer's ``accelerator``,
    ``model``, ``state``, ``args``, ``staleness``, ``_lag_snapshots`` and sets ``_lag_used``)."""

    def _trainable(self) -> dict[str, torch.Tensor]:
        model = self.accelerator.unwrap_model(self.model)
        return {n: p for n, p in model.named_parameters() if p.requires_grad}

    @contextlib.contextmanager
    def _lagged_weights(self):
        """Swap in the trainable weights of ``staleness`` optimizer steps ago (snapshots are
        taken at each generation, on CPU), then restore the current ones."""
        step = int(self.state.global_step)
        params = self._trainable()
        if step not in self._lag_snapshots:
            self._lag_snapshots[step] = {n: p.detach().to("cpu", copy=True) for n, p in params.items()}
        target = max(s for s in self._lag_snapshots if s <= max(step - self.staleness, min(self._lag_snapshots)))
        for s in [s for s in self._lag_snapshots if s < target]:
            del self._lag_snapshots[s]
        self._lag_used = step - target
        if target == step:
            yield
            return
        current = {n: p.detach().to("cpu", copy=True) for n, p in params.items()}
        try:
            with torch.no_grad():
                for n, p in params.items():
                    p.copy_(self._lag_snapshots[target][n].to(p.device))
            yield
        finally:
            with torch.no_grad():
                for n, p in params.items():
                    p.copy_(current[n].to(p.device))

    def _behaviour_logps(self, out: dict) -> torch.Tensor:
        """Per-token log-probs of the completions under the weights in place (the lagged
        ones): the rollouts' behaviour log-probs. TRL's own value is reused when it computed it."""
        if out.get("old_per_token_logps") is not None:
            return out["old_per_token_logps"]
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        att = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
        with torch.no_grad():
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model, ids, att, out["completion_ids"].size(1), batch_size=self.args.per_device_train_batch_size
            )
        return logps
