"""UI-S1's advantage: discounted step returns, weighted step- and episode-level advantages.

"UI-S1: Advancing GUI Automation via Semi-online Reinforcement Learning" (arXiv 2509.11543). The
authors' code (X-PLUG/MobileAgent @ 11cea575561fb7800b5fb6b6cafa56f7a91de11f, ``UI-S1/uis1/core_uis1.py``)
trains every step of an episode as its own row; here an episode is one row and step k is the
policy's k-th turn (``turn_id`` k), which receives the advantage of that step on its tokens.

* Step return (``compute_step_discounted_returns``, lines 31-61), backwards over the turns of an
  episode: ``R_k = r_k + gamma R_{k+1}`` while the action matched the expert's, and at a diverging
  (patched) turn ``R_k = r_k`` with the running return reset to 0, so the turns before it do not
  see past it.
* Episode-level advantage (``episode_norm_reward``, lines 95-161, with
  ``compute_mean_std_cross_all_data=True``): each step's own reward r_k normalised over every step of
  every episode of the task's group: ``A^E_{i,k} = (r_{i,k} - mean_g r) / (std_g r + eps)``; a group
  with a single step gets mean 0 and std 1.
* Step-level advantage (``step_norm_reward``, lines 166-217): the step return normalised over the
  group's episodes that have a step k: ``A^S_{i,k} = (R_{i,k} - mean_{g,k} R) / (std_{g,k} R + eps)``;
  a single one gets its own mean (advantage 0) and std 1.
* ``A_{i,k} = w_E A^E_{i,k} + w_S A^S_{i,k}`` (``compute_uis1_outcome_advantage``, lines 67-92).

``mode``: ``mean_std_norm`` (the authors' ``scripts/train_example.sh``) divides by the unbiased std
plus eps; ``mean_norm`` (their config's default) only subtracts the mean. gamma 0.5 is their script's.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from mixrl.core.advantages import ADVANTAGES
from mixrl.core.turn_advantages import tokens_from_turns

UIS1_MODES = ("mean_std_norm", "mean_norm")


def step_returns(turn_rewards: Tensor, turn_matched: Tensor, gamma: float) -> Tensor:
    """[N, K] discounted step returns (NaN where a row has no such turn).

    Formula: R_k = r_k + gamma R_{k+1} if matched_k, else R_k = r_k and the running return is reset to 0
    """
    out = torch.full_like(turn_rewards, math.nan)
    for i in range(turn_rewards.shape[0]):
        running = 0.0
        for k in reversed(range(turn_rewards.shape[1])):
            r = float(turn_rewards[i, k])
            if math.isnan(r):
                continue
            if bool(turn_matched[i, k]):
                running = r + gamma * running
                out[i, k] = running
            else:
                running = 0.0
                out[i, k] = r
    return out


def _norm(values: list[float], *, single_mean: float | None, with_std: bool, eps: float) -> tuple[float, float]:
    """(mean, divisor) of one statistics group; a group of one: (single_mean or the value, 1)."""
    if len(values) == 1:
        return (values[0] if single_mean is None else single_mean), 1.0
    t = torch.tensor(values, dtype=torch.float64)
    return float(t.mean()), (float(t.std()) + eps) if with_std else 1.0


def per_turn_uis1(rewards: Tensor, group_ids: Tensor, turn_rewards: Tensor, turn_matched: Tensor, *,
                  include: Tensor | None = None, gamma: float = 0.5, step_weight: float = 1.0,
                  episode_weight: float = 1.0, mode: str = "mean_std_norm", eps: float = 1e-6) -> Tensor:
    """[N, K] UI-S1's advantage of each turn (NaN where the row has no such turn); see the module.

    Formula: A_{i,k} = w_E (r_{i,k} - mean_g r) / (std_g r + eps) + w_S (R_{i,k} - mean_{g,k} R) / (std_{g,k} R + eps)
    """
    if mode not in UIS1_MODES:
        raise ValueError(f"uis1 mode must be one of {UIS1_MODES}, got {mode!r}")
    tr = turn_rewards.detach().double().cpu()
    matched = turn_matched.detach().cpu().bool() if turn_matched.numel() else torch.ones_like(tr, dtype=torch.bool)
    ret = step_returns(tr, matched, gamma)
    groups = group_ids.detach().cpu().tolist()
    inc = [True] * len(groups) if include is None else include.detach().cpu().bool().tolist()
    with_std = mode == "mean_std_norm"
    out = torch.full_like(tr, math.nan)
    for g in set(groups):
        rows = [i for i, x in enumerate(groups) if x == g]
        stat_rows = [i for i in rows if inc[i]]
        all_r = [float(tr[i, k]) for i in stat_rows for k in range(tr.shape[1]) if not math.isnan(float(tr[i, k]))]
        ep_mean, ep_div = _norm(all_r, single_mean=0.0, with_std=with_std, eps=eps) if all_r else (0.0, 1.0)
        for k in range(tr.shape[1]):
            at_k = [float(ret[i, k]) for i in stat_rows if not math.isnan(float(ret[i, k]))]
            st_mean, st_div = _norm(at_k, single_mean=None, with_std=with_std, eps=eps) if at_k else (0.0, 1.0)
            for i in rows:
                if math.isnan(float(tr[i, k])):
                    continue
                a_e = (float(tr[i, k]) - ep_mean) / ep_div
                a_s = (float(ret[i, k]) - st_mean) / st_div
                out[i, k] = episode_weight * a_e + step_weight * a_s
    return out.to(device=turn_rewards.device, dtype=turn_rewards.dtype)


@ADVANTAGES.register("uis1", bounds={
    "gamma": ("[0, 1]", "the discount of future step rewards"),
    "step_weight": (">= 0", "the weight of the step-level advantage"),
    "episode_weight": (">= 0", "the weight of the episode-level advantage"),
    "eps": ("> 0", "(R - mean) / (std + eps) divides by zero for equal returns when eps = 0"),
})
def uis1(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    include: Tensor | None = None,
    turn_rewards: Tensor | None = None,
    turn_ids: Tensor | None = None,
    turn_matched: Tensor | None = None,
    gamma: float = 0.5,
    step_weight: float = 1.0,
    episode_weight: float = 1.0,
    mode: str = "mean_std_norm",
    eps: float = 1e-6,
) -> Tensor:
    """UI-S1: discounted step returns; the weighted sum of an episode-level and a step-level group advantage.

    The trainer passes ``turn_rewards`` ([N, K] each turn's reward, NaN past a row's last),
    ``turn_matched`` ([N, K] False at a turn whose action diverged and was patched) and ``turn_ids``
    ([N, T]); the result is per token. ``rewards`` (the episode's return) is not used: every term is per step.

    Formula: ``A_(i,t) = {episode_weight} A^E_(i,k) + {step_weight} A^S_(i,k)`` on the tokens t of the policy's turn k of row i; ``A^E_(i,k) = (r_(i,k) - mean_g r) / (std_g r + {eps})`` over every step of the group's episodes; ``A^S_(i,k) = (R_(i,k) - mean_(g,k) R) / (std_(g,k) R + {eps})`` over the group's episodes with a step k; ``R_k = r_k + {gamma} R_(k+1)`` while the action matched, ``R_k = r_k`` (the chain cut) at a patched one; mode={mode}

    Paper: UI-S1, "UI-S1: Advancing GUI Automation via Semi-online Reinforcement Learning" (arXiv
    2509.11543; code X-PLUG/MobileAgent @ 11cea57, ``UI-S1/uis1/core_uis1.py``).

    Parameters:
        include (None): bool [N], rows counted in the statistics (default all).
        turn_rewards (None): [N, K] each row's per-turn rewards (runtime).
        turn_ids (None): [N, T] the policy turn of each completion token, -1 for none (runtime).
        turn_matched (None): [N, K] whether each turn's action matched the expert's (runtime).
        gamma (0.5): the discount of the step returns (their train_example.sh).
        step_weight (1.0): w_S (their step_advantage_w).
        episode_weight (1.0): w_E (their episode_advantage_w).
        mode (mean_std_norm): mean_std_norm (divide by std + eps, their script) or mean_norm (subtract the mean only).
        eps (1e-6): added to each std (theirs).
    """
    if turn_rewards is None:
        raise ValueError("uis1 needs turn_rewards (the per-turn rewards of a stateful environment, e.g. env=arith_steps)")
    matched = torch.ones_like(turn_rewards, dtype=torch.bool) if turn_matched is None else turn_matched
    per_turn = per_turn_uis1(rewards, group_ids, turn_rewards, matched, include=include, gamma=gamma,
                             step_weight=step_weight, episode_weight=episode_weight, mode=mode, eps=eps)
    return per_turn if turn_ids is None else tokens_from_turns(per_turn, turn_ids)


uis1.needs = ("turn_rewards", "turn_ids", "turn_matched")
