"""The replay buffer: a bounded store of past rollouts with an eviction policy and seeded,
weighted sampling (pure Python; :mod:`mixrl.sources.replay` fills it, :mod:`mixrl.sources.replay_inject`
draws from it)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from mixrl.errors import ConfigError

EVICTIONS = ("fifo", "keep_successes", "age")
SAMPLINGS = ("uniform", "recent", "variance", "failure")
STORES = ("all", "successes")
_EPS = 1e-3


@dataclass
class Entry:
    """One stored rollout."""

    prompt: list[int]
    completion: list[int]
    logp: list[float]  # behaviour log-prob of each completion token
    reward: float
    advantage: float
    group_mean: float
    group_std: float
    step: int
    uid: int = 0  # insertion order (ties, FIFO)


@dataclass
class ReplayBuffer:
    """A bounded store of rollouts with eviction and seeded, weighted sampling (pure Python)."""

    capacity: int = 1024
    eviction: str = "fifo"
    max_age: int | None = None
    store: str = "all"
    success_threshold: float = 1.0
    sampling: str = "uniform"
    seed: int = 0
    entries: list[Entry] = field(default_factory=list)
    added: int = 0  # entries ever added (the next uid)

    def __post_init__(self):
        if self.capacity < 1:
            raise ConfigError(f"offpolicy.source.capacity must be >= 1, got {self.capacity}")
        for key, value, allowed in (("eviction", self.eviction, EVICTIONS), ("sampling", self.sampling, SAMPLINGS),
                                    ("store", self.store, STORES)):
            if value not in allowed:
                raise ConfigError(f"offpolicy.source.{key}={value!r} is not one of {', '.join(allowed)}")
        if self.eviction == "age" and (self.max_age is None or self.max_age < 0):
            raise ConfigError("offpolicy.source.eviction=age needs offpolicy.source.max_age (steps, >= 0)")
        self.rng = random.Random(self.seed)

    # ------------------------------------------------------------------ contents
    def __len__(self) -> int:
        return len(self.entries)

    def is_success(self, e: Entry) -> bool:
        return e.reward >= self.success_threshold

    def add(self, entry: Entry) -> bool:
        """Store ``entry`` (False when ``store`` rejects it), evicting per policy when full."""
        if self.store == "successes" and not self.is_success(entry):
            return False
        entry.uid = self.added
        self.added += 1
        self.entries.append(entry)
        while len(self.entries) > self.capacity:
            self.entries.pop(self._victim())
        return True

    def _victim(self) -> int:
        """Index of the entry to evict when over capacity."""
        if self.eviction == "keep_successes":
            failures = [i for i, e in enumerate(self.entries) if not self.is_success(e)]
            if failures:
                return min(failures, key=lambda i: self.entries[i].uid)
        return min(range(len(self.entries)), key=lambda i: self.entries[i].uid)

    def expire(self, step: int) -> int:
        """Drop entries older than ``max_age`` steps (eviction ``age``); returns how many."""
        if self.eviction != "age":
            return 0
        n = len(self.entries)
        self.entries = [e for e in self.entries if step - e.step <= self.max_age]
        return n - len(self.entries)

    # ------------------------------------------------------------------ sampling
    def weight(self, e: Entry) -> float:
        if self.sampling == "variance":
            return e.group_std + _EPS
        if self.sampling == "failure":
            return max(1.0 - e.group_mean, 0.0) + _EPS
        return 1.0

    def sample(self, n: int, candidates: Sequence[Entry] | None = None) -> list[Entry]:
        """Up to ``n`` distinct entries (of ``candidates``, default all) drawn with the
        buffer's generator: ``recent`` takes the newest, the others draw without
        replacement with probability proportional to their weight."""
        pool = list(self.entries if candidates is None else candidates)
        n = min(n, len(pool))
        if n <= 0:
            return []
        if self.sampling == "recent":
            pool.sort(key=lambda e: -e.uid)
            return pool[:n]
        if self.sampling == "uniform":
            return self.rng.sample(pool, n)
        # weighted without replacement (Efraimidis-Spirakis keys u^(1/w))
        keyed = [(self.rng.random() ** (1.0 / self.weight(e)), i) for i, e in enumerate(pool)]
        keyed.sort(reverse=True)
        return [pool[i] for _, i in keyed[:n]]

    def for_prompt(self, prompt: Sequence[int]) -> list[Entry]:
        key = list(prompt)
        return [e for e in self.entries if e.prompt == key]

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        return {"entries": [asdict(e) for e in self.entries], "added": self.added, "rng": _rng_state(self.rng)}

    def load_state_dict(self, state: dict) -> None:
        self.entries = [Entry(**e) for e in state["entries"]]
        self.added = int(state["added"])
        self.rng.setstate(_rng_from(state["rng"]))


def _rng_state(rng: random.Random) -> list:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _rng_from(state: list) -> tuple:
    version, internal, gauss = state
    return (int(version), tuple(int(x) for x in internal), gauss)
