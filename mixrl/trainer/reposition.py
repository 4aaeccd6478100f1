"""SFPO's reposition-before-update (``algo.reposition``): fast steps on a generation batch, a pull
back toward the weights that generated it, then the slow step.

With ``trainer.num_iterations = K + 1`` TRL takes K + 1 optimizer steps on each generation batch.
:class:`Reposition` keeps the trainable weights ``theta_0`` the batch started from (the policy
that generated it); the first K steps are SFPO's fast trajectory (plain optimizer steps, ending at
``theta_K``); before the last one the weights become ``theta_0 + alpha (theta_K - theta_0)``
(the reposition), and the last step, from there, is the slow correction. ``alpha = 1`` is TRL's
plain multi-epoch update; ``alpha = 0`` throws the fast steps away. With ``num_iterations = 1``
there are no fast steps and nothing to do (plain GRPO; ``mixrl check`` says so).

Paper: "Slow-Fast Policy Optimization: Reposition-Before-Update for LLM Reasoning" (Wang et al.
2025, arXiv 2510.04072). Not here: the paper's entropy-based schedule that switches the
reposition off late in training; the authors' code (slow-fast-po.github.io) was not read.

Owns: the snapshot of ``theta_0`` (per process, in the parameters' own device and dtype; not
checkpointed: a run resumed inside a batch's steps skips that batch's reposition). Receives at
construction alpha and the cycle length (``num_iterations``); per call: the model and the step.
"""

from __future__ import annotations

import torch


class Reposition:
    """``theta_0`` at each batch's first step; ``theta_0 + alpha (theta - theta_0)`` before its last."""

    def __init__(self, *, alpha: float, cycle: int):
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"reposition: alpha must be in [0, 1], got {alpha}")
        self.alpha, self.cycle = float(alpha), int(cycle)
        self.start: list[torch.Tensor] | None = None
        self.last_shift = 0.0  # the norm of theta_K - theta_0 at the last reposition

    @staticmethod
    def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
        return [p for p in model.parameters() if p.requires_grad]

    def step_begin(self, model: torch.nn.Module, step: int) -> bool:
        """Before optimizer step ``step`` (0-based): snapshot at a batch's first step, reposition
        before its last. Returns whether the weights were moved."""
        if self.cycle < 2:
            return False
        phase = step % self.cycle
        params = self.trainable(model)
        if phase == 0:
            self.start = [p.detach().clone() for p in params]
            return False
        if phase != self.cycle - 1 or self.start is None or len(self.start) != len(params):
            return False
        with torch.no_grad():
            shift = 0.0
            for p, p0 in zip(params, self.start):
                delta = p - p0
                shift += float(delta.float().pow(2).sum())
                p.copy_(p0 + self.alpha * delta)
        self.last_shift = shift ** 0.5
        self.start = None
        return True


def add_reposition(trainer, cfg) -> None:
    """Add SFPO's reposition to ``trainer`` when ``algo.reposition`` is set (a TrainerCallback:
    ``on_step_begin`` runs before each optimizer step's first micro-batch)."""
    spec = cfg.algo.get("reposition")
    if spec is None:
        return
    from transformers import TrainerCallback  # deferred: transformers is heavy; `mixrl plan` imports build without it

    part = Reposition(alpha=float(spec.get("alpha", 0.8)), cycle=int(cfg.trainer.num_iterations))

    class RepositionCallback(TrainerCallback):
        reposition = part

        def on_step_begin(self, args, state, control, model=None, **kwargs):
            if model is not None:
                part.step_begin(model, int(state.global_step))

    trainer.add_callback(RepositionCallback())
