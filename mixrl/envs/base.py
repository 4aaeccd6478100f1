"""The interface of a stateful multi-turn environment (:mod:`mixrl.envs`): :class:`Step`,
:class:`Environment`, and the calls that never let an action crash a run."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

#: The longest observation kept (characters): an environment's runaway text is cut, not trained on anyway.
MAX_OBSERVATION_CHARS = 512


@dataclass(frozen=True)
class Step:
    """What the environment answers to one action."""

    observation: str
    reward: float
    done: bool


class Environment(Protocol):
    """A stateful multi-turn environment (one instance per rollout)."""

    def reset(self, problem: dict[str, Any]) -> str | None: ...

    def step(self, action: str) -> Step: ...


def safe_step(env: Environment, action: Any) -> Step:
    """``env.step(action)`` that never raises: a non-text action is given as its ``str``; an
    exception ends the episode with reward 0 and the error as the observation; a non-finite or
    non-numeric reward is 0; the observation is text, at most ``MAX_OBSERVATION_CHARS``."""
    action = action if isinstance(action, str) else ("" if action is None else str(action))
    try:
        step = env.step(action)
        observation, reward, done = step.observation, step.reward, step.done
    except Exception as e:  # an environment's failure is an observation, never a crash of the run
        return Step(f"error: {type(e).__name__}: {e}"[:MAX_OBSERVATION_CHARS], 0.0, True)
    try:
        reward = float(reward)
    except (TypeError, ValueError):
        reward = 0.0
    if not math.isfinite(reward):
        reward = 0.0
    observation = "" if observation is None else str(observation)
    return Step(observation[:MAX_OBSERVATION_CHARS], reward, bool(done))


def safe_reset(env: Environment, problem: dict[str, Any]) -> str | None:
    """``env.reset(problem)``; a failure propagates (a broken environment is a bug, not an action)."""
    first = env.reset(problem)
    return None if first is None else str(first)[:MAX_OBSERVATION_CHARS]
