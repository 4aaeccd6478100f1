"""Reward functions for TRL's ``GRPOTrainer``.

``build_reward(name_or_path, **params)`` returns ``fn(prompts, completions, **kwargs) -> list[float | None]``.
Built-ins: ``exact`` and ``math`` (``math-verify``) (see :mod:`mixrl.rewards.builtin`), ``math_after_think`` (``math`` on the
answer after ``</think>``, 0 without it: :mod:`mixrl.rewards.think`), ``math_format`` (``math`` with a format term and a
repetition penalty, AMPO's reward: :mod:`mixrl.rewards.format_math`); your own function or factory by
import path (``my_pkg.rewards:fn``, ``my_pkg.rewards.fn``, ``path/to/rewards.py:fn``).
"""

from mixrl.rewards.registry import REWARDS, RewardFn, build_reward, register_reward, reward_params
from mixrl.rewards import builtin as _builtin  # noqa: E402,F401  - registers the built-ins
from mixrl.rewards import format_math as _format_math  # noqa: E402,F401  - registers reward=math_format
from mixrl.rewards import reward_model as _reward_model  # noqa: E402,F401  - registers reward=model
from mixrl.rewards import judge as _judge  # noqa: E402,F401  - registers reward=judge
from mixrl.rewards import process as _process  # noqa: E402,F401  - registers reward=process
from mixrl.rewards import think as _think  # noqa: E402,F401  - registers reward=math_after_think
from mixrl.rewards.builtin import AnswerReward, MathVerifier, exact_reward, extract_gold, math_reward
from mixrl.rewards.extract import completion_text, extract_after_marker

__all__ = [
    "REWARDS",
    "RewardFn",
    "AnswerReward",
    "build_reward",
    "register_reward",
    "reward_params",
    "exact_reward",
    "math_reward",
    "extract_gold",
    "completion_text",
    "extract_after_marker",
    "MathVerifier",
]
