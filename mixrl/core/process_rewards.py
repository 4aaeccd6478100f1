"""Process rewards to tokens: a completion cut into steps, one score per step, each step's score
put on that step's tokens as a dense reward (the input of GAE: ``algo.advantage.name=gae`` with a critic).

Segmentation (:func:`step_spans`): a step ends right after each occurrence of ``separator`` (it keeps
its separator), the last step at the end of the text; empty steps are dropped. ``separator`` is a
plain string (``"\\n\\n"`` for paragraphs, ``"\\n"`` for lines, ``" "`` for the built-in task's sums)
or, with ``regex=True``, a regular expression (e.g. ``"Step \\d+:"`` to cut *before* each marker: a
match of zero width, ``(?=Step \\d+:)``).

Mapping (:func:`step_token_rewards`): token ``t`` (its text ends at character ``e_t``) belongs to the first
step whose span ends at or after ``e_t`` (a token straddling a boundary belongs to the step its last
character is in). ``placement``:

* ``last``: the step's score on its last token, 0 on the others (a PRM's convention: the value
  function and GAE carry it back to the step's earlier tokens);
* ``each``: the step's score on every one of its tokens (CAPO's token-level credit: every token of a
  step judged wrong is penalised);
* ``spread``: the score divided evenly over the step's tokens (the row's total stays the sum of the scores).

Paper: "CAPO: Towards Enhancing LLM Reasoning through Generative Credit Assignment" (Xie et al. 2025,
arXiv 2508.02298): a generative process reward model judges each step in one pass and the tokens of
wrong steps receive a penalty on top of the verifiable outcome reward.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

PLACEMENTS = ("last", "each", "spread")


def step_spans(text: str, separator: str, *, regex: bool = False) -> list[tuple[int, int]]:
    """The ``(start, end)`` character spans of ``text``'s steps (see the module docstring)."""
    if not text:
        return []
    cuts: list[int] = []
    if regex:
        for m in re.finditer(separator, text):
            cuts.append(m.end() if m.end() > m.start() else m.start())
    else:
        if not separator:
            raise ValueError("separator must be a non-empty string")
        i = text.find(separator)
        while i >= 0:
            cuts.append(i + len(separator))
            i = text.find(separator, i + len(separator))
    spans, start = [], 0
    for c in sorted(set(cuts)) + [len(text)]:
        if c > start:
            spans.append((start, c))
            start = c
    return spans


def token_char_ends(pieces: Sequence[str]) -> list[int]:
    """The character where each token's text ends, from the decoded prefixes' lengths
    (``pieces[k]`` = the text of tokens ``0..k``); never decreasing."""
    out, best = [], 0
    for p in pieces:
        best = max(best, len(p))
        out.append(best)
    return out


def step_token_rewards(step_ends: Sequence[int], token_ends: Sequence[int], scores: Sequence[float],
                       placement: str = "last") -> list[float]:
    """One reward per token: each step's score put on its tokens by ``placement`` (module docstring).

    ``step_ends``: each step's end character (increasing); ``token_ends``: each token's end character;
    ``scores``: one per step. A token after the last step's end (e.g. eos, which decodes to nothing past
    the text) belongs to no step and gets 0; a step with no token of its own gives nothing.

    Formula: last: r_t = s_j if t is step j's last token else 0; each: r_t = s_j for t in step j; spread: r_t = s_j / |step j|
    """
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    if len(step_ends) != len(scores):
        raise ValueError(f"{len(step_ends)} steps but {len(scores)} scores")
    owner: list[int | None] = []
    j = 0
    for e in token_ends:
        while j < len(step_ends) and step_ends[j] < e:
            j += 1
        owner.append(j if j < len(step_ends) else None)
    # a token that adds no character (eos, a special token) after a step's end belongs to no step
    for t in range(len(token_ends)):
        if owner[t] is not None and t > 0 and token_ends[t] == token_ends[t - 1] and token_ends[t] >= step_ends[-1]:
            owner[t] = None
    members: dict[int, list[int]] = {}
    for t, o in enumerate(owner):
        if o is not None:
            members.setdefault(o, []).append(t)
    out = [0.0] * len(token_ends)
    for step, toks in members.items():
        s = float(scores[step])
        if placement == "last":
            out[toks[-1]] = s
        elif placement == "each":
            for t in toks:
                out[t] = s
        else:
            for t in toks:
                out[t] = s / len(toks)
    return out


def reference_step_scores(text: str, spans: Sequence[tuple[int, int]], reference: str, separator: str, *,
                          regex: bool = False) -> list[float]:
    """A step scorer that reads a worked reference solution (``scorer=reference``): step ``j`` of ``text``
    scores 1 when its text (stripped) equals step ``j`` of ``reference`` cut the same way, else 0 (a step
    past the reference's last one scores 0). An oracle PRM for tasks whose solutions are written step by
    step in one canonical way (the built-in task's running sums), where no learned PRM is at hand.

    Formula: s_j = 1[strip(y_j) = strip(ref_j)]"""
    ref_spans = step_spans(reference or "", separator, regex=regex)
    ref = [reference[a:b].strip() for a, b in ref_spans]
    return [1.0 if j < len(ref) and text[a:b].strip() == ref[j] else 0.0 for j, (a, b) in enumerate(spans)]


def first_wrong_step(scores: Sequence[float], threshold: float = 0.5) -> int | None:
    """The index of the first step scored below ``threshold`` (None when every step passes)."""
    return next((j for j, s in enumerate(scores) if s < threshold), None)
