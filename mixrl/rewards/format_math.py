"""``math_format``: the math verifier plus a format term and a repetition penalty (AMPO's reward).

AMPO's authors (EnigmaYYYY/AMPO @ 647e2e4de7f0bdcd2787fa9941d4dbc317facb7e) score a rollout as

* ``r = (1 - c) s + c f`` (``ampo/verl/verl/adaptive_mix_src/math_verify_reward.py:186-200``):
  ``s`` the verifier's 0/1, ``f`` the format score, ``c`` = ``reward_model.format_coefficient``
  (0.1 in ``exp_scripts/train_ampo.sh:190``);
* ``f = 1`` when each tag (``format_mode=R1_nothink``: ``<answer>``, ``</answer>``) occurs exactly
  once and the text matches ``.*<answer>.*</answer>.*`` (``ampo/verl/verl/workers/reward_manager/format.py:3-24``);
* then the repetition penalty (``adaptive_mix_src/mix_dapo_trainer.py:859-868``, with
  ``utils/reward_score/repetition.py:3-33``): the text is split on whitespace and each piece on
  ``_``; when it has more than ``window`` (10) words and some ``window``-word sequence occurs
  ``limit`` (``repetition_penalty_max_repetitions_limit``, 10 in ``adaptive_mix_src/config/mix_dapo_trainer.yaml:159``)
  times, ``-1`` is added, but only to a non-zero reward (they add it to the reward tensor's
  non-zero entries: a wrong, unformatted answer keeps 0).

Their rule for "correct" is ``r > c + 0.5`` (``mix_dapo_trainer.py:1391``): with c = 0.1 a
rollout is correct exactly when ``r >= 0.6`` here. Held-out and training accuracy are judged by
the plain verifier (``verifier`` attribute; their validation reward has ``format_coefficient=0``,
``main_mix_dapo.py:202-206``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from mixrl.errors import ConfigError
from mixrl.rewards.builtin import MATH_EXTRACTORS, AnswerReward, math_reward
from mixrl.rewards.registry import register_reward

__all__ = ["format_score", "repetition_penalty", "FormattedAnswerReward", "math_format_reward"]


def format_score(text: str, tags: Sequence[str] = ("<answer>", "</answer>")) -> float:
    """1.0 when every tag occurs exactly once and they occur in the given order, else 0.0."""
    if any(text.count(t) != 1 for t in tags):
        return 0.0
    pattern = ".*" + ".*".join(re.escape(t) for t in tags) + ".*"
    return 1.0 if re.fullmatch(pattern, text, re.DOTALL) else 0.0


def repetition_penalty(text: str, window: int = 10, limit: int = 10) -> float:
    """-1.0 when some run of ``window`` words occurs ``limit`` times or more, else 0.0 (words:
    the text split on whitespace, each piece split on ``_``; a text of ``window`` words or fewer: 0)."""
    words = [w for piece in text.split() for w in piece.split("_")]
    if len(words) <= window:
        return 0.0
    counts: dict[tuple[str, ...], int] = {}
    for i in range(len(words) - window + 1):
        key = tuple(words[i:i + window])
        counts[key] = counts.get(key, 0) + 1
        if counts[key] >= limit:
            return -1.0
    return 0.0


class FormattedAnswerReward(AnswerReward):
    """A verifier's 0/1 mixed with a format score, then a repetition penalty on non-zero rewards.

    ``verifier``: the plain verifier (judges held-out and training accuracy)."""

    def __init__(self, verifier: AnswerReward, *, format_coef: float, tags: tuple[str, ...], window: int, limit: int,
                 penalty: float):
        super().__init__("math_format", self._score, verifier.answer_column)
        self.verifier = verifier
        self.format_coef, self.tags, self.window, self.limit, self.penalty = format_coef, tags, window, limit, penalty

    def _score(self, text: str, gold: Any) -> float:
        r = (1.0 - self.format_coef) * self.verifier.score(text, gold) + self.format_coef * format_score(text, self.tags)
        if r != 0.0 and self.penalty != 0.0 and repetition_penalty(text, self.window, self.limit) != 0.0:
            r += self.penalty
        return r


@register_reward("math_format")
def math_format_reward(
    *,
    format_coef: float = 0.1,
    tags: Sequence[str] = ("<answer>", "</answer>"),
    repetition_window: int = 10,
    repetition_limit: int = 10,
    repetition_penalty: float = -1.0,
    extract: Sequence[str] = MATH_EXTRACTORS,
    marker: str = "####",
    answer_column: str = "answer",
) -> FormattedAnswerReward:
    """The ``math`` verifier mixed with a format term, with a repetition penalty (AMPO's reward).

    ``r = (1 - format_coef) s + format_coef f``; then ``r += repetition_penalty`` when r != 0
    and some run of ``repetition_window`` words occurs ``repetition_limit`` times. ``s``: the
    ``math`` verifier (``extract``, ``marker`` as there); ``f``: 1 when each of ``tags`` occurs
    exactly once, in order. ``repetition_penalty: 0`` turns the penalty off, ``format_coef: 0``
    the format term. Accuracy is judged by the verifier alone.
    """
    try:
        coef = float(format_coef)
    except (TypeError, ValueError):
        raise ConfigError(f"reward 'math_format': format_coef must be a number in [0, 1), got {format_coef!r}; "
                          "fix reward.params.format_coef") from None
    if not 0.0 <= coef < 1.0:
        raise ConfigError(f"reward 'math_format': format_coef must be in [0, 1) (1 would ignore the answer), got {format_coef!r}; "
                          "fix reward.params.format_coef")
    tags = (tags,) if isinstance(tags, str) else tuple(str(t) for t in tags)
    if not tags or not all(tags):
        raise ConfigError("reward 'math_format': tags must list non-empty strings, e.g. ['<answer>', '</answer>']; fix reward.params.tags")
    for key, value in (("repetition_window", repetition_window), ("repetition_limit", repetition_limit)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"reward 'math_format': {key} must be an integer >= 1, got {value!r}; fix reward.params.{key}")
    try:
        penalty = float(repetition_penalty)
    except (TypeError, ValueError):
        raise ConfigError(f"reward 'math_format': repetition_penalty must be a number <= 0 (0: off), got {repetition_penalty!r}; "
                          "fix reward.params.repetition_penalty") from None
    if penalty > 0:
        raise ConfigError(f"reward 'math_format': repetition_penalty must be <= 0 (a penalty; 0: off), got {repetition_penalty!r}; "
                          "fix reward.params.repetition_penalty")
    verifier = math_reward(extract=extract, marker=marker, answer_column=answer_column)
    return FormattedAnswerReward(verifier, format_coef=coef, tags=tags, window=int(repetition_window),
                                 limit=int(repetition_limit), penalty=penalty)
