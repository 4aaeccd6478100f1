"""Built-in rewards: ``exact`` and ``math``.

Both score each completion 1.0 (correct) or 0.0 against the row's gold answer column
(``answer`` by default), return ``None`` for rows with no gold answer (TRL ignores those),
and never raise on model output.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from mixrl.errors import ConfigError, DataError, did_you_mean
from mixrl.rewards.extract import completion_text, extract_after_marker, extract_boxed, extract_last_number
from mixrl.rewards.mathnorm import answers_match
from mixrl.rewards.registry import register_reward

__all__ = ["AnswerReward", "exact_reward", "math_reward", "extract_gold", "MATH_EXTRACTORS"]


class AnswerReward:
    """A picklable TRL reward function scoring ``score(completion_text, gold) -> float`` per row."""

    def __init__(self, name: str, score: Callable[[str, Any], float], answer_column: str = "answer"):
        self.__name__ = name
        self.score = score
        self.answer_column = answer_column

    def __repr__(self) -> str:
        return f"<reward {self.__name__} on column {self.answer_column!r}>"

    def __call__(self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None, **kwargs: Any):
        completions = list(completions or [])
        if self.answer_column not in kwargs:
            present = ", ".join(k for k in kwargs if k not in _TRL_EXTRAS) or "(none)"
            raise DataError(
                f"reward {self.__name__!r} needs the gold answer column {self.answer_column!r}, but the dataset "
                f"columns are: {present}; set data.answer_column (or reward.params.answer_column)"
            )
        golds = kwargs[self.answer_column]
        if isinstance(golds, (str, bytes)) or not hasattr(golds, "__len__"):
            golds = [golds] * len(completions)
        if len(golds) != len(completions):
            raise ValueError(
                f"reward {self.__name__!r}: {len(completions)} completions but {len(golds)} {self.answer_column!r} values"
            )
        rewards: list[float | None] = []
        for completion, gold in zip(completions, golds):
            if gold is None or (isinstance(gold, str) and not gold.strip()):
                rewards.append(None)
                continue
            try:
                rewards.append(float(self.score(completion_text(completion), gold)))
            except Exception:  # noqa: BLE001 - a reward must never fail on model output
                rewards.append(0.0)
        return rewards


_TRL_EXTRAS = {"trainer_state", "log_extra", "log_metric", "environments", "completion_ids"}


def extract_gold(gold: Any, marker: str = "####") -> str:
    """The gold answer: after ``marker`` (a GSM8K solution), else the last ``\\boxed{}`` (a MATH solution), else as is."""
    text = gold if isinstance(gold, str) else str(gold)
    for found in (extract_after_marker(text, marker), extract_boxed(text)):
        if found:
            return found
    return text.strip()


# ----------------------------------------------------------------------------- exact


def _exact_score(text: str, gold: Any, *, marker: str) -> float:
    found = extract_after_marker(text, marker)
    predicted = (found if found is not None else text).strip()
    return 1.0 if predicted and predicted == extract_gold(gold, marker).strip() else 0.0


@register_reward("exact")
def exact_reward(*, marker: str = "####", answer_column: str = "answer") -> AnswerReward:
    """1.0 if the text after the last ``marker`` (whole completion if there is none) equals the gold answer
    after stripping whitespace. A gold answer that is itself a ``... #### 72`` solution is reduced to ``72``."""
    if not isinstance(marker, str) or not marker:
        raise ConfigError(f"reward 'exact': marker must be a non-empty string, got {marker!r}; fix reward.params.marker")
    return AnswerReward("exact", functools.partial(_exact_score, marker=marker), answer_column)


# ----------------------------------------------------------------------------- math

MATH_EXTRACTORS = ("marker", "boxed", "last_number")


def _extract_math(text: str, extract: tuple[str, ...], marker: str) -> str | None:
    """``marker`` and ``boxed`` answers: the one written last wins (a ``#### Step 1`` heading before a
    ``\\boxed{}`` does not shadow it); ``last_number`` only when neither finds an answer."""
    candidates: list[tuple[int, str]] = []
    if "marker" in extract:
        found = extract_after_marker(text, marker)
        if found:
            candidates.append((text.rfind(marker), found))
    if "boxed" in extract:
        found = extract_boxed(text)
        if found:
            candidates.append((max(text.rfind("\\boxed"), text.rfind("\\fbox")), found))
    if candidates:
        return max(candidates, key=lambda c: c[0])[1]
    if "last_number" in extract:
        return extract_last_number(text)
    return None


def _math_score(text: str, gold: Any, *, extract: tuple[str, ...], marker: str, tolerance: float) -> float:
    predicted = _extract_math(text, extract, marker)
    if predicted is None:
        return 0.0
    return 1.0 if answers_match(predicted, extract_gold(gold, marker), tolerance=tolerance) else 0.0


@register_reward("math")
def math_reward(
    *,
    extract: Sequence[str] = MATH_EXTRACTORS,
    marker: str = "####",
    tolerance: float = 1e-6,
    answer_column: str = "answer",
) -> AnswerReward:
    """Math answer verifier for GSM8K / MATH style data.

    ``extract`` lists the enabled ways to find the predicted answer: ``marker`` (text after the last
    ``####``) and ``boxed`` (last ``\\boxed{...}``) -- whichever comes later in the text wins -- and
    ``last_number`` (last number in the text), used only when the other two find nothing. Both
    sides are normalised (``$``, thousands commas, ``\\frac``/``\\dfrac``, ``\\text{}`` units, ...) and
    compared numerically within ``tolerance`` when both are numbers, else as strings. The gold answer
    may be a bare answer or a full solution ending in ``#### 72`` or containing ``\\boxed{}``.
    """
    if isinstance(extract, str):
        extract = [extract]
    try:
        extract = tuple(str(x) for x in extract)
    except TypeError:
        raise ConfigError(
            f"reward 'math': extract must be a list from {list(MATH_EXTRACTORS)}, got {extract!r}; "
            "fix reward.params.extract"
        ) from None
    for how in extract:
        if how not in MATH_EXTRACTORS:
            raise ConfigError(
                f"reward 'math': unknown extract method {how!r}{did_you_mean(how, MATH_EXTRACTORS)}; "
                f"choose from {', '.join(MATH_EXTRACTORS)} in reward.params.extract"
            )
    if not extract:
        raise ConfigError(
            f"reward 'math': extract is empty; list at least one of {', '.join(MATH_EXTRACTORS)} in reward.params.extract"
        )
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or tolerance < 0:
        raise ConfigError(f"reward 'math': tolerance must be a number >= 0, got {tolerance!r}; fix reward.params.tolerance")
    if not isinstance(marker, str) or not marker:
        raise ConfigError(f"reward 'math': marker must be a non-empty string, got {marker!r}; fix reward.params.marker")
    score = functools.partial(_math_score, extract=extract, marker=marker, tolerance=float(tolerance))
    return AnswerReward("math", score, answer_column)
