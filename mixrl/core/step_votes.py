"""Voting over a generative PRM's critiques: which steps of a solution are wrong (CAPO).

CAPO ("CAPO: Towards Enhancing LLM Reasoning through Generative Credit Assignment", Xie et al. 2025,
arXiv 2508.02298) asks an LLM, as a generative process reward model, to read a whole solution whose
steps are numbered and to list its wrong steps in one pass; it asks K times and votes. The authors'
overview figure (andyclsr/CAPO @ 95b8f3492234fea145d1e94ef4eb04e9468fa9bc, ``capo_overview.png``)
shows four critiques [1,3], [1,2,3], [1,3], [2,3] voted to [1,3] and names the rules Union,
Intersect and Average. The authors' code is not published ("Code is Coming Soon" in that README).

* :func:`parse_wrong_steps`: the set of step numbers (1-based) one critique names, from the first
  match of its pattern (``Wrong steps: [1, 3]`` or ``Wrong steps: none``); None when nothing matches
  (an unparsable critique abstains from the vote). Numbers outside 1..n are ignored.
* :func:`vote`: per step, the penalty in [0, 1] from the K' parsable critiques, with c_j the number
  of them naming step j:

  - ``majority``: 1 if c_j > K'/2 else 0 (the figure's example: [1,3] from the four critiques);
  - ``union``: 1 if c_j >= 1; ``intersect``: 1 if c_j = K';
  - ``average``: c_j / K' (mixrl's reading of the figure's "Average": the share of critiques).

  No parsable critique: every penalty is 0 (the outcome alone decides, as in plain RLVR).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

VOTES = ("majority", "union", "intersect", "average")
WRONG_STEPS_PATTERN = r"(?i)wrong\s+steps?\s*:\s*(\[[^\]]*\]|none)"


def parse_wrong_steps(text: str, n_steps: int, pattern: str = WRONG_STEPS_PATTERN) -> set[int] | None:
    """The 1-based step numbers a critique names as wrong (first match of ``pattern``, whose first
    group is a bracketed list or ``none``), or None if it names none in that form."""
    m = re.search(pattern, text or "")
    if m is None:
        return None
    body = m.group(1) if m.groups() else m.group(0)
    if body.strip().lower() == "none":
        return set()
    return {int(k) for k in re.findall(r"\d+", body) if 1 <= int(k) <= n_steps}


def vote(critiques: Sequence[set[int] | None], n_steps: int, mode: str = "majority") -> list[float]:
    """Per step (0-based list of ``n_steps``), the voted penalty in [0, 1] (module docstring).

    Formula: c_j = #{k : j in W_k} over the K' parsable critiques W_k; majority: [c_j > K'/2], union: [c_j >= 1], intersect: [c_j = K'], average: c_j / K'
    """
    if mode not in VOTES:
        raise ValueError(f"vote must be one of {VOTES}, got {mode!r}")
    parsed = [c for c in critiques if c is not None]
    k = len(parsed)
    if k == 0:
        return [0.0] * n_steps
    counts = [sum(1 for c in parsed if j + 1 in c) for j in range(n_steps)]
    if mode == "majority":
        return [1.0 if 2 * c > k else 0.0 for c in counts]
    if mode == "union":
        return [1.0 if c >= 1 else 0.0 for c in counts]
    if mode == "intersect":
        return [1.0 if c == k else 0.0 for c in counts]
    return [c / k for c in counts]


def numbered_steps(text: str, spans: Sequence[tuple[int, int]]) -> str:
    """The solution as the critique prompt shows it: ``Step 1: ...`` one per line (each step's own
    text, stripped)."""
    return "\n".join(f"Step {j + 1}: {text[a:b].strip()}" for j, (a, b) in enumerate(spans))


def genprm_formula(params: dict) -> str:
    """The explain row's sentence for ``scorer=genprm`` (``params``: its scorer_params, defaults filled here)."""
    votes, mode = params.get("votes", 4), params.get("vote", "majority")
    rule = {"majority": "[c_j > K/2]", "union": "[c_j >= 1]", "intersect": "[c_j = K]", "average": "c_j / K"}.get(mode, mode)
    return (f"Step scores from a generative PRM (CAPO): the whole solution, steps numbered, critiqued K = {votes} times "
            f"(temperature {params.get('temperature', 0.7)}), each critique naming its wrong steps; "
            f"s_j = 1 - {rule} ({mode} vote), c_j = the parsable critiques naming step j (an unparsable one abstains)")
