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

Multi-turn agent RL: "ArCHer: Training Language Model Agents via Hierarchical Multi-Turn RL"
(arXiv:2402.19446); "Reinforcement Learning for Long-Horizon Interactive LLM Agents" (LOOP,
arXiv:2502.01600: RL directly in a stateful environment, not per-turn rewards; those are MT-GRPO's,
arXiv 2505.11821); "ST-PPO: Stabilized Off-Policy Proximal Policy
Optimization for Multi-Turn Agents Training" (the turn-level ratio, ``algo.loss.name=turn_ppo``).
"""

from __future__ import annotations

from typing import Callable

from mixrl.envs.arith_retry import ArithRetry
from mixrl.envs.arith_steps import ArithSteps
from mixrl.envs.base import MAX_OBSERVATION_CHARS, Environment, Step, safe_reset, safe_step
from mixrl.errors import ConfigError
from mixrl.registry import Registry

__all__ = ["ENVIRONMENTS", "MAX_OBSERVATION_CHARS", "Environment", "Step", "register", "resolve_env", "safe_reset", "safe_step"]

#: name -> environment class (:class:`mixrl.registry.Registry`: ``ENVIRONMENTS[name]``, ``name in ENVIRONMENTS``)
ENVIRONMENTS = Registry("environment")


def register(name: str):
    """Class decorator: ``ENVIRONMENTS[name] = cls`` (``env.name=<name>``, ``conf/env/<name>.yaml``);
    a name already taken by another class is refused (one line, ``ValueError``), not overwritten."""
    return ENVIRONMENTS.register(name)


register("arith_retry")(ArithRetry)
register("arith_steps")(ArithSteps)


def resolve_env(name: str) -> Callable[[], Environment]:
    """The factory registered as ``name``; an unknown name is one line naming the known ones."""
    if name not in ENVIRONMENTS:
        raise ConfigError(f"env.name={name!r}: the environments are single, tools and {', '.join(sorted(ENVIRONMENTS))} (conf/env/)")
    return ENVIRONMENTS[name]
