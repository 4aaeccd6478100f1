"""Episode injections: turns written into a stateful environment's episode at its turn boundaries
(``algo.episode``), and the provenance of every token of such an episode.

``algo.episode.name``:

* ``none`` (default): the policy writes every assistant turn.
* ``patch``: UI-S1's patch module ("UI-S1: Advancing GUI Automation via Semi-online Reinforcement
  Learning", arXiv 2509.11543; X-PLUG/MobileAgent @ 11cea575561fb7800b5fb6b6cafa56f7a91de11f,
  ``UI-S1/verl/utils/dataset/universal_multiround.py:254-276`` ``apply_response``): when the
  policy's action diverges from the offline expert trajectory, the expert's action is taken
  instead and the episode goes on, at most ``threshold`` times per episode (their
  ``patch_threshold``, 2 in ``scripts/train_example.sh``; -1: always); past it the episode ends.
* ``reachable``: BEPA's reachable trajectories and their cache (:mod:`mixrl.sources.reachable_cache`).

The rows' provenance (:func:`episode_sources`): the policy's turns ``on_policy`` (``reachable`` in a
row BEPA's cache placed), observations and notes ``environment``, an injected turn ``patched``
(behaviour unknown: no term trains it unless it names ``patched``). The policy's turns are
numbered without the injected ones (``turn_id``), so turn k keeps the reward of the policy's k-th action.

Difference from the authors' code: there every step is its own row, and after a patch the next
step's context holds the expert's action in place of the policy's; here an episode is one row,
so the diverging action stays in the sequence (it is trained, as there) and the expert's action
follows it as an assistant turn after the note ``PATCH_NOTE``.
"""

from __future__ import annotations

from typing import Any, Callable

from mixrl.core import provenance as prov
from mixrl.envs.base import Step
from mixrl.errors import ConfigError

#: the episode injections (``algo.episode.name``)
EPISODE_INJECTIONS = ("none", "patch", "reachable")
#: the provenances each one puts in the batch (config validation: a term may name them)
EPISODE_PROVENANCES = {"patch": ("patched",), "reachable": ("reachable",)}
#: the user turn between a diverging action and the expert's (the chat template needs one)
PATCH_NOTE = "expert:"


def episode_injection(cfg: Any) -> dict:
    """``algo.episode`` as a plain dict with its name (``{"name": "none"}`` when absent)."""
    algo = cfg.get("algo") if hasattr(cfg, "get") else None
    node = None if algo is None else algo.get("episode")
    if node is None:
        return {"name": "none"}
    out = {str(k): v for k, v in node.items()}
    out.setdefault("name", "none")
    return out


def validate_episode_injection(cfg: Any, env_name: str, factory: Callable | None) -> None:
    """One line for an episode injection the configuration cannot run: an unknown name, no
    stateful environment, or an environment that cannot take it (its class lists what it takes
    in ``EPISODE_INJECTIONS``), or a bad patch threshold."""
    inj = episode_injection(cfg)
    name = str(inj["name"])
    if name not in EPISODE_INJECTIONS:
        raise ConfigError(f"algo.episode.name={name!r}: the episode injections are {', '.join(EPISODE_INJECTIONS)}")
    if name == "none":
        return
    if factory is None:
        raise ConfigError(f"algo.episode.name={name} with env={env_name}: an episode injection needs a stateful "
                          "environment with an expert trajectory; use env=arith_steps")
    takes = tuple(getattr(factory, "EPISODE_INJECTIONS", ()))
    if name not in takes:
        raise ConfigError(f"algo.episode.name={name} with env={env_name}: that environment cannot take it (it has no "
                          "expert trajectory to patch from or plan with); use env=arith_steps or algo.episode.name=none")
    threshold = int(inj.get("threshold", 2))
    if name == "patch" and threshold < -1:
        raise ConfigError(f"algo.episode.threshold={threshold}: patches per episode, >= 0 or -1 (no limit)")


def describe_episode_injection(cfg: Any) -> str | None:
    """``mixrl explain``'s row for ``algo.episode`` (None when none)."""
    inj = episode_injection(cfg)
    if inj["name"] == "patch":
        threshold = int(inj.get("threshold", 2))
        limit = "no limit" if threshold == -1 else f"at most {threshold} per episode, then a divergence ends it"
        return (f"patch (UI-S1's patch module): an action that diverges from the expert trajectory stays in the row (trained, "
                f"its turn's reward), then the user turn {PATCH_NOTE!r} and the expert's action as an assistant turn with "
                f"provenance patched [behaviour unknown], in no term unless one names it; the episode goes on ({limit}); "
                f"turn_id numbers the policy's turns only. Training only: held-out episodes are the policy's alone.")
    if inj["name"] == "reachable":
        return (f"reachable (BEPA): per group, a solved episode refreshes the task's cache; a group with none solved gets the "
                f"cached trajectory in its last row (after up to {int(inj.get('attempts', 2))} plan-conditioned episodes of the "
                f"policy when nothing is cached), trained under the plain prompt with provenance reachable [behaviour policy], "
                f"in the group's statistics. Training only.")
    return None


class Patcher:
    """UI-S1's patch module for one batch of episodes: ``patch(i, env)`` for :func:`run_episodes`."""

    def __init__(self, encode: Callable[[str], list[int]], suffix: Callable[[str], list[int]], turn_end: int,
                 threshold: int = 2) -> None:
        self.encode, self.suffix, self.turn_end, self.threshold = encode, suffix, int(turn_end), int(threshold)
        self.used: dict[int, int] = {}

    def __call__(self, i: int, env: Any) -> tuple[list[int], list[int], Step] | None:
        if not getattr(env, "diverged", False):
            return None  # the episode ended otherwise (solved)
        used = self.used.get(i, 0)
        if self.threshold != -1 and used >= self.threshold:
            return None  # their `patch_threshold > error_num` failed: the trajectory finishes
        self.used[i] = used + 1
        text, step = env.patch()
        return self.suffix(PATCH_NOTE), list(self.encode(text)) + [self.turn_end], step


def episode_sources(env_mask: list[int], injected: list[int], policy_code: int = prov.ON_POLICY) -> list[int]:
    """Per token of one episode: ``policy_code`` on the policy's tokens, ``patched`` on an injected
    turn's, ``environment`` elsewhere (observations, notes).

    Formula: s_t = policy if m_t = 1; patched if inj_t = 1; environment otherwise
    """
    return [policy_code if m else (prov.PATCHED if j else prov.ENVIRONMENT) for m, j in zip(env_mask, injected)]
