"""What a reward is given when it is built, and what it may expose: the rewards' declared protocol.

A reward is called as ``fn(prompts, completions, **kwargs) -> list[float | None]`` (TRL's reward
function). Beyond that, the trainer reads only what is declared here, by ``isinstance`` on these
protocols, never by probing for attribute names:

* :class:`Verified`: ``verifier``, the rule-based reward that decides "correct" for a reward that
  scores with a model (held-out accuracy, the training ``accuracy`` metric;
  :func:`mixrl.rewards.components.heldout_reward`). ``None``: a model reward that names none.
* :class:`ChecksAtStart`: ``check_model()`` and ``check_tokenizer(policy_tokenizer)``, the start-up
  refusals of a reward that runs a model of its own (``reward=model``), run before the run
  directory exists (:meth:`mixrl.rewards.checked.CheckedReward.check_at_start`).
* :class:`DenseCredit`: ``last_credit`` ({row: one float per token}), a dense reward's per-token
  part without its outcome (``reward=process``); :class:`~mixrl.rewards.checked.CheckedReward`
  keeps every dense reward's lists in ``last_dense`` (:class:`DenseOutput`, read by the critic's GAE)
  and its credit in ``last_credit`` (read by ``algo.advantage.name=capo``).

What a reward needs of the run comes at construction, in one :class:`RewardContext`: a factory
that declares the keyword-only parameter ``context`` (:data:`CONTEXT_PARAM`: never a config
parameter: left out of ``reward.params`` and ``mixrl explain``; docs/components.md lists it as a runtime argument) receives it from
:func:`mixrl.rewards.registry.build_reward`, and the per-call time limit goes to the
:class:`~mixrl.rewards.checked.CheckedReward` that wraps every reward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

#: the keyword-only factory parameter that receives the run's :class:`RewardContext` (reserved: not a config parameter)
CONTEXT_PARAM = "context"


@dataclass(frozen=True)
class RewardContext:
    """What a run gives its rewards when it builds them (None: not known, e.g. a reward built to
    validate a config or called outside a run)."""

    device: str | None = None  # hardware.device: where a reward model or a judge served by transformers loads
    policy_path: str | None = None  # the policy's model folder: a judge with path=policy
    tokenizer: Any = None  # the policy's tokenizer: where each completion token ends (a dense reward)
    timeout_s: float | None = None  # reward.timeout_s: the wall-clock limit of one call (mixrl.rewards.deadline)


@runtime_checkable
class Verified(Protocol):
    """A reward scored by a model that names the rule-based reward deciding "correct"."""

    verifier: Any


@runtime_checkable
class ChecksAtStart(Protocol):
    """A reward that runs a model of its own and refuses a bad one before the run starts."""

    def check_model(self) -> None: ...

    def check_tokenizer(self, policy_tokenizer: Any) -> None: ...


@runtime_checkable
class DenseCredit(Protocol):
    """A dense reward that keeps its per-token credit (the list without its outcome) after each call."""

    last_credit: dict[int, list[float]]


@runtime_checkable
class DenseOutput(Protocol):
    """A reward whose last call's per-token rewards can be read: ``last_dense`` ({row: one float per
    token}; every :class:`~mixrl.rewards.checked.CheckedReward`, empty for a reward that returned floats)."""

    last_dense: dict[int, list[float]]
