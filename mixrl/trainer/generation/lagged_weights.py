"""``trainer.staleness = k``: generation under the weights of k optimizer steps ago.

Every generation batch is sampled by the weights as they were k optimizer steps earlier: CPU
snapshots of the trainable parameters (one per generation step, owned by :class:`LaggedWeights`)
are swapped in for generation and swapped back; the first k steps use the oldest snapshot, the
initial weights. The rollouts' behaviour log-probs (``old_per_token_logps``) are that lagged
policy's, from a no-grad forward under the same weights (the caller runs it through
:meth:`mixrl.trainer.parts.forwards.Forwards.behaviour_logps` inside :meth:`LaggedWeights.swapped_in`).
Deterministic; one machine.

Owns: the snapshots (per process: each process keeps its own, and a checkpoint carries one
file per process). Receives per call: the trainable parameters as they are now and the step.
Returns: the lag actually used (the caller logs it as ``staleness``).
:func:`trainable` and :func:`swapped` are shared with asynchronous generation.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn


def trainable(model: nn.Module) -> dict[str, torch.Tensor]:
    """The parameters of an (unwrapped) model that train: what a snapshot copies."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def cpu_copy(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A CPU copy of ``params`` (a snapshot)."""
    return {n: p.detach().to("cpu", copy=True) for n, p in params.items()}


@contextlib.contextmanager
def swapped(params: dict[str, torch.Tensor], snapshot: dict[str, torch.Tensor]):
    """``snapshot``'s values copied into ``params`` for the block, the current ones restored after."""
    current = cpu_copy(params)
    try:
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(snapshot[n].to(p.device))
        yield
    finally:
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(current[n].to(p.device))


class LaggedWeights:
    """The weights of ``k`` optimizer steps ago, swapped in for generation (``trainer.staleness``)."""

    def __init__(self, k: int):
        self.k = int(k)
        self.snapshots: dict[int, dict[str, torch.Tensor]] = {}  # step -> CPU copy of the trainable weights

    @contextlib.contextmanager
    def swapped_in(self, params: dict[str, torch.Tensor], step: int):
        """Swap in the trainable weights of ``k`` optimizer steps ago (a snapshot of ``params``
        is taken at each generation step, on CPU), then restore the current ones. Yields the
        lag used (``step`` minus the snapshot's step)."""
        step = int(step)
        if step not in self.snapshots:
            self.snapshots[step] = cpu_copy(params)
        target = max(s for s in self.snapshots if s <= max(step - self.k, min(self.snapshots)))
        for s in [s for s in self.snapshots if s < target]:
            del self.snapshots[s]
        if target == step:
            yield 0
            return
        with swapped(params, self.snapshots[target]):
            yield step - target

    # ------------------------------------------------------------------ checkpoints (per process)
    def state_dict(self) -> dict:
        return {"lag_snapshots": {int(k): v for k, v in self.snapshots.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.snapshots = {int(k): v for k, v in state["lag_snapshots"].items()}
