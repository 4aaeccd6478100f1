"""``arith_steps``: an offline expert trajectory of the built-in ``arith`` task, one running sum per turn.

The toy stand-in for the offline GUI trajectories of UI-S1 ("UI-S1: Advancing GUI Automation via
Semi-online Reinforcement Learning", arXiv 2509.11543) and BEPA ("From Off-Policy to On-Policy:
Enhancing GUI Agents via Bi-level Expert-to-Policy Assimilation", arXiv 2601.05787). A problem
``d_0+d_1+...+d_T=`` is a trajectory of T expert actions ``#### s_k`` (s_k = d_0 + ... + d_k, the
task's running sums). Turn k (1-based) is the policy's action at expert step k; the next
observation is the next digit (``+d_{k+1}``), what the offline data shows after the expert's step,
whatever the policy did (an offline trajectory cannot follow a diverging action).

Per-turn reward, in the form of the authors' step score (``gui_traj.py``: ``0.1 format + 0.9 action``;
here the format is the answer marker, the action an exact match)::

    r_k = 0.1 [the action has "#### <n>"] + 0.9 [n == s_k]

A matching action moves to step k + 1 (the last one ends the episode, ``solved``); a diverging one
ends the episode unless an episode injection patches it (:meth:`patch`: the expert's action is
taken instead, :mod:`mixrl.envs.patching`). :meth:`plan` is the trajectory as a compact plan
(BEPA's plan conditioning, :mod:`mixrl.sources.reachable_cache`).
"""

from __future__ import annotations

import re
from typing import Any

from mixrl.envs.base import Step
from mixrl.tasks.arith import ANSWER_MARKER, extract_answer

FORMAT_WEIGHT = 0.1
MATCH_WEIGHT = 0.9
_PROBLEM = re.compile(r"(\d(?:\+\d)+)=")


def running_sums(text: str) -> tuple[list[int], list[int]]:
    """The digits and running sums of the last ``d+d+...=`` problem in ``text``; ValueError without one."""
    found = _PROBLEM.findall(text)
    if not found:
        raise ValueError(f"arith_steps: no 'd+d+...=' problem in {text[-60:]!r}")
    digits = [int(x) for x in found[-1].split("+")]
    sums, total = [], digits[0]
    for d in digits[1:]:
        total += d
        sums.append(total)
    return digits, sums


def _prompt_text(problem: dict[str, Any]) -> str:
    prompt = problem.get("prompt", "")
    if isinstance(prompt, list):  # a conversation: the last user message
        users = [m.get("content", "") for m in prompt if m.get("role") == "user"]
        prompt = users[-1] if users else ""
    return str(prompt)


class ArithSteps:
    """One ``arith`` problem as an offline expert trajectory of running sums."""

    #: tokens of one observation turn on the built-in BPE chat model (``\n<|im_start|>user\n+7<|im_end|>\n<|im_start|>assistant\n``): `mixrl plan`'s count
    OBSERVATION_TOKENS = 14
    #: this environment takes UI-S1's patches and BEPA's plan conditioning (:mod:`mixrl.envs.patching`)
    EPISODE_INJECTIONS = ("patch", "reachable")

    def __init__(self) -> None:
        self.digits: list[int] = []
        self.sums: list[int] = []
        self.t = 0
        self.diverged = False
        self.patches = 0

    def reset(self, problem: dict[str, Any]) -> str | None:
        self.digits, self.sums = running_sums(_prompt_text(problem))
        self.t, self.diverged, self.patches = 0, False, 0
        return None  # the row's prompt is the first observation

    @property
    def solved(self) -> bool:
        """Every expert step matched by the policy's own actions (no patch)."""
        return self.t == len(self.sums) and self.patches == 0

    def expert_action(self) -> str | None:
        """The expert's action at the current step (None past the last)."""
        return f"{ANSWER_MARKER} {self.sums[self.t]}" if self.t < len(self.sums) else None

    def plan(self) -> str:
        """The trajectory as a compact plan (BEPA's LEVEL-1 abstraction of the expert trace)."""
        return " plan: " + " ".join(str(s) for s in self.sums)

    def _advance(self) -> Step:
        self.t += 1
        done = self.t == len(self.sums)
        return Step("" if done else f"+{self.digits[self.t + 1]}", 0.0, done)

    def step(self, action: str) -> Step:
        if not self.sums or self.diverged or self.t >= len(self.sums):
            raise RuntimeError("step before reset, after a divergence or past the last expert step")
        answer = extract_answer(action)
        matched = answer is not None and answer == str(self.sums[self.t])
        reward = FORMAT_WEIGHT * (answer is not None) + MATCH_WEIGHT * matched
        if not matched:
            self.diverged = True
            return Step("", reward, True)
        nxt = self._advance()
        return Step(nxt.observation, reward, nxt.done)

    def patch(self) -> tuple[str, Step]:
        """After a diverging action: the expert's action taken instead (its text, and what the
        trajectory shows next; reward 0: the policy did not act)."""
        if not self.diverged:
            raise RuntimeError("patch without a diverging action")
        text = self.expert_action()
        self.diverged, self.patches = False, self.patches + 1
        return text, self._advance()
