"""Covariance-based entropy control: Clip-Cov and KL-Cov policy losses.

Both restrict the update of the tokens whose log-probability and advantage co-vary most,
the tokens that drive the policy's entropy down (Cui et al. 2025). The token covariance is
taken over the valid tokens one call sees (one micro-batch, as verl does)::

    Cov_t = (sg(log p_t) - mean_j sg(log p_j)) * (A_t - mean_j A_j)

Same signature and conventions as :mod:`mixrl.core.policy_base` (masked inputs; padded
positions may hold NaN / -inf; per-token loss not aggregated).

Randomness (Clip-Cov only): the tokens are drawn with ``torch.randperm`` on the CPU with the
caller's ``generator`` (a runtime parameter of the policy-loss registry, never a config key);
without one, torch's default CPU generator is used, which ``mixrl train`` seeds from
``seed`` (transformers' ``set_seed``), so a run is reproducible given its seed. The draw
depends only on the generator's state and on the candidate tokens in row-major order.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mixrl.core._tensor import bool_mask, log_ratio, masked_inputs, masked_mean, token_advantages
from mixrl.core.policy_base import POLICY_LOSSES, PolicyLossOutput, _finish, _ratio_metrics


def token_covariance(logp: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """``Cov_t = (sg(log p_t) - mean sg(log p)) (A_t - mean A)`` over the valid tokens of
    the call (means over valid tokens only); detached, 0 on padding. ``advantages`` [B] or
    [B, T]; inputs must already be finite on padding (:func:`masked_inputs`)."""
    m = bool_mask(mask)
    lp = logp.detach()
    adv = token_advantages(advantages, lp)
    cov = (lp - masked_mean(lp, m)) * (adv - masked_mean(adv, m))
    return torch.where(m, cov, torch.zeros_like(cov))


def _count(ratio: float, n: int) -> int:
    """Tokens to select: ``max(1, floor(ratio * n))`` (verl's rounding), 0 when ``n == 0``."""
    return max(1, int(ratio * n)) if n else 0


def clip_cov_select(
    cov: Tensor, candidates: Tensor, clip_ratio: float, n_valid: int, generator: torch.Generator | None = None
) -> Tensor:
    """A bool [B, T] mask of ``max(1, floor(clip_ratio * n_valid))`` tokens drawn uniformly
    without replacement among ``candidates`` (all of them if fewer), with ``generator``."""
    idx = torch.nonzero(candidates.reshape(-1), as_tuple=True)[0]
    chosen = torch.zeros(candidates.numel(), dtype=torch.bool, device=cov.device)
    k = min(_count(clip_ratio, n_valid), idx.numel())
    if k:
        perm = torch.randperm(idx.numel(), generator=generator)[:k].to(idx.device)
        chosen[idx[perm]] = True
    return chosen.reshape(candidates.shape)


@POLICY_LOSSES.register("clip_cov", bounds={
    "clip_ratio": ("(0, 1]", "a share of the valid tokens"),
    "clip_low": ("[0, 1]", "the ratio is clipped below at 1 - clip_low, a probability ratio is >= 0"),
    "clip_high": (">= 0", "the ratio is clipped above at 1 + clip_high"),
})
def clip_cov(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_ratio: float = 2e-4,
    cov_lower: float = 1.0,
    cov_upper: float = 5.0,
    clip_low: float | None = None,
    clip_high: float | None = None,
    generator: torch.Generator | None = None,
) -> PolicyLossOutput:
    """Clip-Cov: detach the gradient of a few random tokens of high covariance.

    Formula: ``l_t = -A r_t`` for t not in I, ``l_t = 0`` (no gradient) for t in I: I = ``max(1, floor({clip_ratio} N))`` tokens drawn at random among those with ``Cov_t`` in [{cov_lower}, {cov_upper}], ``Cov_t = (log p_t - mean log p)(A_t - mean A)`` over the N valid tokens; PPO clip: clip_low {clip_low|off}, clip_high {clip_high|off}

    Paper form (default, ``clip_low = clip_high = None``): the unclipped surrogate ``-A r``
    with the selected tokens' gradient removed. verl's form (``policy_loss.loss_mode=clip_cov``,
    set ``clip_low`` and ``clip_high``, e.g. 0.2 / 0.2): the PPO clipped surrogate
    ``max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))``, tokens the PPO clip already
    clipped are not candidates, and the selected ones get loss 0. verl draws among the open
    interval (lb, ub); this uses the closed one. Means and the draw are over the tokens of one
    call (a micro-batch), as in verl. The draw uses ``generator`` (runtime; None: torch's
    default CPU generator, seeded by the run's ``seed``). Clipped tokens: the selected ones
    (and PPO-clipped ones in verl's form). Metrics: ``cov_selected_frac``, ``cov_mean``.

    Paper: "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models"
    (Cui et al. 2025, arXiv 2505.22617); defaults r = 2e-4, omega_low = 1, omega_high = 5
    (the paper's and verl's).

    Parameters:
        clip_ratio (2e-4): share r of the valid tokens whose gradient is removed (at least 1 token).
        cov_lower (1.0): lower end omega_low of the covariance window of candidate tokens.
        cov_upper (5.0): upper end omega_high of the covariance window (cov_lower > cov_upper: no candidate).
        clip_low (None): PPO clip below (ratio bound 1 - clip_low); None: no PPO clip (the paper).
        clip_high (None): PPO clip above (ratio bound 1 + clip_high); None: clip_low's value (no clip when both None).
    """
    if clip_high is None:
        clip_high = clip_low
    if clip_low is None:
        clip_low = clip_high
    logp, old_logp, advantages = masked_inputs(logp, old_logp, advantages, mask)
    m = bool_mask(mask)
    ratio = torch.exp(log_ratio(logp, old_logp))
    adv = token_advantages(advantages, logp)
    loss = -adv * ratio
    ppo_clipped = torch.zeros_like(m)
    if clip_low is not None:
        loss2 = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
        ppo_clipped = (loss2 > loss) & m
        loss = torch.maximum(loss, loss2)
    cov = token_covariance(logp, advantages, m)
    candidates = m & ~ppo_clipped & (cov >= cov_lower) & (cov <= cov_upper)
    selected = clip_cov_select(cov, candidates, clip_ratio, int(m.sum()), generator)
    loss = torch.where(selected, torch.zeros_like(loss), loss)
    metrics = _ratio_metrics(ratio, m)
    metrics["cov_selected_frac"] = masked_mean(selected.to(logp.dtype), m)
    metrics["cov_mean"] = masked_mean(cov, m)
    return _finish(loss, selected | ppo_clipped, m, metrics)


@POLICY_LOSSES.register("kl_cov", bounds={
    "kl_ratio": ("(0, 1]", "a share of the valid tokens"),
    "kl_coef": (">= 0", "a penalty weight; < 0 would reward moving the selected tokens away"),
})
def kl_cov(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    kl_ratio: float = 2e-4,
    kl_coef: float = 1.0,
) -> PolicyLossOutput:
    """KL-Cov: a KL penalty on the tokens of largest covariance.

    Formula: ``l_t = -A r_t + {kl_coef} * |log r_t|`` for the ``max(1, floor({kl_ratio} N))`` valid tokens of largest ``Cov_t = (log p_t - mean log p)(A_t - mean A)`` (over the N valid tokens), ``l_t = -A r_t`` for the others

    The surrogate is unclipped (paper and verl agree). The penalty ``|log r|`` is verl's
    per-token KL (the paper writes D_KL(pi_old || pi_theta)); its gradient is
    ``sign(log r) grad log p``, which is 0 where r = 1 exactly, so on a single on-policy
    update (``logp == old_logp``) KL-Cov equals the plain surrogate: it acts from the second
    optimizer step on a batch (several mini-batches / iterations per generation, or stale
    rollouts). Top-k over the tokens of one call (a micro-batch), as in verl; ties broken by
    ``torch.topk``. Nothing is clipped (``clipped`` all False). Metrics: ``kl_selected_frac``,
    ``kl_abs_mean`` (mean |log r| over valid tokens), ``cov_mean``.

    Paper: "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models"
    (Cui et al. 2025, arXiv 2505.22617); k = 2e-4 and beta = 1 as verl's defaults (the
    paper uses k = 2e-3 for its 7B model, 2e-4 for 32B).

    Parameters:
        kl_ratio (2e-4): share k of the valid tokens (largest covariance first) that get the penalty (at least 1).
        kl_coef (1.0): penalty weight beta on |log r| for the selected tokens.
    """
    logp, old_logp, advantages = masked_inputs(logp, old_logp, advantages, mask)
    m = bool_mask(mask)
    lr = log_ratio(logp, old_logp)
    ratio = torch.exp(lr)
    adv = token_advantages(advantages, logp)
    cov = token_covariance(logp, advantages, m)
    flat_valid = torch.nonzero(m.reshape(-1), as_tuple=True)[0]
    selected = torch.zeros(m.numel(), dtype=torch.bool, device=logp.device)
    k = _count(kl_ratio, flat_valid.numel())
    if k:
        top = torch.topk(cov.reshape(-1)[flat_valid].float(), k).indices
        selected[flat_valid[top]] = True
    selected = selected.reshape(m.shape)
    loss = -adv * ratio + torch.where(selected, kl_coef * lr.abs(), torch.zeros_like(lr))
    metrics = _ratio_metrics(ratio, m)
    metrics["kl_selected_frac"] = masked_mean(selected.to(logp.dtype), m)
    metrics["kl_abs_mean"] = masked_mean(lr.detach().abs(), m)
    metrics["cov_mean"] = masked_mean(cov, m)
    return _finish(loss, torch.zeros_like(m), m, metrics)
