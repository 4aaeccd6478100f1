"""The sampler a run uses: its picker, group filter, row filters and per-prompt history.

:class:`Sampler` is what the trainer (:mod:`mixrl.trainer.parts.sampler_rounds`) asks, in order, each
generation batch:

1. :meth:`Sampler.pick`: the batch's prompts (None: the data loader's own, ``pick: data``);
2. after each generation round, :meth:`Sampler.observe` (update every generated prompt's history)
   and :meth:`Sampler.keep_groups` (the group filter);
3. :meth:`Sampler.assemble`: which generated groups fill the step: the kept groups in the order
   they were generated, cut to the step's size; when ``max_rounds`` rounds did not give enough,
   the step is topped up with dropped groups (the trainer sets their advantages to 0, so they keep
   the batch's shape and add no gradient) and ``short`` counts them;
4. :meth:`Sampler.row_keep`: the row filters' mask of the assembled batch.

Its draws come from ``numpy.random.Generator(seed, draws)``, ``draws`` counting every draw, so
the choice depends only on the seed, the history and the counter, all of which
:meth:`state_dict` carries: a resumed run chooses exactly what the uninterrupted one would.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mixrl.sampler.epochs import EpochOrder
from mixrl.sampler.group_filters import GROUP_FILTERS
from mixrl.sampler.pickers import PICKERS, arm_of, group_abs_advantage, td_update
from mixrl.sampler.row_filters import ROW_FILTERS
from mixrl.sampler.state import PromptState


def _split(spec: dict | None, default: str) -> tuple[str, dict]:
    spec = dict(spec or {"name": default})
    return str(spec.pop("name", default)), spec


class Sampler:
    """One run's sampler (see the module docstring). ``pick``, ``keep`` and each of ``rows``
    are component specs ``{name, params...}``; ``max_rounds`` caps the generation rounds of one
    batch (1: no oversampling); ``arms``: a label per training prompt for the bandit (None: its
    accuracy buckets)."""

    def __init__(self, *, pick: dict | None = None, keep: dict | None = None, rows: dict | None = None,
                 max_rounds: int = 1, decay: float = 1.0, seed: int = 0, arms: list | None = None,
                 hard_below: float = 0.2):
        self.pick_name, self.pick_params = _split(pick, "data")
        self.keep_name, self.keep_params = _split(keep, "all")
        self.rows = [_split(spec, "") for spec in (rows or {}).values()]
        self.max_rounds = int(max_rounds)
        if self.max_rounds < 1:
            raise ValueError("max_rounds must be >= 1")
        self.seed = int(seed)
        self.arms = arms
        self.hard_below = float(hard_below)
        self.state = PromptState(decay=decay)
        self.values: dict[str, float] = {}  # bandit arm -> value
        self.draws = 0
        self.epochs = EpochOrder()  # the epochs picker's epoch and mastered prompts
        # counters: rollouts generated / trained, generation rounds, batches, missing groups
        self.generated = self.trained = self.rounds = self.batches = self.short = 0

    # ------------------------------------------------------------------ choice
    @property
    def picks(self) -> bool:
        return self.pick_name != "data"

    def rng(self) -> np.random.Generator:
        """A generator for the next draw: seeded by (seed, draws), then ``draws`` advances."""
        g = np.random.default_rng([self.seed, self.draws])
        self.draws += 1
        return g

    def pick(self, size: int, n: int) -> list[int] | None:
        """``n`` distinct prompt indices out of ``size`` (None: the data loader's)."""
        if not self.picks:
            return None
        fn = PICKERS.get(self.pick_name)
        if self.pick_name == "epochs":  # its epoch lives here (mixrl.sampler.epochs)
            return self.epochs.next(size, min(n, size), self.seed, drop_mastered=bool(self.pick_params.get("drop_mastered", True)),
                                    tolerance=int(self.pick_params.get("tolerance", 20)))
        return fn(self.state, size, min(n, size), self.rng(), self.arms, self.values, **self.pick_params)

    def draw_uniform(self, size: int, n: int) -> list[int]:
        """``n`` distinct indices uniformly (the extra rounds of ``pick: data``)."""
        return [int(i) for i in self.rng().permutation(size)[: min(n, size)]]

    # ------------------------------------------------------------------ groups
    def keep_groups(self, rewards: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
        """The group filter's keep mask of one round, ``[groups]``."""
        return GROUP_FILTERS.get(self.keep_name)(rewards, correct, **self.keep_params)

    def is_hard(self, index: int) -> bool:
        """Seen at least once and its accuracy estimate below ``hard_below``."""
        return self.state.seen(index) > 0 and self.state.accuracy(index) < self.hard_below

    def observe(self, indices: list[int | None], rewards: torch.Tensor, correct: torch.Tensor, step: int,
                free: torch.Tensor | None = None) -> None:
        """Update the history of each generated group's prompt (``None``: a prompt outside the
        training set, skipped) with its unguided rollouts (``free`` ``[groups, G]``; None: all; a
        group without one is not counted), and the bandit's arm values with the groups' mean
        |advantage| (all rollouts)."""
        gains: dict[str, list[float]] = {}
        buckets = int(self.pick_params.get("buckets", 4))
        for i, idx in enumerate(indices):
            if idx is None:
                continue
            r = [float(x) for x in rewards[i].tolist()]
            if self.pick_name == "bandit":  # the arm it was drawn from: before this update
                gains.setdefault(arm_of(self.state, idx, buckets, self.arms), []).append(group_abs_advantage(r))
            if self.pick_name == "epochs":
                self.epochs.note(idx, [bool(c) for c in correct[i].tolist()])
            own = free[i].tolist() if free is not None else [True] * len(r)
            if any(own):
                self.state.update(idx, [x for x, o in zip(r, own) if o],
                                  [bool(c) for c, o in zip(correct[i].tolist(), own) if o], step)
        if gains:
            td_update(self.values, gains, float(self.pick_params.get("lr", 0.5)))

    def assemble(self, keeps: list[torch.Tensor], n_groups: int) -> list[tuple[int, int]]:
        """``(round, group)`` of each group of the step, in order: the kept groups as generated,
        then (when too few were kept) dropped groups, oldest first. Updates the counters."""
        kept = [(r, int(g)) for r, k in enumerate(keeps) for g in torch.nonzero(k).flatten().tolist()]
        dropped = [(r, int(g)) for r, k in enumerate(keeps) for g in torch.nonzero(~k).flatten().tolist()]
        chosen = kept[:n_groups]
        self.short += max(0, n_groups - len(chosen))
        chosen += dropped[: n_groups - len(chosen)]
        self.rounds += len(keeps)
        self.batches += 1
        return chosen

    def wants_more(self, keeps: list[torch.Tensor], n_groups: int) -> bool:
        """Another round? Fewer than ``n_groups`` kept so far and rounds left."""
        return len(keeps) < self.max_rounds and sum(int(k.sum()) for k in keeps) < n_groups

    def row_keep(self, rewards: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor | None:
        """The row filters' keep mask ``[groups, G]`` (None: no row filter)."""
        mask = None
        for name, params in self.rows:
            m = ROW_FILTERS.get(name)(rewards, advantages, **params)
            mask = m if mask is None else mask & m
        return mask

    # ------------------------------------------------------------------ report
    def metrics(self) -> dict[str, float]:
        return {"sampler/generated_per_trained": self.generated / self.trained if self.trained else float("nan"),
                "sampler/rounds_per_batch": self.rounds / self.batches if self.batches else float("nan"),
                "sampler/prompts_tracked": float(len(self.state))}

    def summary(self) -> str:
        """One line: the rollouts generated and trained, and the extra ones paid."""
        extra = self.generated - self.trained
        ratio = self.generated / self.trained if self.trained else float("nan")
        line = (f"sampler: {self.generated} rollouts generated for {self.trained} trained "
                f"({extra} extra, {ratio:.2f} generated per trained, {self.rounds / max(self.batches, 1):.2f} rounds per batch)")
        if self.short:
            line += f"; {self.short} group(s) short of informative after max_rounds"
        return line

    def state_dict(self) -> dict[str, Any]:
        return {"state": self.state.state_dict(), "values": dict(self.values), "draws": self.draws,
                "counters": [self.generated, self.trained, self.rounds, self.batches, self.short],
                "epochs": self.epochs.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.state.load_state_dict(state["state"])
        self.values = {str(k): float(v) for k, v in state["values"].items()}
        self.draws = int(state["draws"])
        self.generated, self.trained, self.rounds, self.batches, self.short = (int(x) for x in state["counters"])
        if "epochs" in state:
            self.epochs.load_state_dict(state["epochs"])
