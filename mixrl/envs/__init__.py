"""Stateful multi-turn environments that are not tool calls: the policy acts in text, the
environment answers with an observation, a reward for the turn and whether the episode ended.

The interface (:class:`Environment`)::

    reset(problem: dict) -> str | None          # the first observation (appended to the prompt's
                                                # last user message; None: the row's prompt as it is)
    step(action: str) -> Step(observation: str, reward: float, done: bool)

One instance per rollout (``ENVIRONMENTS[name]()``), reset with the data row the rollout answers.
The episode loop (:func:`mixrl.envs.episodes.run_episodes`) generates a turn, steps the
environment with its text, appends the observation as a user turn of the chat template, and
goes on until ``done``, ``env.max_turns`` or the completion budget. Observation tokens are in the
row with provenance ``environment`` (masked from every loss); the episode's return (the sum of the
turns' rewards) is the rollout's reward.

Multi-turn agent RL with per-turn rewards: "ArCHer: Training Language Model Agents via
Hierarchical Multi-Turn RL" (arXiv:2402.19446); "Reinforcement Learning for Long-Horizon
Interactive LLM Agents" (LOOP, arXiv:2502.01600); "ST-PPO: Stabilized Off-Policy Proximal Policy
Optimization for Multi-Turn Agents Training" (the turn-level ratio, ``algo.loss.name=turn_ppo``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from mixrl.errors import ConfigError

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


ENVIRONMENTS: dict[str, Callable[[], Environment]] = {}


def register(name: str):
    """Class decorator: ``ENVIRONMENTS[name] = cls`` (``env.name=<name>``, ``conf/env/<name>.yaml``)."""

    def wrap(cls):
        ENVIRONMENTS[name] = cls
        return cls

    return wrap


def resolve_env(name: str) -> Callable[[], Environment]:
    """The factory registered as ``name``; an unknown name is one line naming the known ones."""
    from mixrl.envs import arith_retry  # noqa: F401  # deferred: registers the built-in environment (it imports this module)

    if name not in ENVIRONMENTS:
        raise ConfigError(f"env.name={name!r}: the environments are single, tools and {', '.join(sorted(ENVIRONMENTS))} (conf/env/)")
    return ENVIRONMENTS[name]


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
