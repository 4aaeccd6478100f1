"""Rewards from models (a reward model, a judge, process rewards) as documented components.

``REWARD_MODELS`` is a :class:`mixrl.core.registry.Registry` of reward factories whose docstrings
declare a ``Formula:`` and a ``Paper:``, so that ``docs/components.md`` and ``mixrl explain`` show
them like every other component. :func:`register_model_reward` puts a factory both there and in the
reward registry (:data:`mixrl.rewards.registry.REWARDS`, every reward) that ``reward.name`` resolves.

:func:`heldout_reward` is the reward that judges held-out accuracy: a model-based reward carries the
exact verifier it is combined with (``verifier``), and accuracy is judged by that verifier, never by
the model (a reward model's score of 0.8 is not "right"); :func:`training_judge` is the same for
the training ``accuracy`` metric, and None where a model reward names no verifier.

:func:`local_device` is where a reward's own model (a reward model, a judge served by
``transformers``) loads when its ``device`` param is unset: the run's device (``hardware.device``),
given at construction (:class:`mixrl.rewards.protocol.RewardContext`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from mixrl.core.registry import Registry
from mixrl.rewards.protocol import Verified
from mixrl.rewards.registry import register_reward

#: name -> factory of the rewards computed by a model (``reward.name=model|judge|process``)
REWARD_MODELS = Registry("reward", runtime=("context",))  # context: the run's RewardContext, not a config param


def register_model_reward(name: str, **kw: Any) -> Callable:
    """Decorator: register a reward factory in :data:`REWARD_MODELS` (documented) and ``REWARDS`` (resolved)."""

    def deco(factory: Callable) -> Callable:
        REWARD_MODELS.register(name, **kw)(factory)
        register_reward(name)(factory)
        return factory

    return deco


def training_judge(fn: Any) -> Any:
    """What decides "correct" for the training ``accuracy`` metric (the policy's own rollouts) when
    ``fn`` is the run's first reward: ``fn`` itself for a rule-based reward (a verifier: a value
    >= 1 is correct), the verifier of a reward from a model (``reward=model``, ``judge``,
    ``process``: :class:`~mixrl.rewards.protocol.Verified`) that names one, and None for one that
    names none: its scores (a reward model's in (0, 1), a judge's, a sum of step scores) are no
    verdict, so the run logs no accuracy."""
    return fn.verifier if isinstance(fn, Verified) else fn


def heldout_reward(fn: Any) -> Any:
    """The reward that decides "correct" for held-out accuracy: ``fn``'s verifier when ``fn`` scores
    with a model (and names one), else ``fn`` itself."""
    verifier = fn.verifier if isinstance(fn, Verified) else None
    return verifier if verifier is not None else fn


def local_device(run_device: str | None) -> str:
    """Where a reward's own model runs when its ``device`` param is unset: the run's device
    (``hardware.device``, given at construction in the :class:`~mixrl.rewards.protocol.RewardContext`):
    ``cpu`` -> the CPU, even with a GPU visible; ``cuda`` -> this process's GPU
    (``cuda:$LOCAL_RANK``, the accelerator's device). Not given (the reward built outside a run):
    this process's GPU when one is visible, else the CPU."""
    import torch  # deferred: config validation builds the rewards without torch

    if run_device == "cpu" or (run_device is None and not torch.cuda.is_available()):
        return "cpu"
    return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
