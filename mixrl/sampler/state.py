"""Per-prompt history: what the sampler knows about each training prompt.

For prompt ``i`` (its index in the training set) :class:`PromptState` keeps the times its
group was generated (``seen``), the sum of its rollouts' rewards (``reward_sum``) and their
number (``rollouts``), decayed success / failure counts (``successes``, ``failures``: the Beta
posterior of its accuracy, see below) and the last step it was generated at (``last_step``).

Accuracy estimate (the posterior mean of a Beta(a0, b0) prior updated by Bernoulli outcomes):

    acc_i = (a0 + s_i) / (a0 + b0 + s_i + f_i)

Decay (``decay`` = lambda in [0, 1]; 1: none): each update first multiplies the prompt's counts
by lambda, so evidence from k updates ago weighs lambda^k; the policy moves, and old outcomes
describe an older policy (the prior decay of "VADE: Variance-Aware Dynamic Sampling via Online
Sample-Level Difficulty Estimation for Multimodal RL"; one scale here, not the paper's two).

A prompt never generated has no entry: its estimate is the prior mean a0 / (a0 + b0).
``state_dict`` / ``load_state_dict`` round-trip through JSON (checkpoints).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PromptRecord:
    seen: int = 0
    rollouts: int = 0
    reward_sum: float = 0.0
    successes: float = 0.0
    failures: float = 0.0
    last_step: int = -1


class PromptState:
    """The history of every prompt generated so far (see the module docstring)."""

    def __init__(self, *, decay: float = 1.0, a0: float = 1.0, b0: float = 1.0):
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"decay={decay} must be in [0, 1]")
        if a0 <= 0 or b0 <= 0:
            raise ValueError("the Beta prior needs a0 > 0 and b0 > 0")
        self.decay, self.a0, self.b0 = float(decay), float(a0), float(b0)
        self.records: dict[int, PromptRecord] = {}

    def update(self, index: int, rewards: list[float], correct: list[bool], step: int) -> None:
        """One generated group of prompt ``index``: its rollouts' rewards and whether each
        was correct, at optimizer step ``step``."""
        r = self.records.setdefault(int(index), PromptRecord())
        r.successes *= self.decay
        r.failures *= self.decay
        n_ok = sum(1 for c in correct if c)
        r.successes += n_ok
        r.failures += len(correct) - n_ok
        r.seen += 1
        r.rollouts += len(rewards)
        r.reward_sum += float(sum(rewards))
        r.last_step = int(step)

    def accuracy(self, index: int) -> float:
        """Posterior mean accuracy (a0 + s) / (a0 + b0 + s + f); the prior mean when unseen."""
        r = self.records.get(int(index))
        s, f = (r.successes, r.failures) if r else (0.0, 0.0)
        return (self.a0 + s) / (self.a0 + self.b0 + s + f)

    def beta(self, index: int) -> tuple[float, float]:
        """The posterior's (alpha, beta) = (a0 + s, b0 + f)."""
        r = self.records.get(int(index))
        s, f = (r.successes, r.failures) if r else (0.0, 0.0)
        return self.a0 + s, self.b0 + f

    def seen(self, index: int) -> int:
        r = self.records.get(int(index))
        return r.seen if r else 0

    def mean_reward(self, index: int) -> float | None:
        r = self.records.get(int(index))
        return r.reward_sum / r.rollouts if r and r.rollouts else None

    def state_dict(self) -> dict:
        return {"decay": self.decay, "a0": self.a0, "b0": self.b0,
                "records": {str(k): [v.seen, v.rollouts, v.reward_sum, v.successes, v.failures, v.last_step]
                            for k, v in sorted(self.records.items())}}

    def load_state_dict(self, state: dict) -> None:
        self.decay, self.a0, self.b0 = float(state["decay"]), float(state["a0"]), float(state["b0"])
        self.records = {int(k): PromptRecord(int(v[0]), int(v[1]), float(v[2]), float(v[3]), float(v[4]), int(v[5]))
                        for k, v in state["records"].items()}

    def __len__(self) -> int:
        return len(self.records)
