"""Built-in tool task ``arith_tools``: add two large numbers, with a calculator at hand.

A level-``L`` problem adds two ``L + 2``-digit numbers (level 1: ``"634+139="``, level 3: two
5-digit numbers). The tiny models cannot add such numbers in their heads (the plain ``arith``
task adds single digits), but one call of the calculator does it::

    prompt   = "4821+7390="
    answer   = "12211"
    messages = [user "4821+7390=",
                assistant  tool_calls=[calculator(expression="4821+7390")],
                tool       "12211",
                assistant  "#### 12211"]

:func:`expert_messages` is the expert's trajectory in the chat format transformers' templates
take (``tool_calls`` on the assistant message, a ``tool`` message with the result), the
off-policy source of the tool methods; :func:`direct_solution` is what a model without tools
writes (the answer straight after ``####``). The answer is read as in ``arith`` (after ``####``).
Train and held-out problems never overlap (``arith.is_heldout`` of the prompt).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from mixrl.tasks import arith

NAME = "arith_tools"
#: Bump when problems, trajectories or the split change (part of cached warm-start keys).
TASK_VERSION = "1"
LEVELS: tuple[int, ...] = (1, 2, 3)
DEFAULT_LEVELS: tuple[int, ...] = (1, 2)
TOOL = "calculator"
#: The system message of the tool task's prompts.
SYSTEM_PROMPT = "Add the numbers. Use the calculator. Write the answer after ####."


def digits(level: int) -> int:
    """Digits of each number at ``level``."""
    return level + 2


def make_problem(a: int, b: int, level: int) -> dict[str, Any]:
    prompt = f"{a}+{b}="
    answer = str(a + b)
    return {"prompt": prompt, "answer": answer, "solution": direct_solution(answer), "level": level}


def direct_solution(answer: str) -> str:
    """The completion without a tool: the answer after ``####``."""
    return f"{arith.ANSWER_MARKER} {answer}"


def tool_call(problem: dict[str, Any]) -> dict[str, Any]:
    """The calculator call that solves ``problem`` (transformers' ``tool_calls`` entry)."""
    return {"type": "function", "function": {"name": TOOL, "arguments": {"expression": problem["prompt"].rstrip("=")}}}


def expert_messages(problem: dict[str, Any], system: str | None = SYSTEM_PROMPT) -> list[dict[str, Any]]:
    """The expert's trajectory: the prompt, one calculator call, its result, the answer."""
    msgs = [{"role": "system", "content": system}] if system else []
    return msgs + [
        {"role": "user", "content": problem["prompt"]},
        {"role": "assistant", "content": "", "tool_calls": [tool_call(problem)]},
        {"role": "tool", "name": TOOL, "content": problem["answer"]},
        {"role": "assistant", "content": direct_solution(problem["answer"])},
    ]


def generate(n: int, *, seed: int, levels: Sequence[int] = DEFAULT_LEVELS, split: str = "train") -> list[dict[str, Any]]:
    """``n`` problems, deterministic in ``(n, seed, levels, split)``, levels balanced and shuffled."""
    levels = [int(x) for x in levels]
    bad = [x for x in levels if x not in LEVELS]
    if not levels or bad:
        raise ValueError(f"arith_tools levels must be a non-empty subset of {list(LEVELS)}, got {levels}")
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    rng = random.Random(f"{NAME}-{TASK_VERSION}-{seed}-{split}")
    plan = [levels[i % len(levels)] for i in range(n)]
    rng.shuffle(plan)
    out = []
    for level in plan:
        lo, hi = 10 ** (digits(level) - 1), 10 ** digits(level) - 1
        while True:
            p = make_problem(rng.randint(lo, hi), rng.randint(lo, hi), level)
            if arith.is_heldout(p["prompt"]) == (split == "heldout"):
                break
        out.append(p)
    return out


def train_split(n: int, *, seed: int, levels: Sequence[int] = DEFAULT_LEVELS) -> list[dict[str, Any]]:
    return generate(n, seed=seed, levels=levels, split="train")


def heldout_split(n: int, *, seed: int = 1234, levels: Sequence[int] = DEFAULT_LEVELS) -> list[dict[str, Any]]:
    return generate(n, seed=seed, levels=levels, split="heldout")
