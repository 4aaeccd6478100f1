"""Prompt pickers: which training prompts the next generation batch uses.

A picker gets the per-prompt history (:class:`mixrl.sampler.state.PromptState`), the number of
training prompts, how many to pick, a seeded ``numpy.random.Generator`` and, for the bandit,
each prompt's arm and the arms' values; it returns ``n`` distinct prompt indices (``data``
returns None: the data loader's own order, today's behaviour). The trainer seeds the generator
from the run's seed and a draw counter that checkpoints carry, so a resumed run picks the same
prompts as an uninterrupted one, and every process picks the same.
"""

from __future__ import annotations

import math

import numpy as np

from mixrl.core.registry import Registry
from mixrl.sampler.state import PromptState

PICKERS = Registry("prompt picker")


def _fill(chosen: list[int], size: int, n: int, rng: np.random.Generator) -> list[int]:
    """``chosen`` topped up to ``n`` distinct indices with uniform draws from the rest."""
    if len(chosen) >= n:
        return chosen[:n]
    taken = set(chosen)
    rest = np.array([i for i in range(size) if i not in taken], dtype=np.int64)
    extra = rng.permutation(rest)[: n - len(chosen)]
    return chosen + [int(i) for i in extra]


@PICKERS.register("data")
def data_order(state: PromptState, size: int, n: int, rng: np.random.Generator, arms=None, values=None) -> None:
    """Prompts in the data loader's order (nothing is chosen: today's behaviour).

    Formula: x_1..x_n = the next n prompts of the shuffled training set
    """
    return None


@PICKERS.register("epochs", bounds={"tolerance": (">= 0", "a number of prompts")})
def epochs(state: PromptState, size: int, n: int, rng: np.random.Generator, arms=None, values=None, *,
           drop_mastered: bool = True, tolerance: int = 20) -> list[int]:
    """The training set in shuffled epochs, the last partial batch dropped; with ``drop_mastered``,
    each epoch leaves out the prompts of which one generated group was solved by every rollout,
    when the previous epoch held more than n + tolerance prompts (:mod:`mixrl.sampler.epochs`).

    Formula: epoch e = shuffle({i : i not mastered before e}); mastered(i) = some group of i with every rollout correct
    Paper: ExGRPO, "ExGRPO: Learning to Reason from Experience" (arXiv 2510.02245): fully solved questions leave the training data at the next epoch.
    """
    raise ValueError("the epochs picker keeps its epoch in the sampler: mixrl.sampler.runtime.Sampler.pick draws it")


@PICKERS.register("accuracy_band", bounds={"lo": ("[0, 1]", "an accuracy"), "hi": ("[0, 1]", "an accuracy")})
def accuracy_band(state: PromptState, size: int, n: int, rng: np.random.Generator, arms=None, values=None, *,
                  lo: float = 0.1, hi: float = 0.9) -> list[int]:
    """Prompts whose estimated accuracy lies in [lo, hi], uniformly (unseen prompts are
    eligible; when fewer than n are, the rest are drawn uniformly from the others).

    Formula: x ~ Uniform{i : i unseen or {lo} <= acc_i <= {hi}}, acc_i = (a0 + s_i) / (a0 + b0 + s_i + f_i)
    Paper: balanced intermediate-accuracy filtering, "Process Reinforcement through Implicit Rewards" (PRIME).
    """
    if lo > hi:
        raise ValueError(f"accuracy_band needs lo <= hi, got lo={lo}, hi={hi}")
    eligible = np.array([i for i in range(size) if state.seen(i) == 0 or lo - 1e-9 <= state.accuracy(i) <= hi + 1e-9],
                        dtype=np.int64)
    chosen = [int(i) for i in rng.permutation(eligible)[:n]]
    return _fill(chosen, size, n, rng)


@PICKERS.register("thompson", bounds={"target": ("(0, 1)", "an accuracy strictly between 0 and 1")})
def thompson(state: PromptState, size: int, n: int, rng: np.random.Generator, arms=None, values=None, *,
             target: float = 0.5) -> list[int]:
    """Thompson sampling on each prompt's Beta posterior: draw an accuracy per prompt and pick
    the n whose draw is closest to the target (0.5: the largest reward variance p(1-p), the
    most informative group).

    Formula: theta_i ~ Beta(a0 + s_i, b0 + f_i); pick the n smallest |theta_i - {target}|
    Paper: VADE, "VADE: Variance-Aware Dynamic Sampling via Online Sample-Level Difficulty Estimation for Multimodal RL".
    """
    alpha = np.empty(size)
    beta = np.empty(size)
    for i in range(size):
        alpha[i], beta[i] = state.beta(i)
    theta = rng.beta(alpha, beta)
    order = np.argsort(np.abs(theta - target), kind="stable")
    return [int(i) for i in order[:n]]


@PICKERS.register("bandit", bounds={"buckets": (">= 1", "a number of accuracy buckets"),
                                    "temperature": ("> 0", "a softmax temperature"),
                                    "lr": ("(0, 1]", "a TD(0) step size")})
def bandit(state: PromptState, size: int, n: int, rng: np.random.Generator, arms=None, values=None, *,
           buckets: int = 4, temperature: float = 0.5, lr: float = 0.5) -> list[int]:
    """A bandit curriculum over difficulty buckets: each slot draws an arm from a softmax over
    the arms' values, then a prompt of that arm uniformly (without replacement). An arm's value
    tracks the mean |advantage| its groups produced (:func:`td_update`), so the curriculum moves
    to the difficulty that currently teaches most. Arms: ``arms[i]`` when given (a data
    column), else the accuracy bucket min(floor(acc_i * buckets), buckets - 1).

    Formula: P(arm a) = softmax(Q_a / {temperature}); Q_a <- Q_a + {lr} (mean |A| of arm a's groups - Q_a)
    Paper: SEC, "Self-Evolving Curriculum for LLM Reasoning".
    """
    labels = list(arms) if arms is not None else [min(int(state.accuracy(i) * buckets), buckets - 1) for i in range(size)]
    pools: dict = {}
    for i, a in enumerate(labels):
        pools.setdefault(a, []).append(i)
    for a in pools:
        pools[a] = [int(i) for i in rng.permutation(np.array(pools[a], dtype=np.int64))]
    q = values if values is not None else {}
    chosen: list[int] = []
    while len(chosen) < min(n, size):
        live = sorted((a for a in pools if pools[a]), key=str)
        logits = np.array([float(q.get(str(a), 0.0)) / temperature for a in live])
        p = np.exp(logits - logits.max())
        p /= p.sum()
        a = live[int(rng.choice(len(live), p=p))]
        chosen.append(pools[a].pop())
    return chosen


def arm_of(state: PromptState, index: int, buckets: int, arms=None):
    """The bandit arm of prompt ``index`` (its label, or its accuracy bucket), as a string key."""
    if arms is not None:
        return str(arms[index])
    return str(min(int(state.accuracy(index) * buckets), buckets - 1))


def td_update(values: dict, rewards: dict, lr: float) -> dict:
    """TD(0) update of the arms' values: Q_a <- Q_a + lr (mean(rewards[a]) - Q_a) for every arm
    with rewards this step (others keep theirs). Returns ``values`` (updated in place)."""
    for a, rs in rewards.items():
        if rs:
            q = float(values.get(a, 0.0))
            values[a] = q + lr * (float(sum(rs)) / len(rs) - q)
    return values


def group_abs_advantage(rewards: list[float], eps: float = 1e-4) -> float:
    """Mean |A_i| of one group under GRPO's advantage (r_i - mean) / (std + eps): SEC's
    learning-gain signal (0 for a group whose rewards are all equal)."""
    g = len(rewards)
    if g < 2:
        return 0.0
    m = sum(rewards) / g
    std = math.sqrt(sum((r - m) ** 2 for r in rewards) / (g - 1))
    return sum(abs(r - m) for r in rewards) / g / (std + eps)
