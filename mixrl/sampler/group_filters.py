"""Group filters: which generated groups a step keeps.

A group filter takes a generation batch's rewards and correctness, ``[groups, G]`` each, and
returns a boolean ``[groups]``: True for a group the step trains on. With ``sampler.max_rounds``
above 1 the trainer generates more groups until the step is full of kept ones
(:class:`mixrl.sampler.runtime.Sampler`).
"""

from __future__ import annotations

import torch

from mixrl.core.registry import Registry

GROUP_FILTERS = Registry("group filter")


@GROUP_FILTERS.register("all")
def keep_all(rewards: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
    """Keep every group (no filtering: today's GRPO).

    Formula: keep(x) = true
    """
    return torch.ones(rewards.shape[0], dtype=torch.bool, device=rewards.device)


@GROUP_FILTERS.register("nonzero_variance", bounds={"eps": (">= 0", "a reward spread; below it a group counts as constant")})
def nonzero_variance(rewards: torch.Tensor, correct: torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    """Keep groups whose rewards differ: a group where every rollout gets the same reward has
    zero advantage everywhere and carries no policy-gradient signal.

    Formula: keep(x) = max_i r_i - min_i r_i > {eps}
    Paper: DAPO's dynamic sampling, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (arXiv 2503.14476).
    """
    spread = rewards.max(dim=1).values - rewards.min(dim=1).values
    return spread > eps


@GROUP_FILTERS.register("accuracy_band", bounds={"lo": ("[0, 1]", "an accuracy"), "hi": ("[0, 1]", "an accuracy")})
def accuracy_band(rewards: torch.Tensor, correct: torch.Tensor, *, lo: float = 0.1, hi: float = 0.9) -> torch.Tensor:
    """Keep groups whose accuracy lies in [lo, hi]: balanced intermediate-difficulty filtering
    (too easy and too hard prompts are dropped).

    Formula: keep(x) = {lo} <= mean_i 1[y_i correct] <= {hi}
    Paper: online difficulty filtering, "Process Reinforcement through Implicit Rewards" (PRIME).
    """
    if lo > hi:
        raise ValueError(f"accuracy_band needs lo <= hi, got lo={lo}, hi={hi}")
    acc = correct.float().mean(dim=1)
    return (acc >= lo - 1e-9) & (acc <= hi + 1e-9)
