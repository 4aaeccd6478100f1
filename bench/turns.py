"""Turn taking for variants that share one process: one step at a time, round-robin, each
with its own RNG stream, so background load hits every variant alike and interleaving does not
change what any of them draws. Used by ``python -m bench.throughput --schedule interleaved``
(and, with ``interleaved=False``, only to seed each variant as it starts).
"""

from __future__ import annotations

import random
import threading
from typing import Any

import numpy as np


class Aborted(RuntimeError):
    """Another variant failed; this one stops."""


class Turns:
    """Lets participants run one step at a time, round-robin. A participant holds the turn
    from its ``take()`` (at step begin) until its next ``take()`` or ``done()``, so all its
    work between steps (logging, data loading) is exclusive too. The first round starts when
    every participant has reached its first ``take()`` (their set-up, which touches the global
    RNG, never overlaps a step). Each participant has its own RNG stream: seeded at its first
    turn, saved and restored around every switch, so it draws what it would draw alone. With
    ``interleaved=False`` the participants run one after another (``take`` only seeds)."""

    def __init__(self, names: list[str], seed: int, interleaved: bool, device: str):
        self.order = list(names)
        self.alive = set(names)
        self.turn = 0
        self.holder: str | None = None
        self.interleaved = interleaved
        self.seed = seed
        self.cuda = device == "cuda"
        self.cv = threading.Condition()
        self.error: BaseException | None = None
        self.rng: dict[str, Any] = {}
        self.arrived: set[str] = set()
        self.timeout = 1800.0  # seconds a participant waits for its turn before the run is declared stuck
        self.rss_reset_ok = True

    # RNG streams
    def _save_rng(self, name: str) -> None:

        import torch  # deferred: torch loads only when something is measured (`--help` and the report stay light)

        self.rng[name] = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
                          torch.cuda.get_rng_state_all() if self.cuda else None)

    def _load_rng(self, name: str) -> None:

        import torch  # deferred: torch loads only when something is measured (`--help` and the report stay light)

        state = self.rng.get(name)
        if state is None:  # first turn: seeded as transformers.set_seed does
            random.seed(self.seed)
            np.random.seed(self.seed)
            torch.manual_seed(self.seed)
            if self.cuda:
                torch.cuda.manual_seed_all(self.seed)
            return
        random.setstate(state[0])
        np.random.set_state(state[1])
        torch.set_rng_state(state[2])
        if state[3] is not None:
            torch.cuda.set_rng_state_all(state[3])

    def _advance(self) -> None:
        self.holder = None
        n = len(self.order)
        for k in range(1, n + 1):
            j = (self.turn + k) % n
            if self.order[j] in self.alive:
                self.turn = j
                break
        self.cv.notify_all()

    def take(self, name: str) -> None:
        if not self.interleaved:
            if name not in self.rng:
                self._load_rng(name)
                self.rng[name] = "started"
            return
        with self.cv:
            if self.holder == name:
                self._save_rng(name)
                self._advance()
            if name not in self.arrived:
                self.arrived.add(name)
                self.cv.notify_all()
            if not self.cv.wait_for(lambda: self.error is not None
                                    or (self.arrived >= self.alive and self.order[self.turn] == name), timeout=self.timeout):
                self.error = RuntimeError(f"{name} waited {self.timeout:.0f}s for its turn (holder: {self.holder}); giving up")
                self.cv.notify_all()
                raise self.error
            if self.error is not None:
                raise Aborted(f"{name}: stopped because another variant failed")
            self.holder = name
            self._load_rng(name)

    def done(self, name: str) -> None:
        if not self.interleaved:
            return
        with self.cv:
            if name not in self.alive:
                return
            self.alive.discard(name)
            if self.order[self.turn] == name:
                self._advance()
            self.cv.notify_all()

    def abort(self, error: BaseException) -> None:
        with self.cv:
            if self.error is None:
                self.error = error
            self.cv.notify_all()
