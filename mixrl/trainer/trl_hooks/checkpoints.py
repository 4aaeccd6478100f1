"""What a checkpoint carries besides TRL's own files, and the two hooks' work.

Owns :class:`RunProgress` (the run's counters) and :class:`BufferedBatch` (TRL's buffered
generation batch), the two ``Stateful`` pieces of TRL glue that read the trainer, and
:func:`checkpointed`, the ``{name: Stateful}`` a checkpoint carries (with the parts that are on).
Receives the trainer from ``MixrlGRPOTrainer._save_checkpoint`` / ``_load_optimizer_and_scheduler``
(:func:`save`, :func:`load`); the files themselves are written and read by
:mod:`mixrl.trainer.state.checkpoint_state`.
"""

from __future__ import annotations

import os

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from mixrl.trainer.state import checkpoint_state


class RunProgress:
    """The run's counters as a checkpoint carries them (``Stateful``; TRL glue, so it reads the
    trainer): rollouts and tokens generated, TRL's micro-batch counter ``_step`` (the
    injections' seeded draws read it, and TRL decides from it when to generate; it is not in
    TRL's checkpoint), and the run's config."""

    def __init__(self, trainer):
        self.trainer = trainer

    def state_dict(self) -> dict:
        t = self.trainer
        return {"rollouts": int(t.mixrl_rollouts), "generated_tokens": int(t.mixrl_generated_tokens),
                "micro_step": int(t.micro_step_at_checkpoint()),
                # the config this checkpoint was trained under (mixrl train's spec.config): a resume whose
                # config.yaml was edited since is refused (mixrl.trainer.state.resume.check_trained_config)
                **({"config": t.spec.config} if t.spec.config is not None else {})}

    def load_state_dict(self, state: dict) -> None:
        t = self.trainer  # the counters themselves are restored before training (MixrlGRPOTrainer.restore_counters)
        t._step = int(state.get("micro_step", int(t.state.global_step) * int(t.args.gradient_accumulation_steps)))


class BufferedBatch:
    """TRL's buffered generation batch and its normalisers, when a checkpoint falls between two
    generations (``num_iterations > 1``): per process (``Stateful``; TRL glue)."""

    def __init__(self, trainer):
        self.trainer = trainer

    def state_dict(self) -> dict:
        t = self.trainer
        generate_every = t.args.steps_per_generation * t.num_iterations
        if t.micro_step_at_checkpoint() % generate_every and t._buffered_inputs is not None:
            return {"buffered_inputs": t._buffered_inputs,
                    "normalisers": {k: list(v) for k, v in (t.batch_in_flight.normalisers or {}).items()}}
        return {}

    def load_state_dict(self, state: dict) -> None:
        t = self.trainer
        device = t.accelerator.device
        t._buffered_inputs = [{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in b.items()}
                              for b in state["buffered_inputs"]]
        t.batch_in_flight.normalisers = {k: tuple(v) for k, v in state["normalisers"].items()}


def checkpointed(t) -> dict:
    """``{name: Stateful}`` a checkpoint carries: the parts that are on, the run's counters
    (``progress``) and TRL's buffered generation batch (``buffer``)."""
    return {"progress": RunProgress(t), "buffer": BufferedBatch(t), **t.parts.on()}


def save(t, trial) -> None:
    """mixrl's files into the checkpoint folder of step ``global_step``, before TRL writes its own
    (so a checkpoint that looks complete, ``trainer_state.json`` being written last, has them even
    when the run is killed right after it)."""
    folder = os.path.join(t._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{t.state.global_step}")
    checkpoint_state.save(folder, checkpointed(t), rank=t.accelerator.process_index,
                          should_save=t.args.should_save)


def load(t, checkpoint) -> None:
    """mixrl's files of ``checkpoint`` back into the trainer and its parts (after TRL loaded its own)."""
    checkpoint_state.load(checkpoint, checkpointed(t), rank=t.accelerator.process_index,
                          step=int(t.state.global_step), device=t.accelerator.device)


def micro_step_at_checkpoint(step_begin: tuple[int, int], global_step: int, micro_step: int) -> int:
    """TRL's micro-batch counter ``_step`` as of the end of optimizer step ``global_step``, given
    ``step_begin`` = (global_step, ``_step``) when the running optimizer step began and ``_step`` now
    (``micro_step``). A checkpoint written inside the next step (the divergence guard saves before
    the optimizer step) gives the value at that step's start."""
    step, begin = step_begin
    return begin if step == int(global_step) else int(micro_step)
