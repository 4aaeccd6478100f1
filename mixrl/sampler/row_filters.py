"""Row filters: which rollouts of a kept group train.

A row filter takes a batch's rewards and advantages, ``[groups, G]`` each, and returns a
boolean ``[groups, G]``: False for a rollout the step drops. The trainer drops a rollout by
setting its advantage to 0 (its tokens stay in the token count, like a zero-variance
group's in GRPO), so it adds no policy gradient.
"""

from __future__ import annotations

import torch

from mixrl.core.registry import Registry

ROW_FILTERS = Registry("row filter")


@ROW_FILTERS.register("reward_extremes", bounds={"k": (">= 1", "rollouts kept at each end of a group's reward ranking")})
def reward_extremes(rewards: torch.Tensor, advantages: torch.Tensor, *, k: int = 1) -> torch.Tensor:
    """Keep each group's k highest- and k lowest-reward rollouts, where a reward model is most
    reliable, and drop the middle (policy filtration, best-worst variant; ties by position).

    Formula: keep(y_i) = rank_desc(r_i) < {k} or rank_asc(r_i) < {k}
    Paper: PF-PPO, "Policy Filtration in RLHF to Fine-Tune LLM for Code Generation".
    """
    n, g = rewards.shape
    keep = torch.zeros(n, g, dtype=torch.bool, device=rewards.device)
    k = min(int(k), g)
    top = torch.sort(rewards, dim=1, descending=True, stable=True).indices[:, :k]
    bottom = torch.sort(rewards, dim=1, descending=False, stable=True).indices[:, :k]
    keep.scatter_(1, top, True)
    keep.scatter_(1, bottom, True)
    return keep


@ROW_FILTERS.register("nonnegative_advantage")
def nonnegative_advantage(rewards: torch.Tensor, advantages: torch.Tensor, *, threshold: float = 0.0) -> torch.Tensor:
    """Drop rollouts whose advantage is below a threshold: negative-advantage data is filtered
    out and the step learns from its better-than-average rollouts only.

    Formula: keep(y_i) = A_i >= {threshold}
    Paper: A-LoL, "Leftover Lunch: Advantage-based Offline Reinforcement Learning for Language Models".
    """
    return advantages >= threshold
