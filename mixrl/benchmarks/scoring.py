"""Answer extraction and scoring of benchmark outputs.

Extraction (``extract:`` of a benchmark), total on any text (``None`` when nothing is found):

* ``boxed``: the content of the **last** ``\\boxed{...}`` (or ``\\fbox{...}``), nested braces
  balanced, as verl's ``last_boxed_only_string`` / ``remove_boxed``
  (``verl/utils/reward_score/math.py``) and the MATH paper's grader read it; with no box, the
  answer after "the answer is" / "final answer:" (:func:`final_answer`).
* ``final_answer``: the text after the last "The final answer is" / "The answer is" / "ANSWER:",
  up to the end of its line, without a trailing period or ``$`` delimiters.
* ``choice``: a multiple-choice letter among the benchmark's labels: a boxed letter, then
  "ANSWER: C" / "the answer is (C)", then the last standalone ``(C)`` or ``C)``.
* ``raw``: the whole completion (the ``reward`` scorer reads it as training does).

Scoring (``scorer:``): ``math_verify`` compares the extracted answer with the gold answer through
Hugging Face ``math-verify`` (:class:`mixrl.rewards.builtin.MathVerifier`, the verifier of Open-R1
and LUFFY: fractions, radicals, ``\\frac`` vs decimals, ``\\text{}`` units stripped); ``choice``
is an exact letter match; ``exact`` compares stripped strings; ``reward`` is the run's reward function.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from mixrl.rewards.builtin import MathVerifier

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_FINAL = re.compile(r"(?:(?:final answer|the answer) is\s*:?|final answer\s*:|answer\s*:)\s*", re.IGNORECASE)


def boxed_all(text: str) -> list[str]:
    """The contents of every ``\\boxed{...}`` in ``text``, braces balanced (an unclosed box is dropped)."""
    if not isinstance(text, str):
        return []
    found = []
    for m in _BOX.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            found.append(text[m.end():i - 1].strip())
    return found


def last_boxed(text: str) -> str | None:
    boxes = boxed_all(text)
    return boxes[-1] if boxes else None


def final_answer(text: str) -> str | None:
    """The answer after the last "the answer is" / "final answer:" / "ANSWER:" marker, to the end of its line."""
    if not isinstance(text, str):
        return None
    last = None
    for m in _FINAL.finditer(text):
        last = m
    if last is None:
        return None
    line = text[last.end():].split("\n", 1)[0].strip()
    line = line.strip("$ ").rstrip(".").strip().strip("$").strip()
    return line or None


def choice_letter(text: str, labels: Sequence[str]) -> str | None:
    """The chosen option's label (``labels``: e.g. ``A..D``): boxed, then after an answer marker, then the last ``(X)``."""
    if not isinstance(text, str) or not labels:
        return None
    alt = "|".join(re.escape(str(x)) for x in sorted(labels, key=len, reverse=True))
    letter = re.compile(rf"^\s*(?:\\text\{{)?\s*\(?\s*({alt})\s*\)?\s*\}}?\s*(?:[.:)]|$)")
    for cand in reversed(boxed_all(text)):
        m = letter.match(cand)
        if m:
            return m.group(1)
    marks = list(_FINAL.finditer(text))
    for mark in reversed(marks):
        m = letter.match(text[mark.end():].split("\n", 1)[0].strip("*$ "))
        if m:
            return m.group(1)
    hits = re.findall(rf"\(({alt})\)|(?:^|\s)({alt})\)", text)
    if hits:
        a, b = hits[-1]
        return a or b
    return None


def extract(how: str, text: str, labels: Sequence[str] = ()) -> str | None:
    if how == "boxed":
        return last_boxed(text) or final_answer(text)
    if how == "final_answer":
        return final_answer(text)
    if how == "choice":
        return choice_letter(text, labels)
    return text if isinstance(text, str) else None


def vote_key(answer: str | None) -> str | None:
    """The form answers are counted under for maj@k: whitespace, ``$`` and ``\\left``/``\\right`` removed."""
    if answer is None:
        return None
    key = re.sub(r"\\left|\\right|\s+|\$", "", str(answer))
    return key or None


_UNITS = re.compile(r"\\(?:text|mathrm|mbox|operatorname)\s*\{[^{}]*\}|\^\s*\{?\\circ\}?|\\[,;!]|~")


def strip_units(answer: str) -> str:
    """``answer`` without ``\\text{...}`` / ``\\mathrm{...}`` words, degree signs and LaTeX spaces (``1.6 \\text{ cm}`` -> ``1.6``)."""
    return _UNITS.sub("", answer).strip()


def math_verify_scorer() -> Callable[[str | None, str], bool]:
    """``score(extracted, gold)``: math-verify equivalence of two bare answers (the library's
    defaults of ``reward=math``: 6 decimals, strict, 5 s per parse/compare)."""
    from math_verify import verify  # deferred: math_verify loads sympy (0.5 s); only math benchmarks need it

    mv = MathVerifier(("boxed", "latex", "expr"), "####", 6, 15, True, 5)

    def score(extracted: str | None, gold: str) -> bool:
        if extracted is None:
            return False
        if extracted.strip() == str(gold).strip():
            return True
        # as given, then with trailing units (\\text{ cm}, \\mathrm{m}, ^\\circ) dropped: Minerva's golds carry none
        for text in dict.fromkeys((extracted, strip_units(extracted))):
            try:
                pred = mv.gold(text)  # a bare answer, parsed as the gold one is
                if pred and verify(mv.gold(gold), pred, float_rounding=6, numeric_precision=15, strict=True,
                                   timeout_seconds=mv._timeout()):
                    return True
            except Exception:  # noqa: BLE001 - a scorer must never fail on model output
                pass
        return False

    return score


def choice_scorer(extracted: str | None, gold: str) -> bool:
    return extracted is not None and extracted.strip().upper() == str(gold).strip().upper()


def exact_scorer(extracted: str | None, gold: str) -> bool:
    return extracted is not None and extracted.strip() == str(gold).strip()
