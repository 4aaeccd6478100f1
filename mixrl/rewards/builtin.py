"""Built-in rewards: ``exact``, ``math`` and ``math_think_format`` (``math`` with CHORD's think-format penalty).

``exact`` and ``math`` score each completion 1.0 (correct) or 0.0 against the row's gold answer
column (``answer`` by default); ``math_think_format`` subtracts 0.1 from ``math``'s score when the
``<think> ... </think>`` format is missing. All return ``None`` for rows with no gold answer (TRL
ignores those), and never raise on model output.
"""

from __future__ import annotations

import functools
import importlib.util
import threading
from collections.abc import Callable, Sequence
from typing import Any

from mixrl.errors import ConfigError, DataError, did_you_mean
from mixrl.rewards.extract import completion_text, extract_after_marker
from mixrl.rewards.registry import register_reward

__all__ = ["AnswerReward", "MathVerifier", "exact_reward", "math_reward", "math_think_format_reward", "think_format_ok",
           "extract_gold", "MATH_EXTRACTORS"]


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
    """The gold answer of ``exact``: after ``marker`` (a GSM8K solution), else as is."""
    text = gold if isinstance(gold, str) else str(gold)
    found = extract_after_marker(text, marker)
    return found if found else text.strip()


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

#: the ways ``math`` finds the predicted answer (``reward.params.extract``)
MATH_EXTRACTORS = ("marker", "boxed", "latex", "expr")


def _after_marker(text: str, marker: str) -> str | None:
    """Everything after the last ``marker`` (GSM8K's ``#### 72``), or None."""
    i = text.rfind(marker)
    return text[i + len(marker):] if i >= 0 else None


class MathVerifier:
    """Parse and compare with Hugging Face's ``math-verify`` (the verifier of Open-R1 and LUFFY).

    Picklable (the library's configs are built on first use in each process)."""

    def __init__(self, extract: tuple[str, ...], marker: str, float_rounding: int, numeric_precision: int,
                 strict: bool, timeout_seconds: int | None):
        self.extract, self.marker = extract, marker
        self.float_rounding, self.numeric_precision, self.strict = float_rounding, numeric_precision, strict
        self.timeout_seconds = timeout_seconds

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_cfg")}

    def _timeout(self) -> int | None:
        # the library times out with SIGALRM, which only the main thread may use
        return self.timeout_seconds if threading.current_thread() is threading.main_thread() else None

    def _configs(self):
        if getattr(self, "_cfg_pred", None) is None:
            from math_verify import ExprExtractionConfig, LatexExtractionConfig  # deferred: math_verify, 0.5 s; config show/plan import this module

            pred = []
            if "boxed" in self.extract or "latex" in self.extract:
                pred.append(LatexExtractionConfig(
                    boxed_match_priority=0 if "boxed" in self.extract else -1,  # \boxed{} first, before "answer is"
                    try_extract_without_anchor="latex" in self.extract,
                ))
            if "expr" in self.extract:
                pred.append(ExprExtractionConfig())
            self._cfg_pred = pred
            self._cfg_gold = [LatexExtractionConfig(), ExprExtractionConfig()]
        return self._cfg_pred, self._cfg_gold

    def _parse_bare(self, text: str) -> list:
        """A bare answer (``72``, ``[1, 3)``, ``\\frac{3}{4}``, ``2x+1``: no ``$``/``\\boxed``/``\\(``) is
        read as LaTeX, as if boxed; when that yields no expression (``$72.`` as money), or the
        text has delimiters, the library reads the text as it is."""
        from math_verify import parse  # deferred: math_verify, 0.5 s; config show/plan import this module

        timeout = self._timeout()
        if not any(t in text for t in ("$", "\\boxed", "\\(", "\\[")):
            found = parse("\\boxed{" + text + "}", extraction_config=self._configs()[1], parsing_timeout=timeout)
            if found and not isinstance(found[0], str):
                return found
        return parse(text, extraction_config=self._configs()[1], parsing_timeout=timeout)

    def gold(self, gold) -> list:
        """The parsed gold answer (after the marker if there is one); unparsable: the string itself."""
        text = str(gold)
        text = (_after_marker(text, self.marker) or text).strip()
        return self._parse_bare(text) or [str(gold).strip()]

    def prediction(self, text: str) -> list:
        """The parsed prediction. ``marker``: when the last marker comes after the last
        ``\\boxed``, the first non-empty line after it, read as a bare answer. Otherwise the
        library's extraction over the whole text (the last match of the enabled configs)."""
        from math_verify import parse  # deferred: math_verify, 0.5 s; config show/plan import this module

        if "marker" in self.extract:
            i = text.rfind(self.marker)
            if i >= 0 and i > text.rfind("\\boxed"):
                line = next((ln.strip() for ln in text[i + len(self.marker):].splitlines() if ln.strip()), "")
                found = self._parse_bare(line) if line else []
                if found:
                    return found
        cfg = self._configs()[0]
        return parse(text, extraction_config=cfg, parsing_timeout=self._timeout()) if cfg else []

    def __call__(self, text: str, gold) -> float:
        from math_verify import verify  # deferred: math_verify, 0.5 s; config show/plan import this module

        pred = self.prediction(text)
        if not pred:
            return 0.0
        return 1.0 if verify(self.gold(gold), pred, float_rounding=self.float_rounding,
                             numeric_precision=self.numeric_precision, strict=self.strict,
                             timeout_seconds=self._timeout()) else 0.0


def check_verifier_settings(name: str, float_rounding: Any, numeric_precision: Any, timeout_seconds: Any) -> None:
    """The math-verify settings every verifier reward shares (``math``, ``math_after_think``), checked
    in one line naming reward ``name``; and math-verify itself installed."""
    for key, value in (("float_rounding", float_rounding), ("numeric_precision", numeric_precision)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"reward '{name}': {key} must be an integer >= 1, got {value!r}; fix reward.params.{key}")
    if timeout_seconds is not None and (isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, int) or timeout_seconds < 1):
        raise ConfigError(f"reward '{name}': timeout_seconds must be an integer >= 1 or null, got {timeout_seconds!r}; "
                          "fix reward.params.timeout_seconds")
    if importlib.util.find_spec("math_verify") is None:
        raise ConfigError(f"reward '{name}' needs the 'math-verify' package, which is not installed; pip install math-verify")


@register_reward("math")
def math_reward(
    *,
    extract: Sequence[str] = MATH_EXTRACTORS,
    marker: str = "####",
    float_rounding: int = 6,
    numeric_precision: int = 15,
    strict: bool = True,
    timeout_seconds: int | None = 5,
    answer_column: str = "answer",
) -> AnswerReward:
    """Math answer verifier: Hugging Face ``math-verify`` (the verifier of Open-R1 and LUFFY)
    parses both answers into SymPy and compares them (numbers to ``float_rounding`` decimals,
    fractions, radicals, intervals, sets, equations, LaTeX units and ``\\text{}`` stripped).

    ``extract`` lists the enabled ways to find the predicted answer: ``marker`` (the line after
    the last ``####``, when no ``\\boxed{}`` follows it), ``boxed`` (the last ``\\boxed{...}``, before anything
    else), ``latex`` (LaTeX after "the answer is" and the like, or anywhere), ``expr`` (plain
    numbers and expressions: the last one). The gold answer may be a bare answer (read as
    LaTeX), a solution ending in ``#### 72`` or containing ``\\boxed{}``. ``timeout_seconds``
    bounds each parse and comparison (main thread only; the library uses SIGALRM).
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
    if not isinstance(marker, str) or not marker:
        raise ConfigError(f"reward 'math': marker must be a non-empty string, got {marker!r}; fix reward.params.marker")
    check_verifier_settings("math", float_rounding, numeric_precision, timeout_seconds)
    score = MathVerifier(extract, marker, int(float_rounding), int(numeric_precision), bool(strict), timeout_seconds)
    return AnswerReward("math", score, answer_column)


# ----------------------------------------------------------------------------- math_think_format


def think_format_ok(text: str) -> bool:
    """Exactly one ``<think>`` and one ``</think>``, the opening tag first (the check of
    CHORD's reward, Trinity-RFT ``validate_think_pattern``)."""
    return text.count("<think>") == 1 and text.count("</think>") == 1 and text.find("<think>") < text.find("</think>")


class ThinkFormatScore:
    """``accuracy(text, gold) - penalty`` when the ``<think>`` format is missing; picklable."""

    def __init__(self, accuracy: Callable[[str, Any], float], penalty: float):
        self.accuracy, self.penalty = accuracy, penalty

    def __call__(self, text: str, gold: Any) -> float:
        try:
            correct = float(self.accuracy(text, gold))
        except Exception:  # noqa: BLE001 - the format term still applies when the verifier fails
            correct = 0.0
        return correct - (0.0 if think_format_ok(text) else self.penalty)


@register_reward("math_think_format")
def math_think_format_reward(
    *,
    format_penalty: float = 0.1,
    extract: Sequence[str] = MATH_EXTRACTORS,
    marker: str = "####",
    float_rounding: int = 6,
    numeric_precision: int = 15,
    strict: bool = True,
    timeout_seconds: int | None = 5,
    answer_column: str = "answer",
) -> AnswerReward:
    """``math``'s accuracy (1 or 0) minus ``format_penalty`` when the completion lacks the
    ``<think> ... </think>`` format: exactly one opening and one closing tag, in that order.
    CHORD's math reward (Trinity-RFT ``MathBoxedRewardFn`` with ``with_think: true``:
    ``trinity/common/rewards/math_reward.py:59-65``, check ``eval_utils.py:111-124``, penalty
    ``format_score_coef`` 0.1 from ``customized_math_workflows.py:28``), so a reward is one of
    1, 0, 0.9, -0.1. Their accuracy is a ``\\boxed{}`` string match after normalisation; here
    it is ``math``'s verifier (the other parameters are ``math``'s).
    """
    if isinstance(format_penalty, bool) or not isinstance(format_penalty, (int, float)) or format_penalty < 0:
        raise ConfigError(f"reward 'math_think_format': format_penalty must be a number >= 0, got {format_penalty!r}; "
                          "fix reward.params.format_penalty")
    inner = math_reward(extract=extract, marker=marker, float_rounding=float_rounding, numeric_precision=numeric_precision,
                        strict=strict, timeout_seconds=timeout_seconds, answer_column=answer_column)
    return AnswerReward("math_think_format", ThinkFormatScore(inner.score, float(format_penalty)), answer_column)
