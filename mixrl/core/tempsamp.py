"""TempSamp-R1's non-linear soft advantage: the group advantage of rewards passed through an
asymmetric transform (a shaping).

"TempSamp-R1: Effective Temporal Sampling with Reinforcement Fine-Tuning for Video LLMs" (Li et
al., arXiv 2509.18056) places the ground-truth answer as an off-policy row inside each GRPO group
and computes the advantages from rewards reshaped so that rewards above a success threshold are
compressed to a near-flat plateau and rewards below it fall off exponentially: the group's
advantages are sharpest around the threshold. The paper's text was not readable here; the
transform is the one of the open-source implementation ZhangZikun6666/TempSamp-R1 @
55a92280a93474d694e215bbb4705d0a1f2efc04 (its README names the paper and its authors; the account
is not among them, and the authors' HVision-NKU/TempSamp-R1 was not reachable):
``scripts/timelens/timelens_reward.py``, ``transform_rewards`` (threshold 0.8 and alpha 1.0 from
``GTPO_REWARD_SHAPING_THRESHOLD`` / ``_ALPHA``, lines 42-45 and ``scripts/train/timelens_tempsamp.sh``),
applied to the task reward (the IoU) before the format reward is added; the advantage is then
verl's GRPO over the group of 8, the ground-truth row (the last slot, ``ray_trainer.py``,
``_inject_gt_rollout_in_gen_output``) included.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from mixrl.core.advantage_shaping import SHAPINGS, _float
from mixrl.core.advantages import grpo


def soft_transform(r: Tensor, *, threshold: float, alpha: float, plateau: float = 0.01) -> Tensor:
    """``f(r) = tau + plateau log(r - tau + 1)`` for r >= tau (a near-flat plateau just above tau),
    ``f(r) = tau - (exp(alpha (tau - r)) - 1) / (exp(alpha) - 1)`` below it (an exponential penalty
    ramp); continuous at tau, increasing in r."""
    r = _float(r)
    above = threshold + plateau * torch.log((r - threshold).clamp(min=0.0) + 1.0)
    below = threshold - torch.expm1(alpha * (threshold - r).clamp(min=0.0)) / math.expm1(alpha)
    return torch.where(r >= threshold, above, below)


@SHAPINGS.register("tempsamp", bounds={
    "threshold": ("[0, 1]", "the success threshold of a reward in [0, 1] (TempSamp-R1's IoU)"),
    "alpha": ("> 0", "the steepness of the penalty below the threshold; alpha <= 0 has no exp(alpha) - 1 to divide by"),
    "plateau": (">= 0", "the slope of the plateau above the threshold; negative would rank better rewards lower"),
    "eps": ("> 0", "(R' - mean) / (std + eps) divides by zero for equal rewards when eps = 0"),
})
def tempsamp(advantages: Tensor, *, rewards: Tensor, group_ids: Tensor, include: Tensor | None = None,
             primary_rewards: Tensor | None = None, threshold: float = 0.8, alpha: float = 1.0, plateau: float = 0.01,
             eps: float = 1e-6) -> Tensor:
    """TempSamp-R1's soft advantage: the first reward function's reward r passed through an
    asymmetric transform f (compressed above the threshold, exponentially penalised below it),
    the other reward functions' part added back unchanged, then GRPO's group normalisation.

    Formula: ``A'_i = (R'_i - mean_g R') / (std_g R' + {eps})``, ``R'_i = f(r_i) + (R_i - r_i)``, ``f(r) = {threshold} + {plateau} log(r - {threshold} + 1)`` for r >= {threshold}, ``f(r) = {threshold} - (exp({alpha} ({threshold} - r)) - 1) / (exp({alpha}) - 1)`` below (r: the first reward function's reward, R: the run's reward; unbiased std over the included rows of the group)

    Paper: TempSamp-R1, "TempSamp-R1: Effective Temporal Sampling with Reinforcement Fine-Tuning
    for Video LLMs" (arXiv 2509.18056); the transform as ZhangZikun6666/TempSamp-R1 @
    55a92280a93474d694e215bbb4705d0a1f2efc04, scripts/timelens/timelens_reward.py (transform_rewards).
    R - r is the other reward functions' weighted part when the first one's weight is 1 (the default).
    The estimator's advantage is replaced (read only for its shape).

    Parameters:
        threshold (0.8): the success threshold tau.
        alpha (1.0): the steepness of the penalty below tau.
        plateau (0.01): the slope of the log plateau above tau (the implementation's 0.01).
        eps (1e-6): added to the group std (verl's GRPO).
    """
    if primary_rewards is None:
        raise ValueError("tempsamp needs the first reward function's rewards (the trainer passes them)")
    r = _float(primary_rewards).to(_float(rewards).device)
    shaped = soft_transform(r, threshold=threshold, alpha=alpha, plateau=plateau) + (_float(rewards) - r)
    return grpo(shaped, group_ids, include=include, eps=eps).to(_float(advantages).dtype)


tempsamp.needs = ("primary_rewards",)
