"""Critic-free per-token advantages from process rewards (``algo.advantage.name=capo``).

A dense reward (``reward=process``, :mod:`mixrl.rewards.process`) puts a credit on each completion
token. GRPO and the other group estimators of :mod:`mixrl.core.advantages` see only the row's sum
(one reward per row: a step judged wrong lowers the whole row). ``capo`` keeps the credit per token,
the way CAPO ("CAPO: Towards Enhancing LLM Reasoning through Generative Credit Assignment", Xie et al.
2025, arXiv 2508.02298) uses its generative PRM's verdicts: every token carries the row's outcome
reward, and the tokens of a step judged wrong carry its penalty on top, so the policy gradient
pushes down exactly those tokens; the token rewards are then normalised over the prompt's group.

* the token reward ``Q_{i,t} = (R_i - sum_s C_{i,s}) + C_{i,t}``: ``R_i`` the row's reward (every
  reward function, weighted; a dense reward counts with its sum), ``C_{i,t}`` the per-token credit
  (the weighted credit lists of the dense rewards: for ``reward=process`` the step rewards
  ``step_weight (s_j - baseline)`` by ``placement``, without the outcome; for another dense reward
  its list). So the part of the reward that is not per token (the verifier's outcome, any other
  reward function) is on every token, and each token adds its own credit. With the process defaults
  (a verdict per step, ``baseline=1``, ``placement=each``, outcome weight ``W_o``, step weight
  ``W_p``): ``Q = W_o v_i - W_p [t in a wrong step]``.
* the advantage ``A_{i,t} = (Q_{i,t} - mean_g Q) / (std_g Q + eps)``, mean and (unbiased) std over
  every completion token of the included rows of group g, with the degenerate-group rules of
  :mod:`mixrl.core.advantages` (all equal: std 1; one token: only centred; no included token: 0).
  Tokens outside ``mask`` (padding) get 0.

Sources: CAPO's authors have published no code (github.com/andyclsr/CAPO @
95b8f3492234fea145d1e94ef4eb04e9468fa9bc holds a README that says "Code is Coming Soon"), and the
paper's own advantage formula could not be read here (only its abstract is in the workspace's
seeds); the token reward above is the abstract's "token-level rewards to refine the tokens that were
originally assigned identical rule-based rewards", the normalisation over the group's tokens
mixrl's choice (GRPO's group statistics taken over tokens instead of rows). Check it against the
paper's Section 3 before reporting a CAPO reproduction.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mixrl.core.advantages import ADVANTAGES, _group_stats, _normalise


def capo_token_rewards(rewards: Tensor, token_credit: Tensor, mask: Tensor) -> Tensor:
    """[N, T] the token rewards ``Q``: the row's reward not given per token on every token, plus the token's own credit.

    Formula: Q_{i,t} = (R_i - sum_s C_{i,s} m_{i,s}) + C_{i,t} for m_{i,t} = 1, else 0
    """
    m = mask.to(device=rewards.device).bool()
    c = torch.nan_to_num(token_credit.detach().to(device=rewards.device, dtype=torch.float32), nan=0.0) * m
    if c.shape != m.shape or c.shape[0] != rewards.shape[0]:
        raise ValueError(f"token_credit has shape {tuple(c.shape)}, mask {tuple(m.shape)}, rewards {tuple(rewards.shape)}")
    rest = rewards.detach().float() - c.sum(1)
    return torch.where(m, rest.unsqueeze(1) + c, torch.zeros_like(c))


@ADVANTAGES.register("capo", bounds={"eps": ("> 0", "(q - mean) / (std + eps) divides by zero for equal rewards when eps = 0")})
def capo(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    include: Tensor | None = None,
    token_credit: Tensor | None = None,
    mask: Tensor | None = None,
    eps: float = 1e-6,
    unbiased: bool = True,
) -> Tensor:
    """Per-token advantages from process rewards: the row's outcome on every token plus each token's own credit, normalised over the group's tokens.

    The trainer passes ``token_credit`` ([N, T]: the dense rewards' per-token credit, weighted;
    ``reward=process`` gives its step rewards without the outcome) and ``mask`` ([N, T], the
    completion tokens); the result is per token, [N, T]. Without a dense reward every credit is 0 and
    every token of row i gets its row's reward, normalised over the group's tokens (a token-weighted
    GRPO). mixrl's critic-free path for ``reward=process``: with ``grpo`` a process reward is summed
    into one reward per row.

    Formula: ``A_(i,t) = (Q_(i,t) - mean_g Q) / (std_g Q + {eps})``, ``Q_(i,t) = (R_i - sum_s C_(i,s)) + C_(i,t)``, mean and std over every completion token of the included rows of the prompt's group g (unbiased: {unbiased}); a std of 0 counts as 1, a group of one token is only centred; 0 off the completion

    Paper: CAPO, "CAPO: Towards Enhancing LLM Reasoning through Generative Credit Assignment"
    (arXiv 2508.02298): a generative PRM's step verdicts become token-level rewards on top of the
    rule-based outcome. No authors' code is published; the normalisation over the group's tokens is mixrl's.

    Parameters:
        include (None): bool [N], rows counted in the statistics (default all).
        token_credit (None): [N, T] the per-token credit of the dense rewards (runtime).
        mask (None): [N, T] the completion tokens (runtime).
        eps (1e-6): added to the std.
        unbiased (True): n - 1 (True) or n (False) in the token variance.
    """
    if token_credit is None or mask is None:
        raise ValueError("capo needs token_credit and mask (the per-token credit of a dense reward, e.g. reward=process)")
    m = mask.to(device=rewards.device).bool()
    q = capo_token_rewards(rewards, token_credit, m)
    n, t = q.shape
    inc = torch.ones(n, dtype=torch.bool, device=q.device) if include is None else include.to(device=q.device).bool()
    tok_groups = group_ids.to(q.device).long().unsqueeze(1).expand(n, t).reshape(-1)
    tok_inc = (inc.unsqueeze(1) & m).reshape(-1)
    r, _, count, _, mean, std = _group_stats(q.reshape(-1), tok_groups, tok_inc, unbiased)
    adv = _normalise(r, count, mean, std, eps).view(n, t)
    return torch.where(m, adv, torch.zeros_like(adv))


capo.needs = ("token_credit", "mask")
