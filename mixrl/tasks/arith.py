"""Built-in synthetic verifiable task ``arith``: add a chain of single digits.

A level-``L`` problem adds ``L + 1`` single digits (level 1: ``"3+5="``, level 5:
``"3+5+2+9+0+7="``). The expert solution writes the running sums, then the final
answer after ``####``::

    prompt   = "3+5+2+9="
    solution = "8 10 19 #### 19"
    answer   = "19"

Longer chains need more steps, so difficulty grows with the level; the tiny model
is warm-started on levels 1-3 (``EASY_LEVELS``), the default training mix is levels
1-4 (``DEFAULT_LEVELS``), and levels 5-6 are beyond the warm-started model, the
regime where mixing in expert data (CHORD, LUFFY) is supposed to help. Sequences
stay short (prompt + solution at most 39 characters, level 6) so that CPU
generation is fast. Level 1 has only 100 distinct problems (20 held out), level 2
has 1,000; higher levels have 10,000+.

Train and held-out problems never overlap: a problem belongs to the held-out split
iff a hash of its prompt falls in the top ``HELDOUT_FRACTION`` of the hash range.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from typing import Any, Literal

NAME = "arith"
#: Bump when problems, solutions or the split change (it is part of cached warm-start keys).
TASK_VERSION = "1"
#: Every character that can appear in a prompt, a solution or a well-formed completion.
ALPHABET = "0123456789+= #"
LEVELS: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
#: Default training mix (held-out evaluation uses the same levels).
DEFAULT_LEVELS: tuple[int, ...] = (1, 2, 3, 4)
#: Levels used for the supervised warm start of the tiny model.
EASY_LEVELS: tuple[int, ...] = (1, 2, 3)
ANSWER_MARKER = "####"
HELDOUT_FRACTION = 0.2
#: Upper bounds (characters) over all levels, for choosing generation lengths.
MAX_PROMPT_CHARS = 2 * (max(LEVELS) + 1)  # "d+d+...+d="
MAX_SOLUTION_CHARS = 3 * max(LEVELS) + len(ANSWER_MARKER) + 1 + 2  # sums, "####", " ", answer

Split = Literal["train", "heldout", "all"]

_ANSWER_RE = re.compile(r"####\s*(-?\d+)\s*")


def num_terms(level: int) -> int:
    """Number of digits added at ``level``."""
    return level + 1


def is_heldout(prompt: str) -> bool:
    """Whether ``prompt`` belongs to the held-out split (deterministic, hash based)."""
    h = int.from_bytes(hashlib.blake2b(prompt.encode(), digest_size=8).digest(), "big")
    return h / 2**64 >= 1.0 - HELDOUT_FRACTION


def make_problem(terms: Sequence[int]) -> dict[str, Any]:
    """Build the problem that adds ``terms`` (each a digit 0-9)."""
    if len(terms) < 2 or any(not 0 <= t <= 9 for t in terms):
        raise ValueError(f"need at least two digits 0-9, got {list(terms)}")
    prompt = "+".join(str(t) for t in terms) + "="
    sums, total = [], terms[0]
    for t in terms[1:]:
        total += t
        sums.append(str(total))
    answer = str(total)
    solution = " ".join(sums) + f" {ANSWER_MARKER} {answer}"
    return {"prompt": prompt, "answer": answer, "solution": solution, "level": len(terms) - 1}


def careless_solution(problem: dict[str, Any]) -> str:
    """What a careless demonstrator writes: the worked solution without the last term (a wrong answer).

    ``"3+5+2="`` -> ``"8 #### 8"``; for two terms, ``"3+5="`` -> ``"3 #### 3"``. The tiny
    model's warm start imitates a mix of expert and careless demonstrations, so RL has a
    behaviour to unlearn (see ``mixrl.models.tiny``).
    """
    terms = [int(t) for t in problem["prompt"].rstrip("=").split("+")]
    if len(terms) == 2:
        return f"{terms[0]} {ANSWER_MARKER} {terms[0]}"
    return make_problem(terms[:-1])["solution"]


def _check_levels(levels: Sequence[int]) -> list[int]:
    levels = [int(x) for x in levels]
    if not levels:
        raise ValueError("levels must not be empty")
    bad = [x for x in levels if x not in LEVELS]
    if bad:
        raise ValueError(f"unknown arith level(s) {bad}; levels are {list(LEVELS)}")
    return levels


def generate(
    n: int,
    *,
    seed: int,
    levels: Sequence[int] = DEFAULT_LEVELS,
    split: Split = "train",
) -> list[dict[str, Any]]:
    """``n`` problems, deterministic in ``(n, seed, levels, split)``.

    Levels are balanced (counts differ by at most one, in the order given; repeat a
    level in ``levels`` to weight it) and the order is shuffled. Problems are distinct within a level while that level's
    split has unused problems left (level 1 has only ~20 held-out problems; after
    that they repeat). Each problem is a dict with ``prompt``, ``answer``,
    ``solution`` (expert completion) and ``level``.
    """
    if split not in ("train", "heldout", "all"):
        raise ValueError(f"split must be 'train', 'heldout' or 'all', got {split!r}")
    levels = _check_levels(levels)
    rng = random.Random(f"{NAME}-{TASK_VERSION}-{seed}-{split}")
    plan = [levels[i % len(levels)] for i in range(n)]
    rng.shuffle(plan)
    seen: dict[int, set[str]] = {}
    exhausted: set[int] = set()  # levels whose split ran out of unused problems: repeats allowed
    out = []
    for level in plan:
        used = seen.setdefault(level, set())
        problem = None
        for attempt in range(10_000):
            p = make_problem([rng.randrange(10) for _ in range(num_terms(level))])
            if split != "all" and is_heldout(p["prompt"]) != (split == "heldout"):
                continue
            problem = p
            if level in exhausted or p["prompt"] not in used:
                break
            if attempt >= 300:
                exhausted.add(level)
                break
        assert problem is not None
        used.add(problem["prompt"])
        out.append(problem)
    return out


def train_split(n: int, *, seed: int, levels: Sequence[int] = DEFAULT_LEVELS) -> list[dict[str, Any]]:
    """``n`` training problems (never in the held-out split)."""
    return generate(n, seed=seed, levels=levels, split="train")


def heldout_split(n: int, *, seed: int = 1234, levels: Sequence[int] = DEFAULT_LEVELS) -> list[dict[str, Any]]:
    """``n`` held-out problems (never in the training split)."""
    return generate(n, seed=seed, levels=levels, split="heldout")


def extract_answer(completion: str) -> str | None:
    """The final answer of a completion, or ``None`` if it is not well formed.

    A well-formed completion ends with ``#### <integer>`` (trailing whitespace
    allowed); text after the answer, e.g. a completion that did not stop, makes it
    malformed. The integer is normalized (``"007"`` -> ``"7"``).
    """
    if not isinstance(completion, str):
        return None
    # the answer is the last "####" (a model may write "####" more than once)
    idx = completion.rfind(ANSWER_MARKER)
    if idx < 0:
        return None
    m = _ANSWER_RE.fullmatch(completion, idx)
    if m is None:
        return None
    return str(int(m.group(1)))


def verify(completion: str, answer: str) -> bool:
    """Whether ``completion`` ends with the correct final answer."""
    got = extract_answer(completion)
    if got is None:
        return False
    try:
        return got == str(int(str(answer).strip()))
    except ValueError:
        return False


def reward(completions: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
    """TRL reward function: 1.0 for a correct final answer, else 0.0.

    Reads the ``answer`` column; accepts plain-text or conversational completions.
    """
    out = []
    for c, a in zip(completions, answer, strict=True):
        if isinstance(c, list):  # conversational: [{"role": "assistant", "content": ...}]
            c = c[-1]["content"] if c else ""
        out.append(1.0 if verify(c, a) else 0.0)
    return out


reward.__name__ = "arith_correct"


def dataset(n: int, *, seed: int, levels: Sequence[int] = DEFAULT_LEVELS, split: Split = "train"):
    """Like :func:`generate`, as a ``datasets.Dataset`` (columns prompt, answer, solution, level)."""
    from datasets import Dataset  # deferred: datasets, 1 s; config show/plan import this module

    return Dataset.from_list(generate(n, seed=seed, levels=levels, split=split))
