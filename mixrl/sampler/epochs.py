"""The ``epochs`` picker: the data in shuffled epochs, mastered prompts left out from the next epoch on.

ExGRPO ("ExGRPO: Learning to Reason from Experience", arXiv 2510.02245), as its code runs
(ElliottYan/LUFFY ExGRPO/ at 01f4ae066249e6965ce0d5512ccdf99a12895c74, exgrpo/verl/verl/mix_src/):

* every step, a question whose whole group of rollouts is correct joins the skip set, from the first
  step on (mix_trainer_experience.py:381-388; replay does not need to be on);
* at the start of each epoch, when the current training set holds more than ``train_batch_size + 20``
  questions (``BATCH_TOLERANCE``), the training set becomes every question not in the skip set
  (mix_trainer_experience.py:245-250, rl_dataset_with_experience.py:40-45); the epoch is a shuffled
  pass over it in batches, the last partial batch dropped (``drop_last=True``, :258-262).

:class:`EpochOrder` keeps the epoch's order and position and the mastered prompts (a checkpoint carries
them); the epoch's permutation is drawn from ``numpy.random.default_rng([seed, epoch])``. A prompt is
mastered when every rollout of one of its generated groups is correct (the primary reward >= 1), as
the sampler scores the round: for a prompt ExGRPO revisits, the group's last rollout as generated,
where the authors count the stored success that replaces it.
"""

from __future__ import annotations

import numpy as np


class EpochOrder:
    """The epoch state of the ``epochs`` picker (see the module docstring)."""

    def __init__(self):
        self.epoch = -1
        self.order: list[int] = []  # this epoch's prompts, in order
        self.pos = 0
        self.valid: list[int] | None = None  # the training set of this epoch (indices)
        self.mastered: set[int] = set()

    def note(self, index: int, correct: list[bool]) -> None:
        """One generated group of prompt ``index``: mastered when every rollout is correct."""
        if correct and all(correct):
            self.mastered.add(int(index))

    def next(self, size: int, n: int, seed: int, *, drop_mastered: bool, tolerance: int) -> list[int]:
        """The next ``n`` prompts (fewer only when the training set holds fewer than ``n``)."""
        if self.valid is None or self.pos + n > len(self.order):
            self._new_epoch(size, n, seed, drop_mastered, tolerance)
        chosen = self.order[self.pos:self.pos + n]
        self.pos += len(chosen)
        return chosen

    def _new_epoch(self, size: int, n: int, seed: int, drop_mastered: bool, tolerance: int) -> None:
        if self.valid is None or len(self.valid) > size:
            self.valid = list(range(size))
        if drop_mastered and len(self.valid) > n + tolerance:
            kept = [i for i in range(size) if i not in self.mastered]
            self.valid = kept if len(kept) >= n else self.valid  # never fewer than one batch
        self.epoch += 1
        rng = np.random.default_rng([int(seed), self.epoch])
        self.order = [self.valid[int(i)] for i in rng.permutation(len(self.valid))]
        self.pos = 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "order": list(self.order), "pos": self.pos,
                "valid": None if self.valid is None else list(self.valid), "mastered": sorted(self.mastered)}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
        self.order = [int(i) for i in state["order"]]
        self.valid = None if state["valid"] is None else [int(i) for i in state["valid"]]
        self.mastered = {int(i) for i in state["mastered"]}
