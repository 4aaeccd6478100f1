"""What the trainer's TRL hooks hand one another: :class:`BatchInFlight` and :class:`StepTally`.

TRL calls the trainer's overrides one after another (``_generate_and_score_completions`` calls
``_generate_single_turn`` and ``_calculate_rewards``; ``training_step`` calls ``_compute_loss``), and
their signatures are TRL's: what one hook produces for a later one cannot travel as an argument.
It travels in one of these two objects, held by the trainer (``trainer.batch_in_flight``,
``trainer.step_tally``), written and read only by the trainer's hooks
(:mod:`mixrl.trainer.grpo`, :mod:`mixrl.trainer.trl_hooks`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mixrl.sources.base import Rollouts


@dataclass
class BatchInFlight:
    """The generation batch being built, and the latest one's normalisers.

    ``rows``: the batch's rows while TRL generates it (the gen stage; None outside it), read by the
    injections around TRL's single-turn generation and by an environment's episodes.
    ``rollouts``: the rows' provenance, recorded by the single-turn generation (or an environment's
    episodes, or the sampler's chosen round), read by the scoring stages and TRL's tool loop.
    ``rewards_per_func``: TRL's reward matrix, gathered over processes ``[N_global, F]``
    (``_calculate_rewards``), read by the scoring stages.
    ``normalisers``: every term's global token/row counts of the latest generation batch, read by
    the loss at each of its micro-steps and checkpointed with TRL's buffered batch.
    """

    rows: list[dict] | None = None
    rollouts: Rollouts | None = None
    rewards_per_func: torch.Tensor | None = None
    normalisers: dict[str, tuple[float, float, float]] | None = None


@dataclass
class StepTally:
    """The running optimizer step.

    ``begin``: (global_step, TRL's ``_step``) when it began (a checkpoint's micro-step).
    ``tokens``: its loss forwards' (real tokens, forward tokens); ``seconds``: (in ``training_step``,
    in generation); both logged and reset after its last micro-step.
    ``chunk``: (index, count) of the token-budget micro-batch in flight (None: no budget step running).
    """

    begin: tuple[int, int] = (-1, 0)
    tokens: list[int] = field(default_factory=lambda: [0, 0])
    seconds: list[float] = field(default_factory=lambda: [0.0, 0.0])
    chunk: tuple[int, int] | None = None
