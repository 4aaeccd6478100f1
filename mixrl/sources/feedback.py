"""Feedback on a rollout: what the policy is told before it regenerates.

A **feedback builder** turns one attempt (a failed one; with ``algo.inject.refine: all``, any:
``Attempt.correct`` says which) into language feedback (and, optionally, the token where the
attempt went wrong). The ``refine`` injection (:mod:`mixrl.sources.with_feedback`) calls it for
each rollout it regenerates; every builder has the one signature::

    builder(attempt: Attempt) -> Feedback | str | None      (None: no feedback, the rollout is left as it is)

Built-in builders (``algo.inject.feedback``):

* ``verifier``: the verifier's message, Critique-GRPO's "critique with ground truth": the
  answer the attempt gave (or that it gave none), whether it is right, and the expected one;
* ``indicative``: Critique-GRPO's "indicative critique": only whether the answer is right;
* ``hint``: the beginning of the reference solution (the source's expert completion);
* ``self``: the policy's own critique of its attempt, written inside the step through the
  rollouts' generation path (``attempt.policy``, :mod:`mixrl.trainer.parts.policy_calls`);
* ``module:function`` (or ``path/to/file.py:function``): any callable with the signature above,
  e.g. a judge's critique; such a function may call the policy too, ``attempt.policy.write(request)``.

A builder's fixed text is given by its ``texts()`` so the character check (and the tiny model's
vocabulary) covers it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mixrl.errors import ConfigError, call_user_function
from mixrl.registry import Registry
from mixrl.rewards.extract import extract_after_marker
from mixrl.rewards.registry import _import_object
from mixrl.sources.base import check_template, template_text
from mixrl.sources.self_hint import in_last_user


@dataclass
class Attempt:
    """One rollout, as a feedback builder sees it.

    ``prompt``: the row's prompt (text or messages); ``completion``: the attempt's text;
    ``completion_ids``: its token ids; ``reward``: its first reward function's value;
    ``answer``: the row's gold answer (None when the data has none); ``reference``: a reference
    solution (the source's expert completion; None without one); ``row``: the whole data row;
    ``policy``: the policy's handle (:class:`mixrl.trainer.parts.policy_calls.PolicyCalls`:
    ``policy.write(request, max_new_tokens=n)`` samples the policy's answer to a request, a text or
    chat messages; None where the injection offers none);
    ``correct``: the attempt succeeded (``reward`` at least ``algo.inject.success``; only
    ``algo.inject.refine: all`` refines such attempts).
    """

    prompt: Any
    completion: str
    completion_ids: list[int]
    reward: float
    answer: str | None
    reference: str | None
    row: dict
    policy: Any = None
    correct: bool = False


@dataclass
class Feedback:
    """What a builder returns: ``text`` goes into the regeneration context; ``pivot`` (optional)
    is the index of the attempt's first wrong token, where a retry restarts (``algo.inject.pivot:
    feedback`` uses it; None: the injection's own pivot rule)."""

    text: str
    pivot: int | None = None


FeedbackBuilder = Callable[[Attempt], "Feedback | str | None"]

#: the built-in builders' default texts ({given}, {expected}, {hint} are filled per attempt)
WRONG = "The answer {given} is wrong; the expected answer is {expected}."
MISSING = "No final answer was found; the expected answer is {expected}."
RIGHT = "The answer {given} is right; the expected answer is {expected}."
INDICATIVE = "The answer is wrong."
INDICATIVE_RIGHT = "The answer is right."
HINT = "A correct solution begins: {hint}"
#: what the policy is asked to critique its own attempt with (feedback: self)
CRITIQUE = ("{prompt}\nAttempt: {attempt}\nThe expected answer is {expected}. Find the first error in the attempt "
            "and say how to fix it, without writing the solution.\nCritique:")


class VerifierFeedback:
    """The verifier's message: the answer given (after ``marker``), whether it is right, and the expected one.

    Formula: c = right.format(given, expected) if the attempt is correct, else wrong.format(given, expected) if an answer follows {marker}, else missing.format(expected)
    Paper: Critique-GRPO, "Critique-GRPO: Advancing LLM Reasoning with Natural Language and Numerical Feedback" (arXiv 2506.03106), its critique with ground truth.
    """

    def __init__(self, *, marker: str = "####", wrong: str = WRONG, missing: str = MISSING, right: str | None = None):
        self.marker = marker
        self.wrong = check_template(wrong, ("given", "expected"), "algo.inject.wrong", WRONG)
        self.missing = check_template(missing, ("expected",), "algo.inject.missing", MISSING)
        # None: this builder is shown failed attempts only (its text stays out of texts()); a correct one gets RIGHT
        self.right = None if right is None else check_template(right, ("given", "expected"), "algo.inject.right", RIGHT)

    def texts(self) -> list[str]:
        return [template_text(t) for t in (self.wrong, self.missing, self.right) if t is not None]

    def __call__(self, attempt: Attempt) -> Feedback | None:
        if attempt.answer is None:
            return None
        expected = extract_after_marker(str(attempt.answer), self.marker) or str(attempt.answer).strip()
        given = extract_after_marker(attempt.completion, self.marker)
        if attempt.correct:  # refine: all (the authors' "The generated solution is correct, the ground truth is X.")
            return Feedback((self.right or RIGHT).format(given=(given or "").strip() or expected, expected=expected))
        if given is None or not given.strip():
            return Feedback(self.missing.format(expected=expected))
        return Feedback(self.wrong.format(given=given.strip(), expected=expected))


class IndicativeFeedback:
    """Only whether the attempt is right.

    Formula: c = {right_text} if the attempt is correct else {text}
    Paper: Critique-GRPO (arXiv 2506.03106), its indicative critique.
    """

    def __init__(self, *, text: str = INDICATIVE, right_text: str | None = None):
        self.text, self.right_text = text, right_text  # right_text None: shown failed attempts only

    def texts(self) -> list[str]:
        return [self.text] + ([self.right_text] if self.right_text is not None else [])

    def __call__(self, attempt: Attempt) -> Feedback:
        return Feedback((self.right_text or INDICATIVE_RIGHT) if attempt.correct else self.text)


class HintFeedback:
    """The first ``fraction`` of the reference solution's characters.

    Formula: c = hint_template.format(hint = s[:round(fraction |s|)])
    """

    def __init__(self, *, fraction: float = 0.5, hint_template: str = HINT):
        if not 0.0 < float(fraction) <= 1.0:
            raise ConfigError(f"algo.inject.fraction must be in (0, 1], got {fraction!r}")
        self.fraction = float(fraction)
        self.template = check_template(hint_template, ("hint",), "algo.inject.hint_template", HINT)

    def texts(self) -> list[str]:
        return [template_text(self.template)]

    def __call__(self, attempt: Attempt) -> Feedback | None:
        if not attempt.reference:
            return None
        ref = attempt.reference
        return Feedback(self.template.format(hint=ref[: max(1, round(self.fraction * len(ref)))]))


class SelfCritique:
    """The policy's own critique of its failed attempt, written inside the step.

    Formula: c ~ pi_old(. | request(x, y_a, expected)), at most {critique_tokens} tokens; c is context of the refinement, not trained
    Paper: Critique-GRPO (arXiv 2506.03106) and R3L (arXiv 2601.03715) train with critiques/reflections on failed attempts; here the policy writes them.
    """

    def __init__(self, *, marker: str = "####", request: str = CRITIQUE, critique_tokens: int = 64):
        self.marker = marker
        self.request = check_template(request, ("prompt", "attempt", "expected"), "algo.inject.request", CRITIQUE)
        if "{attempt}" not in request:
            raise ConfigError("algo.inject.request must contain {attempt} (the policy critiques it), e.g. "
                              "'{prompt}\\nAttempt: {attempt}\\nCritique:'")
        if int(critique_tokens) < 1:
            raise ConfigError(f"algo.inject.critique_tokens must be >= 1, got {critique_tokens}")
        self.tokens = int(critique_tokens)

    def texts(self) -> list[str]:
        return [template_text(self.request)]

    def __call__(self, attempt: Attempt) -> Feedback | None:
        if attempt.policy is None:
            raise RuntimeError("feedback: self needs the policy's handle (Attempt.policy), and none was given")
        expected = "" if attempt.answer is None else (
            extract_after_marker(str(attempt.answer), self.marker) or str(attempt.answer).strip())
        w = attempt.policy.write(in_last_user(attempt.prompt, self.request, attempt=attempt.completion, expected=expected),
                                 max_new_tokens=self.tokens)
        return Feedback(w.text.strip()) if w.text.strip() else None


#: the ``algo.inject`` keys each built-in builder reads (in the order messages list the builders)
BUILDER_PARAMS = {"verifier": ("marker", "wrong", "missing", "right"), "indicative": ("text", "right_text"),
                  "hint": ("fraction", "hint_template"), "self": ("marker", "request", "critique_tokens")}
#: name -> the builder's class (its keyword parameters come from ``algo.inject``; :class:`mixrl.registry.Registry`)
BUILDERS = Registry("feedback builder")
BUILDERS.add("verifier", VerifierFeedback)
BUILDERS.add("indicative", IndicativeFeedback)
BUILDERS.add("hint", HintFeedback)
BUILDERS.add("self", SelfCritique)


def build_feedback(name: str, params: dict) -> FeedbackBuilder:
    """The builder named ``name`` (built-in, or ``module:function`` / ``file.py:function``)."""
    if name in BUILDERS:
        return BUILDERS[name](**{k: v for k, v in params.items() if k in BUILDER_PARAMS[name] and v is not None})
    if ":" not in str(name):
        raise ConfigError(f"algo.inject.feedback={name!r} is not a feedback builder; use one of "
                          f"{', '.join(BUILDER_PARAMS)} or module:function (a callable Attempt -> Feedback | str | None)")
    try:
        fn = _import_object(str(name))
    except Exception as e:  # noqa: BLE001 - any import failure is the user's path
        raise ConfigError(f"algo.inject.feedback={name!r} could not be loaded ({str(e).splitlines()[0]}); "
                          "give module:function or path/to/file.py:function") from None
    if not callable(fn):
        raise ConfigError(f"algo.inject.feedback={name!r} is not callable; give a function Attempt -> Feedback | str | None")
    return fn


#: what a builder must return, as its error says
RETURNS = "Feedback, str or None (a function Attempt -> Feedback | str | None)"


def feedback_problem(value: Any) -> str | None:
    """Why ``value`` is not what a builder may return (None when it is)."""
    if value is None or isinstance(value, str):
        return None
    if not isinstance(value, Feedback):
        return "not feedback"
    if not isinstance(value.text, str):
        return f"Feedback.text is {type(value.text).__name__}, not str"
    p = value.pivot
    if p is not None and (isinstance(p, bool) or not isinstance(p, int) or p < 0):
        return f"Feedback.pivot is {p!r}, not a token index >= 0 (or None)"
    return None


def call_builder(builder: FeedbackBuilder, name: str, attempt: Attempt) -> Feedback | None:
    """``builder(attempt)`` through the guard of every user function (:func:`mixrl.errors.call_user_function`):
    a raise, or a value other than Feedback / str / None, is a one-line UserFunctionError naming
    ``algo.inject.feedback`` and what it returned."""
    out = call_user_function(builder, f"algo.inject.feedback={name!r}", attempt, expects=RETURNS, accept=feedback_problem)
    return as_feedback(out)


def as_feedback(value: Any) -> Feedback | None:
    """A builder's return value as :class:`Feedback` (a plain string is its text)."""
    if value is None or isinstance(value, Feedback):
        return value
    if isinstance(value, str):
        return Feedback(value)
    raise TypeError(f"a feedback builder must return Feedback, str or None, got {type(value).__name__}")


def divergence(attempt_ids: list[int], reference_ids: list[int]) -> int:
    """The first index where ``attempt_ids`` departs from ``reference_ids`` (their common prefix's length)."""
    n = 0
    for a, b in zip(attempt_ids, reference_ids):
        if a != b:
            break
        n += 1
    return n
