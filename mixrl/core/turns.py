"""Multi-turn rows: the turns of a row, and the turn-level importance ratio (Turn-PPO / ST-PPO).

A multi-turn completion interleaves what the policy wrote (its turns) with what a tool or an
environment wrote back (results, observations; provenance ``environment``,
:mod:`mixrl.core.provenance`). :func:`turn_ids` numbers the policy's turns of each row from a
[B, T] mask of the policy's tokens (TRL's ``tool_mask``: 1 the model's tokens, 0 a tool's):
turn k is the k-th maximal run of policy tokens; tokens of no turn (a tool's, padding) get -1.

:func:`turn_ppo` is the PPO clip on one importance ratio per turn (the length-normalised ratio
of the turn's tokens), in GSPO-token form, so that with ``seq-mean-token-mean`` over a
one-turn row it is GSPO, and over single-token turns it is token-level PPO.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mixrl.core._tensor import bool_mask, log_ratio, masked_inputs, token_advantages, zero_masked
from mixrl.core.policy_base import POLICY_LOSSES, PolicyLossOutput, _finish


def turn_ids(policy_mask: Tensor) -> Tensor:
    """[B, T] long: the index (0, 1, ...) of the policy turn each token belongs to, -1 where
    ``policy_mask`` is 0.

    Formula: id_t = (number of starts s <= t, a start being m_s = 1 and (s = 0 or m_{s-1} = 0)) - 1 where m_t = 1, else -1
    """
    m = bool_mask(policy_mask).long()
    prev = torch.nn.functional.pad(m[:, :-1], (1, 0))
    starts = (m == 1) & (prev == 0)
    ids = starts.long().cumsum(-1) - 1
    return torch.where(m.bool(), ids, torch.full_like(ids, -1))


def written_spans(ids: list[int], eos_id: int, header: list[int]) -> list[bool]:
    """Per token of one completion: True where a tool or environment wrote it. A completion
    that goes on after its end-of-turn token (``eos_id``) holds a tool's turn from there up to
    and including the next assistant header (``header``: the template's tokens that open an
    assistant turn); the end-of-turn token itself is the policy's (it ends its turn).

    Formula: w_t = 1 iff some s < t has ids_s = eos and no assistant header ends in (s, t)
    """
    out = [False] * len(ids)
    t, n, h = 0, len(ids), len(header)
    while t < n:
        if ids[t] != eos_id or t == n - 1:
            t += 1
            continue
        u = t + 1
        while u < n and ids[u - h + 1: u + 1] != header if h else False:
            u += 1
        for k in range(t + 1, min(u + 1, n)):
            out[k] = True
        t = u + 1
    return out


def turn_log_ratio(lr: Tensor, mask: Tensor, turns: Tensor) -> Tensor:
    """[B, T]: on each token, the mean of ``lr`` over the tokens of its turn (masked tokens
    excluded), 0 where the token is masked or has no turn.

    Formula: s_t = (1/|K(t)|) sum_{u in K(t)} lr_u, K(t) = {u : m_u, turn_u = turn_t}
    """
    m = bool_mask(mask) & (turns >= 0)
    n_turns = int(turns.max().item()) + 1 if turns.numel() else 0
    if n_turns <= 0:
        return torch.zeros_like(lr)
    idx = torch.where(m, turns, torch.zeros_like(turns))
    w = m.to(lr.dtype)
    sums = torch.zeros(lr.shape[0], n_turns, dtype=lr.dtype, device=lr.device).scatter_add(1, idx, lr * w)
    counts = torch.zeros(lr.shape[0], n_turns, dtype=lr.dtype, device=lr.device).scatter_add(1, idx, w)
    mean = sums / counts.clamp(min=1)
    return torch.where(m, mean.gather(1, idx), torch.zeros_like(lr))


@POLICY_LOSSES.register("turn_ppo", bounds={
    "clip_low": ("[0, 1]", "the turn ratio is clipped below at 1 - clip_low"),
    "clip_high": (">= 0", "the turn ratio is clipped above at 1 + clip_high"),
})
def turn_ppo(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    turn_ids: Tensor | None = None,
) -> PolicyLossOutput:
    """Turn-level importance ratio with a PPO clip (Turn-PPO, ST-PPO's turn-level sampling).

    Formula: ``l_t = max(-A w_t, -A clip(w_t, 1 - {clip_low}, 1 + {clip_high}))``,
    ``w_t = sg(w_k) p_t / sg(p_t)``, ``w_k = exp(mean_{u in turn k} log r_u)``, k the turn of t

    One ratio per turn of the policy (the geometric mean of its tokens' ratios), applied to
    every token of the turn; its gradient on token t is ``w_k grad log p_t`` (GSPO-token form).
    Tokens a tool or an environment wrote are not in any turn (provenance ``environment``: no
    term selects them). ``turn_ids`` (runtime, from the batch's ``turn_id``): the turn of each
    token, -1 for none; None: the row is one turn (GSPO's sequence ratio with PPO's clip).
    Clipped: the tokens of turns whose ratio is clipped.

    Paper: "ST-PPO: Stabilized Off-Policy Proximal Policy Optimization for Multi-Turn Agents
    Training" (Turn-PPO: turn-level importance sampling; its clipping-bias correction is not
    part of this loss).

    Parameters:
        clip_low (0.2): turn-ratio lower bound 1 - clip_low.
        clip_high (0.2): turn-ratio upper bound 1 + clip_high.
    """
    logp, old_logp, advantages = masked_inputs(logp, old_logp, advantages, mask)
    m = bool_mask(mask)
    turns = torch.zeros_like(m, dtype=torch.long) if turn_ids is None else turn_ids.to(logp.device).long()
    turns = torch.where(m, turns.clamp(min=0), torch.full_like(turns, -1))
    lr = zero_masked(log_ratio(logp, old_logp), m)
    w_turn = torch.exp(turn_log_ratio(lr, m, turns).detach())
    w_tok = w_turn * torch.exp(logp - logp.detach())
    adv = token_advantages(advantages, logp)
    loss1 = -adv * w_tok
    loss2 = -adv * torch.clamp(w_tok, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss1, loss2)
    clipped = loss2 > loss1
    metrics = {"turn_ratio_mean": (w_turn * m).sum() / m.sum().clamp(min=1)}
    return _finish(loss, clipped, mask, metrics)
