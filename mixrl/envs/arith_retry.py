"""``arith_retry``: the built-in task with a retry. The policy answers an ``arith`` problem; a
wrong answer gets the observation ``wrong`` (``no ####`` without an answer) and another turn, up to ``env.max_turns``.

Per-turn reward (the episode's return is their sum)::

    correct answer (after ####)  -> +1.0, episode ends
    wrong or missing answer      -> -0.5 (WRONG_REWARD), observation "wrong" (or "no ####")

So the return is 1 - 0.5 k for a problem solved after k wrong answers, and -0.5 T when all T
turns are wrong: a first-try answer is worth most, a late one still beats none. The per-turn
rewards are mixrl's design for a small task (turn-level rewards as MT-GRPO's, "Reinforcing
Multi-Turn Reasoning in LLM Agents via Turn-Level Credit Assignment", arXiv 2505.11821, uses
them). Multi-turn agent RL: "ArCHer: Training Language Model Agents via Hierarchical Multi-Turn
RL" (arXiv:2402.19446); "Reinforcement Learning for Long-Horizon Interactive LLM Agents" (LOOP,
arXiv:2502.01600) trains an agent directly in a stateful environment ("We present a
reinforcement learning (RL) approach that trains IDAs directly in their target environments",
abstract) but does not use per-turn rewards.
"""

from __future__ import annotations

from typing import Any

from mixrl.envs.base import Step
from mixrl.tasks.arith import extract_answer, verify

CORRECT_REWARD = 1.0
WRONG_REWARD = -0.5
WRONG = "wrong"
NO_ANSWER = "no ####"


class ArithRetry:
    """One ``arith`` problem, retried after a wrong answer."""

    #: tokens of one observation turn on the built-in BPE chat model (``\n<|im_start|>user\nwrong<|im_end|>\n<|im_start|>assistant\n``): `mixrl plan`'s count
    OBSERVATION_TOKENS = 14

    def __init__(self) -> None:
        self.answer: str | None = None
        self.solved = False

    def reset(self, problem: dict[str, Any]) -> str | None:
        self.answer, self.solved = str(problem["answer"]).strip(), False
        return None  # the row's prompt is the first observation

    def step(self, action: str) -> Step:
        if self.answer is None:
            raise RuntimeError("step before reset")
        if verify(action, self.answer):
            self.solved = True
            return Step("", CORRECT_REWARD, True)
        return Step(WRONG if extract_answer(action) is not None else NO_ANSWER, WRONG_REWARD, False)
