"""Generalized advantage estimation and the clipped value loss of PPO with a learned critic.

:func:`gae_advantage_return` is the plain math (per-token advantages and returns from per-token
rewards and a critic's values); ``gae`` registers it as an advantage (``algo.advantage.name=gae``),
called by the trainer with the batch's per-token inputs as runtime arguments. ``VALUE_LOSSES``
holds the critic's loss (``clipped_mse``, PPO / verl's value loss).

The value of completion token t is the critic's estimate before token t is emitted (the state
``prompt + y_<t``); the outcome reward sits on the last completion token, a dense reward on each
token it names (:mod:`mixrl.rewards.registry`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from mixrl.core.advantages import ADVANTAGES
from mixrl.core.registry import Registry

VALUE_LOSSES = Registry("value loss")


def gae_advantage_return(token_rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float = 1.0,
                         lam: float = 0.95) -> tuple[Tensor, Tensor]:
    """Per-token GAE advantages and returns, both [B, T] (detached; 0 where ``mask`` is 0).

    Masked positions are skipped: they pass the next value and the running sum through
    unchanged (verl ``compute_gae_advantage_return``), so a row's padding does not count as steps.
    ``returns = advantages + values`` (the critic's regression target). The result has the
    inputs' floating dtype (float64 stays float64; the promoted dtype of the two; float32 for
    integer inputs).
    """
    dtype = torch.promote_types(token_rewards.dtype, values.dtype)
    dtype = dtype if dtype.is_floating_point else torch.float32
    r = token_rewards.detach().to(dtype)
    v = values.detach().to(dtype)
    m = mask.to(r.dtype)
    if r.shape != v.shape or r.shape != m.shape:
        raise ValueError(f"token_rewards {tuple(r.shape)}, values {tuple(v.shape)} and mask {tuple(m.shape)} differ")
    next_value = r.new_zeros(r.shape[0])
    running = r.new_zeros(r.shape[0])
    out = []
    for t in reversed(range(r.shape[1])):
        delta = r[:, t] + gamma * next_value - v[:, t]
        step = delta + gamma * lam * running
        next_value = v[:, t] * m[:, t] + (1 - m[:, t]) * next_value
        running = step * m[:, t] + (1 - m[:, t]) * running
        out.append(running)
    adv = torch.stack(out[::-1], dim=1) if out else r.clone()
    returns = (adv + v) * m
    return adv * m, returns


def _whiten(adv: Tensor, mask: Tensor) -> Tensor:
    """``(A - mean) / sqrt(var + 1e-8)`` over the selected tokens (unbiased var, verl ``masked_whiten``);
    with fewer than 2 tokens only the mean is taken off. Zero spread (every selected value equal):
    the variance counts as 1, so tokens outside the selection (rows left out of the statistics)
    are divided by ``sqrt(1 + 1e-8)``, not ``sqrt(1e-8)`` (LUFFY's rule for a std of 0, see
    :mod:`mixrl.core.advantages`)."""
    m = mask.to(adv.dtype)
    n = m.sum()
    sel = mask.bool()
    if bool(sel.any()) and bool(adv[sel].max() == adv[sel].min()):
        return (adv - adv[sel].min()) * torch.rsqrt(torch.ones_like(n) + 1e-8)
    mean = (adv * m).sum() / n.clamp(min=1.0)
    var = ((adv - mean).pow(2) * m).sum() / (n - 1).clamp(min=1.0)
    out = (adv - mean) * torch.rsqrt(var + 1e-8) if n >= 2 else adv - mean
    return out


@ADVANTAGES.register("gae", bounds={
    "gamma": ("[0, 1]", "the discount of a future reward; above 1 the returns grow without bound"),
    "lam": ("[0, 1]", "the GAE trace weight between the one-step TD error (0) and the Monte-Carlo return (1)"),
})
def gae(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    include: Tensor | None = None,
    token_rewards: Tensor | None = None,
    values: Tensor | None = None,
    mask: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 0.95,
    whiten: bool = True,
) -> Tensor:
    """Generalized advantage estimation from a learned critic's values, one advantage per token.

    The trainer passes ``token_rewards`` (the outcome reward on each row's last token plus any
    dense per-token reward), the critic's ``values`` and the completion ``mask``, all [N, T];
    the result is [N, T]. Groups are not used (the critic is the baseline). With ``whiten`` the
    advantages are normalised over the tokens of the ``include`` rows (verl, TRL's PPO). Called
    without per-token inputs each row is one step with value 0 (``A_i = R_i``, whitened).

    Formula: ``A_t = sum_l ({gamma} x {lam})^l delta_(t+l), delta_t = r_t + {gamma} V(s_(t+1)) - V(s_t)``; returns ``A_t + V(s_t)``; whitened over the batch's tokens: {whiten} (a variance of 0 counts as 1)

    Paper: "High-Dimensional Continuous Control Using Generalized Advantage Estimation"
    (Schulman et al., arXiv 1506.02438); PPO, "Proximal Policy Optimization Algorithms"
    (arXiv 1707.06347); verl ``compute_gae_advantage_return``.

    Parameters:
        include (None): bool [N], rows whose tokens count in the whitening statistics (default all).
        token_rewards (None): [N, T] per-token rewards (runtime).
        values (None): [N, T] the critic's values (runtime).
        mask (None): [N, T] the completion tokens (runtime).
        gamma (1.0): discount (verl's default 1.0; TRL's PPOConfig 1.0).
        lam (0.95): GAE lambda (TRL's PPOConfig 0.95; verl's default 1.0).
        whiten (True): normalise the advantages over the batch's tokens.
    """
    per_row = token_rewards is None
    if per_row:
        token_rewards = rewards.detach().unsqueeze(1)
        token_rewards = token_rewards if token_rewards.is_floating_point() else token_rewards.float()
        values = torch.zeros_like(token_rewards)
        mask = torch.ones_like(token_rewards)
    if values is None or mask is None:
        raise ValueError("gae needs the critic's values and the completion mask with token_rewards")
    adv, _ = gae_advantage_return(token_rewards, values, mask, gamma=gamma, lam=lam)
    if whiten:
        sel = mask.bool()
        if include is not None:
            sel = sel & include.to(sel.device).bool().unsqueeze(1)
        adv = _whiten(adv, sel) * mask.to(adv.dtype)
    return adv.squeeze(1) if per_row else adv


@VALUE_LOSSES.register("clipped_mse", bounds={"clip": ("> 0", "the value may move at most clip from its rollout-time value")})
def clipped_mse(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, *,
                clip: float | None = 0.2) -> tuple[Tensor, Tensor]:
    """PPO's clipped value loss: the larger of the clipped and unclipped squared errors, token-mean.

    ``old_values`` are the critic's values at rollout time; ``clip`` = None drops the clipped
    branch (plain 0.5 MSE). Returns ``(loss, clip_fraction)``: the scalar loss (0 with no selected
    token) and the fraction of selected tokens where the clipped error is the larger.

    Formula: ``L_V = 0.5 mean_t max((V_t - R_t)^2, (clip(V_t, V_old_t - {clip}, V_old_t + {clip}) - R_t)^2)``

    Paper: PPO, "Proximal Policy Optimization Algorithms" (arXiv 1707.06347); the value clipping of
    OpenAI baselines' ppo2 and verl ``compute_value_loss`` (``cliprange_value``).

    Parameters:
        clip (0.2): how far the value may move from its rollout-time value (None: no clipping).
    """
    m = mask.to(values.dtype)
    err = (values - returns).pow(2)
    if clip is None:
        worst = err
        clipped = torch.zeros_like(err)
    else:
        v_clip = old_values + (values - old_values).clamp(-clip, clip)
        err_clip = (v_clip - returns).pow(2)
        worst = torch.maximum(err, err_clip)
        clipped = (err_clip > err).to(values.dtype)
    n = m.sum().clamp(min=1.0)
    return 0.5 * (worst * m).sum() / n, ((clipped * m).sum() / n).detach()
