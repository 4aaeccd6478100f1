"""Reward functions for ``tests/test_fsdp_cpu.py`` (loaded by path: ``reward.name=tests/fsdp_rewards.py:fn``).

They make rows land unevenly across the two processes: a reward is computed on the process
that holds the completion (TRL scores local rows, then gathers), so it can depend on
``RANK``. Not a task anyone trains on.
"""

from __future__ import annotations

import os


def rank1_alternates(prompts, completions, **kwargs) -> list[float]:
    """Process 1: 1.0 on every other completion of its batch (each of its groups has a
    success and a failure: not hinted, non-zero advantages). Process 0 (and a run without
    processes): 0.0 everywhere, so every group of process 0 fails and is hinted."""
    if os.environ.get("RANK", "0") != "1":
        return [0.0] * len(completions)
    return [1.0 if i % 2 == 0 else 0.0 for i in range(len(completions))]


def rank0_exact(prompts, completions, **kwargs) -> list[float]:
    """Process 0 (and a run without processes): the built-in exact reward (the barely-trained test
    model fails, a teacher's candidates can be right). Process 1: :func:`rank1_alternates`."""
    if os.environ.get("RANK", "0") == "1":
        return rank1_alternates(prompts, completions, **kwargs)
    from mixrl.rewards import build_reward

    return build_reward("exact")(prompts=prompts, completions=completions, **kwargs)
