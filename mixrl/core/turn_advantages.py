"""Turn-level advantages of multi-turn rows: MT-GRPO's turn-level credit assignment.

A stateful environment's episode (:mod:`mixrl.envs`) gives a reward after each of the policy's
turns, ``r_{i,1} .. r_{i,K_i}``; the rollout's reward is their sum (the return). GRPO gives every
token of the row the one group-normalised return. MT-GRPO ("Reinforcing Multi-Turn Reasoning in
LLM Agents via Turn-Level Credit Assignment", Zeng et al., arXiv 2505.11821) adds, on the tokens
of the turns before the last, the group-normalised reward of that turn:

* the outcome advantage ``A^O_i``, on every token of the row: with ``outcome=last`` (the default,
  the authors') a row of two turns or more gets ``(o_i - mean_g o) / (std_g o + eps)``, o_i its last
  turn's reward (the authors' outcome reward: the final answer's), and a row of one turn (no
  observation: the authors' "no tool result") ``(R_i - mean_g R) / (std_g R + eps)``, R_i the
  rollout's reward (the return, the sum of its turns' rewards: the authors' combined reward);
  ``outcome=return`` (mixrl before this option) gives every row the return's advantage;
* the turn advantage ``A^T_{i,k} = (r_{i,k} - mean_{g,k} r) / (std_{g,k} r + eps)`` (turn k's
  reward, over the rows of the group that have a turn k), on the tokens of turn k < K_i, times
  the coefficient lambda.

The authors' code (github.com/SiliangZeng/Multi-Turn-RL-Agent @ 7dbdd08,
``verifiers/trainers/mt_grpo_env_trainer.py``, ``_assign_advantages``) writes it for its two-turn
search task: ``outcome_adv + turn_advantage_coef * turn_adv * before_result_mask`` (lines 197-202), the
mask being the tokens before the tool's result (the first turn), ``outcome_adv`` normalising the
outcome reward functions' reward only (lines 101, 106); a row with no tool result gets
``combined_adv`` (lines 205-206), the normalised sum of the turn and outcome reward functions
(``combined_reward_funcs = turn_reward_funcs + outcome_reward_funcs``, ``grpo_env_trainer.py:59``);
and ``_compute_normalized_advantages``
(``grpo_env_trainer.py``) normalises each reward over the group with ``torch.std`` (unbiased) and
``+ 1e-4``; ``turn_advantage_coef`` defaults to 1 (``scripts/run_mt_grpo.sh``). mixrl applies the
same rule to every turn but the last of a row (with two turns: exactly the authors'), with the
degenerate-group rules of :mod:`mixrl.core.advantages` (a std of 0 counts as 1, a one-row group is
only centred). Tokens of no turn (an observation, provenance ``environment``; padding) get 0, and
no term selects them.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from mixrl.core.advantages import ADVANTAGES, _group_stats, _normalise


def turn_reward_matrix(turn_rewards: list[list[float]], *, device=None, dtype=torch.float32) -> Tensor:
    """[N, K] the rows' per-turn rewards, K the most turns of a row; NaN where a row has no such turn.

    Formula: M_{i,k} = r_{i,k} for k < K_i, NaN for K_i <= k < max_j K_j
    """
    width = max((len(r) for r in turn_rewards), default=0)
    out = torch.full((len(turn_rewards), width), math.nan, dtype=dtype, device=device)
    for i, row in enumerate(turn_rewards):
        if row:
            out[i, : len(row)] = torch.tensor([float(x) for x in row], dtype=dtype, device=device)
    return out


#: the values of ``mt_grpo``'s ``outcome``: the reward behind a multi-turn row's outcome advantage
MT_GRPO_OUTCOMES = ("last", "return")


def per_turn_advantages(rewards: Tensor, group_ids: Tensor, turn_rewards: Tensor, *, include: Tensor | None = None,
                        turn_coef: float = 1.0, eps: float = 1e-4, outcome: str = "last") -> Tensor:
    """[N, K] MT-GRPO's advantage of each turn of each row (NaN where the row has no such turn).

    Formula: A_{i,k} = A^O_i + lambda A^T_{i,k} [k < K_i - 1]; outcome=last: A^O_i = (o_i - mean_g o) / (std_g o + eps)
    for K_i >= 2 (o_i = r_{i,K_i}, the last turn's reward), (R_i - mean_g R) / (std_g R + eps) for K_i <= 1;
    outcome=return: A^O_i = (R_i - mean_g R) / (std_g R + eps) for every row;
    A^T_{i,k} = (r_{i,k} - mean_{g,k} r) / (std_{g,k} r + eps) over the included rows of group g with a turn k
    """
    if outcome not in MT_GRPO_OUTCOMES:
        raise ValueError(f"mt_grpo outcome must be one of {MT_GRPO_OUTCOMES}, got {outcome!r}")
    r, _, count, _, mean, std = _group_stats(rewards, group_ids, include)
    combined = _normalise(r, count, mean, std, eps)  # the return's advantage (the authors' combined_adv)
    tr = turn_rewards.detach().to(device=combined.device, dtype=combined.dtype)
    if tr.dim() != 2 or tr.shape[0] != r.shape[0]:
        raise ValueError(f"turn_rewards has shape {tuple(tr.shape)}, rewards {tuple(r.shape)}: one row of turn rewards per rollout")
    has = ~torch.isnan(tr)
    last = has.long().sum(1) - 1  # K_i - 1: the row's last turn (its reward is in R_i, as every turn's)
    inc = torch.ones_like(has[:, 0]) if include is None else include.to(device=tr.device).bool()
    outcome_adv = combined
    if outcome == "last" and tr.shape[1] > 0:
        # the last turn's reward (the final answer's: the authors' outcome reward functions); R_i for a row of no turn
        o = torch.where(last >= 0, tr.gather(1, last.clamp(min=0).unsqueeze(1)).squeeze(1), r)
        o = torch.nan_to_num(o, nan=0.0)
        ro, _, co, _, mo, so = _group_stats(o, group_ids, include)
        outcome_adv = torch.where(last >= 1, _normalise(ro, co, mo, so, eps), combined)
    out = torch.full_like(tr, math.nan)
    for k in range(tr.shape[1]):
        col = torch.nan_to_num(tr[:, k], nan=0.0)
        rk, _, ck, _, mk, sk = _group_stats(col, group_ids, inc & has[:, k])
        turn = _normalise(rk, ck, mk, sk, eps)
        adv = outcome_adv + turn_coef * turn * (k < last).to(outcome_adv.dtype)
        out[:, k] = torch.where(has[:, k], adv, torch.full_like(adv, math.nan))
    return out


def tokens_from_turns(per_turn: Tensor, turn_ids: Tensor) -> Tensor:
    """[N, T]: on each token the advantage of its turn; 0 on tokens of no turn (``turn_ids`` -1:
    an observation's, a tool's) and of a turn without a reward.

    Formula: A_{i,t} = A_{i, turn_{i,t}} if turn_{i,t} >= 0 and row i has that turn, else 0
    """
    ids = turn_ids.to(per_turn.device).long()
    n_turns = per_turn.shape[1]
    valid = (ids >= 0) & (ids < n_turns)
    if n_turns == 0:
        return torch.zeros(ids.shape, dtype=per_turn.dtype, device=per_turn.device)
    picked = per_turn.gather(1, torch.where(valid, ids, torch.zeros_like(ids)))
    return torch.where(valid & ~torch.isnan(picked), picked, torch.zeros_like(picked))


def first_minus_last(per_turn: Tensor) -> float | None:
    """The mean, over rows with at least two turns, of the first turn's advantage minus the last
    turn's (``turn/advantage_first_minus_last``); None without such a row. 0 under GRPO (one
    advantage per row).

    Formula: mean_{i: K_i >= 2} (A_{i,1} - A_{i,K_i})
    """
    has = ~torch.isnan(per_turn)
    n = has.long().sum(1)
    rows = n >= 2
    if not bool(rows.any()):
        return None
    last = per_turn.gather(1, (n - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    return float((per_turn[:, 0] - last)[rows].mean())


@ADVANTAGES.register("mt_grpo", bounds={
    "turn_coef": (">= 0", "the weight of a turn's own advantage; negative would push against the turn's reward"),
    "eps": ("> 0", "(r - mean) / (std + eps) divides by zero for equal rewards when eps = 0"),
})
def mt_grpo(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    include: Tensor | None = None,
    turn_rewards: Tensor | None = None,
    turn_ids: Tensor | None = None,
    turn_coef: float = 1.0,
    eps: float = 1e-4,
    outcome: str = "last",
) -> Tensor:
    """MT-GRPO: the group-normalised outcome plus, on each turn but the last, that turn's group-normalised reward.

    The trainer passes ``turn_rewards`` ([N, K], NaN where a row has fewer turns: the
    environment's reward after each of the policy's turns) and ``turn_ids`` ([N, T], the turn of
    each completion token, -1 for an observation's); the result is per token, [N, T]. Without
    ``turn_ids`` it is per turn, [N, K]. ``rewards`` is the rollout's reward (an environment's
    return, the sum of its turns' rewards). With ``turn_coef`` 0 every token of row i gets
    ``A^O_i``. Only a stateful environment gives turn rewards (``env=arith_retry``).

    ``outcome`` picks the reward behind ``A^O``: ``last`` (default, the authors' trainer) the last
    turn's reward for a row of two turns or more (the final answer's: the authors' outcome reward
    functions; the earlier turns' rewards count only through ``A^T``) and the return for a row of one
    turn (the authors' ``combined_adv`` for a row with no tool result); ``return`` (mixrl before the
    option) the return for every row, so an earlier turn's reward also counts on every token.

    Formula: ``A_(i,t) = A^O_i + {turn_coef} x A^T_(i,k) [k < K_i - 1]`` on the tokens t of turn k of row i (K_i turns), 0 on observation tokens; outcome={outcome}: last: ``A^O_i = (o_i - mean_g o) / (std_g o + {eps})`` with o_i the last turn's reward for K_i >= 2, ``(R_i - mean_g R) / (std_g R + {eps})`` (R the return) for K_i = 1; return: the latter for every row; ``A^T_(i,k) = (r_(i,k) - mean_(g,k) r) / (std_(g,k) r + {eps})`` over the rows of the prompt's group g that have a turn k; unbiased std, a std of 0 counts as 1

    Paper: MT-GRPO, "Reinforcing Multi-Turn Reasoning in LLM Agents via Turn-Level Credit
    Assignment" (arXiv 2505.11821; code github.com/SiliangZeng/Multi-Turn-RL-Agent @ 7dbdd08,
    ``mt_grpo_env_trainer.py`` ``_assign_advantages``: two turns, the coefficient on the first).

    Parameters:
        include (None): bool [N], rows counted in the statistics (default all).
        turn_rewards (None): [N, K] each row's per-turn rewards, NaN past its last turn (runtime).
        turn_ids (None): [N, T] the policy turn of each completion token, -1 for none (runtime).
        turn_coef (1.0): lambda, the weight of a turn's own advantage (the authors' turn_advantage_coef, default 1).
        eps (1e-4): added to each std (the authors' 1e-4).
        outcome (last): last (a multi-turn row's outcome advantage from its last turn's reward, a one-turn row's from the return: the authors') or return (every row's from the return).
    """
    if turn_rewards is None:
        raise ValueError("mt_grpo needs turn_rewards (the per-turn rewards of a stateful environment, e.g. env=arith_retry)")
    per_turn = per_turn_advantages(rewards, group_ids, turn_rewards, include=include, turn_coef=turn_coef, eps=eps, outcome=outcome)
    return per_turn if turn_ids is None else tokens_from_turns(per_turn, turn_ids)


mt_grpo.needs = ("turn_rewards", "turn_ids")
