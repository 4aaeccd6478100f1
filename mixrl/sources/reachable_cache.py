"""BEPA's reachable trajectories and their per-task cache, for a stateful environment's episodes
(``algo.episode.name=reachable``).

"From Off-Policy to On-Policy: Enhancing GUI Agents via Bi-level Expert-to-Policy Assimilation"
(BEPA, arXiv 2601.05787). The authors' repository (LEON-gittech/Verl_GUI @
b90fd773992337db96505cba64c3162b094eceb3) holds only its README (no code yet), so this follows
the paper's abstract and that README:

* LEVEL-1, self-rolled execution: the expert trajectory is abstracted into a compact plan and the
  policy acts in the environment conditioned on it; the episodes that succeed are *reachable*
  trajectories (the policy's own actions, close to its manifold), the failures are dropped.
* LEVEL-2, self-aligned assimilation: a per-task cache of reachable trajectories; a cached one is
  injected into a GRPO group only when every rollout of the group failed ("total on-policy
  failure"), and the cache is refreshed with the policy's own successful episodes.

Here, per group of G episodes of one task (key: the prompt) after the policy's rollouts::

    any episode solved   -> cache[task] = the group's last solved episode        (LEVEL-2 refresh)
    none solved          -> entry = cache[task], or if absent: up to `attempts` plan-conditioned
                            episodes of the policy (the plan appended to the prompt), the first
                            solved one cached (LEVEL-1);
                            entry found -> it replaces the group's last row           (injection)

An injected row is trained under the task's plain prompt (not the plan's); its policy turns carry
provenance ``reachable`` (behaviour policy: the old log-prob is recomputed under the row's prompt,
as a rollout's, and the row counts in its group's statistics), so with a term that names
``reachable`` it is one more member of the group, with the group's advantage.

Ours, not the paper's: LEVEL-1 runs on demand at a task's first total failure, with the policy
as it is then (the paper rolls the base policy out beforehand); the cache keeps one trajectory
per task (the latest); each process keeps its own cache (of the tasks it generated), and a process
whose rows are not whole groups injects nothing.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, Sequence


@dataclass
class CachedEpisode:
    """One reachable trajectory: what an injected row needs (see :class:`mixrl.envs.episodes.Episode`)."""

    completion_ids: list[int]
    env_mask: list[int]
    injected: list[int]
    logprobs: list[float] | None
    rewards: list[float]
    matched: list[bool]

    @property
    def episode_return(self) -> float:
        return float(sum(self.rewards))

    @classmethod
    def of(cls, ep) -> "CachedEpisode":
        return cls(list(ep.completion_ids), list(ep.env_mask), list(ep.injected),
                   None if ep.logprobs is None else list(ep.logprobs), list(ep.rewards), list(ep.matched))


@dataclass
class ReachableCache:
    """Per task (the prompt's key), the latest reachable trajectory; counters for the metrics."""

    entries: dict[str, CachedEpisode] = field(default_factory=dict)
    refreshed: int = 0
    self_rolled: int = 0
    injected: int = 0

    def put(self, key: str, ep) -> None:
        self.entries[key] = CachedEpisode.of(ep)

    def get(self, key: str) -> CachedEpisode | None:
        return self.entries.get(key)


def assimilate(keys: Sequence[str], episodes: list, solved: Sequence[bool], group_size: int, cache: ReachableCache,
               self_roll: Callable[[list[int]], list[tuple[object, bool]]] | None = None) -> list[bool]:
    """BEPA's LEVEL-2 step over one batch (see the module): refresh the cache from the solved
    groups, fill each totally failed group's last row from the cache (after LEVEL-1's
    ``self_roll(rows)`` for the failed tasks not cached: one (episode, solved) per row asked).
    ``episodes`` is changed in place; returns, per row, whether it was injected."""
    n = len(episodes)
    injected = [False] * n
    if n % group_size:  # this process holds part of a group (several processes): no group to judge here
        return injected
    failed = []
    for g in range(0, n, group_size):
        rows = range(g, g + group_size)
        wins = [i for i in rows if solved[i]]
        if wins:
            cache.put(keys[wins[-1]], episodes[wins[-1]])
            cache.refreshed += 1
        else:
            failed.append(g + group_size - 1)
    missing = [i for i in failed if cache.get(keys[i]) is None]
    if missing and self_roll is not None:
        for i, (ep, ok) in zip(missing, self_roll(missing)):
            if ok and cache.get(keys[i]) is None:
                cache.put(keys[i], ep)
                cache.self_rolled += 1
    for i in failed:
        entry = cache.get(keys[i])
        if entry is not None:
            episodes[i] = copy.deepcopy(entry)
            injected[i] = True
            cache.injected += 1
    return injected
