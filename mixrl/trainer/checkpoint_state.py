"""What a checkpoint carries beyond TRL's own files, so that a resumed run continues exactly.

Written into the checkpoint folder *before* TRL writes its own (``trainer_state.json`` is
written last, so a checkpoint that looks complete has them even when the run is killed right
after it): the rollout counters and TRL's micro-batch counter ``_step`` (the injections' seeded
draws read it, and TRL decides from it when to generate; :mod:`mixrl.trainer.resume`), the
controller's and the injections' state (``STATE_FILE``; an injection with ``state_in_file``,
e.g. a replay buffer, in a ``torch.save`` file of its own per process), and per process
(``GENERATION_FILE``) the lagged weight snapshots of ``staleness`` and, when a checkpoint falls
inside a generation batch (``num_iterations > 1``), TRL's buffered batch and its token counts.

This mixin of :class:`mixrl.trainer.grpo.MixrlGRPOTrainer` writes and reads them; the trainer's
``_save_checkpoint`` and ``_load_optimizer_and_scheduler`` hooks call it.
"""

from __future__ import annotations

import json
import os

import torch

from mixrl.errors import ConfigError
from mixrl.trainer.resume import load_micro_step, save_run_state

STATE_FILE = "mixrl_state.json"
GENERATION_FILE = "mixrl_generation_rank{rank}.pt"  # per process: lag snapshots, a buffered generation batch


class CheckpointState:
    """mixrl's checkpoint files (mixin; reads the trainer's ``args``, ``state``, ``accelerator``,
    ``controller``, ``injections``, ``staleness``, ``_step``, ``_mixrl_step_begin``,
    ``_lag_snapshots``, ``_buffered_inputs`` and ``_mixrl_normalisers``)."""

    def _save_mixrl_state(self, folder: str) -> None:
        """mixrl's files into the checkpoint ``folder``: the generation state (every process its
        own), the run state and ``STATE_FILE`` (the saving process), the injections' own files
        (every process its own)."""
        generation = self._generation_state()
        if generation:  # every process saves its own
            os.makedirs(folder, exist_ok=True)
            torch.save(generation, os.path.join(folder, GENERATION_FILE.format(rank=self.accelerator.process_index)))
        if self.args.should_save:
            os.makedirs(folder, exist_ok=True)
            save_run_state(self, folder)
            if self.controller is not None or self.injections:
                state = {
                    "controller": self.controller.state_dict() if self.controller is not None else None,
                    "injections": [{"state_file": f"mixrl_injection{i}"} if inj.state_in_file else inj.state_dict()
                                   for i, inj in enumerate(self.injections)],
                }
                with open(os.path.join(folder, STATE_FILE), "w") as f:
                    json.dump(state, f)
        if any(inj.state_in_file for inj in self.injections):  # every process saves its own (its buffer)
            os.makedirs(folder, exist_ok=True)
            rank = self.accelerator.process_index
            for i, inj in enumerate(self.injections):
                if inj.state_in_file:
                    torch.save(inj.state_dict(), os.path.join(folder, f"mixrl_injection{i}_rank{rank}.pt"))

    def micro_step_at_checkpoint(self) -> int:
        """TRL's micro-batch counter ``_step`` as of the end of optimizer step ``global_step``
        (what a run resumed from a checkpoint of this step must continue from). A checkpoint
        written inside the next step (the divergence guard saves before the optimizer step)
        gives the value at that step's start."""
        step, begin = self._mixrl_step_begin
        return begin if step == int(self.state.global_step) else int(self._step)

    def _generation_state(self) -> dict:
        """This process's generation state that a checkpoint must carry (empty: none): the
        lagged weight snapshots (``staleness``), and TRL's buffered generation batch with its
        token counts when the checkpoint falls between two generations (``num_iterations > 1``)."""
        state: dict = {}
        if self.staleness > 0:
            state["lag_snapshots"] = {int(k): v for k, v in self._lag_snapshots.items()}
        generate_every = self.args.steps_per_generation * self.num_iterations
        if self.micro_step_at_checkpoint() % generate_every and self._buffered_inputs is not None:
            state["buffered_inputs"] = self._buffered_inputs
            state["normalisers"] = {k: list(v) for k, v in (self._mixrl_normalisers or {}).items()}
        return state

    def _load_generation_state(self, checkpoint: str) -> None:
        path = os.path.join(checkpoint, GENERATION_FILE.format(rank=self.accelerator.process_index))
        if not os.path.exists(path):
            if self.staleness > 0 and int(self.state.global_step) > 0:
                raise ConfigError(f"resume: {path} is missing (the lagged weights of trainer.staleness); resume with the "
                                  "same hardware.num_processes, or start a new run")
            return
        state = torch.load(path, weights_only=True, map_location="cpu")
        if "lag_snapshots" in state:
            self._lag_snapshots = {int(k): v for k, v in state["lag_snapshots"].items()}
        if "buffered_inputs" in state:
            device = self.accelerator.device
            self._buffered_inputs = [{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in b.items()}
                                     for b in state["buffered_inputs"]]
            self._mixrl_normalisers = {k: tuple(v) for k, v in state["normalisers"].items()}

    def _load_mixrl_state(self, checkpoint) -> None:
        """Restore what :meth:`_save_mixrl_state` wrote (after TRL restored its optimizer and
        scheduler): ``_step``, the generation state, the controller's and injections' state."""
        if checkpoint:
            self._step = load_micro_step(checkpoint, default=int(self.state.global_step) * int(self.args.gradient_accumulation_steps))
            self._load_generation_state(checkpoint)
        path = os.path.join(checkpoint, STATE_FILE) if checkpoint else None
        if path and os.path.exists(path):
            with open(path) as f:
                state = json.load(f)
            if self.controller is not None and state.get("controller") is not None:
                self.controller.load_state_dict(state["controller"])
            for inj, s in zip(self.injections, state.get("injections") or []):
                if isinstance(s, dict) and "state_file" in s:
                    path = os.path.join(checkpoint, f"{s['state_file']}_rank{self.accelerator.process_index}.pt")
                    if not os.path.exists(path):
                        raise ConfigError(
                            f"resume: {path} is missing (the checkpoint was saved by fewer processes); resume with "
                            "the same hardware.num_processes")
                    s = torch.load(path, weights_only=True)
                inj.load_state_dict(s)
