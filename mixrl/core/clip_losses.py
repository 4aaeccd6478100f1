"""PPO-style trust regions on the token ratio: the hard clip (``ppo_clip``, LUFFY's
``reshaped_ppo``), the soft gate (``sapo``) and the second-moment mask (``m2po``).

Signature and conventions: :mod:`mixrl.core.policy_base` (``r = exp(clamp(logp - old_logp,
-20, 20))``, ``A`` the advantage, ``sg`` stop-gradient, ``p = exp(logp)``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from mixrl.core._tensor import (
    bool_mask,
    log_ratio,
    masked_inputs,
    masked_mean,
    token_advantages,
    zero_masked,
)
from mixrl.core.policy_base import POLICY_LOSSES, PolicyLossOutput, _finish, _ratio_metrics


@POLICY_LOSSES.register("ppo_clip", bounds={
    "clip_low": ("[0, 1]", "the ratio is clipped below at 1 - clip_low, a probability ratio is >= 0"),
    "clip_high": (">= 0", "the ratio is clipped above at 1 + clip_high"),
    "dual_clip_c": ("> 1", "the dual clip bounds -A r by -c A for A < 0; c <= 1 would cut below the clipped surrogate"),
})
def ppo_clip(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip_c: float | None = None,
    clip: bool = True,
) -> PolicyLossOutput:
    """PPO clipped surrogate (PPO / GRPO; the RL term of CHORD, LUFFY; DAPO clip-higher).

    Formula: ``l_t = max(-A r_t, -A clip(r_t, 1 - {clip_low}, 1 + {clip_high}))`` (clip = {clip}; false: ``l_t = -A r_t``); dual clip
    c = {dual_clip_c|inf (off)}: ``l_t = min(l_t, -c A)`` where A < 0

    The dual clip (CHORD's code, c = 3) bounds the loss of negative-advantage tokens when r
    is very large. Clipped tokens: those where the constant branch is active (zero gradient).

    Paper: "Proximal Policy Optimization Algorithms" (Schulman et al. 2017); GRPO
    ("DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models");
    dual clip: "Mastering Complex Control in MOBA Games with Deep Reinforcement Learning"
    (Ye et al. 2020), as shipped in CHORD. ``clip: false`` is the unclipped surrogate
    ``-A r`` (the Critique-GRPO authors' ``loss_remove_clip=True``: zhangxy-2019/critique-GRPO
    @ e8f03a2, verl/verl/critique_grpo/critique_core_algos.py:592-599).

    Parameters:
        clip_low (0.2): epsilon below 1 (ratio lower bound 1 - clip_low).
        clip_high (0.2): epsilon above 1 (ratio upper bound 1 + clip_high; DAPO uses 0.28).
        dual_clip_c (None): dual-clip constant c > 1 for A < 0; None disables it.
        clip (True): false drops the clip: l = -A r (no token is clipped; the dual clip still applies if set).
    """
    logp, old_logp, advantages = masked_inputs(logp, old_logp, advantages, mask)
    if dual_clip_c is not None and dual_clip_c <= 1.0:
        raise ValueError(f"ppo_clip: dual_clip_c must be > 1, got {dual_clip_c}")
    ratio = torch.exp(log_ratio(logp, old_logp))
    adv = token_advantages(advantages, logp)
    loss1 = -adv * ratio
    if clip:
        loss2 = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
        loss = torch.maximum(loss1, loss2)
        clipped = loss2 > loss1
    else:
        loss, clipped = loss1, torch.zeros_like(loss1, dtype=torch.bool)
    metrics = _ratio_metrics(ratio, mask)
    if dual_clip_c is not None:
        loss3 = -adv * dual_clip_c
        dual = (adv < 0) & (loss > loss3)
        loss = torch.where(adv < 0, torch.minimum(loss, loss3), loss)
        clipped = clipped | dual
        metrics["dual_clip_frac"] = masked_mean(dual.to(logp.dtype), mask)
    return _finish(loss, clipped, mask, metrics)



#: LUFFY's ``on_policy_reshape`` forms (``p_div_p_0.1`` = ``p_div_p`` with gamma 0.1)
ON_POLICY_RESHAPES = ("no_reshape", "p_div_p", "logp", "p_logp", "square_root", "pow")


@POLICY_LOSSES.register("reshaped_ppo", bounds={
    "clip_low": ("[0, 1]", "the reshaped ratio is clipped below at 1 - clip_low"),
    "clip_high": (">= 0", "the reshaped ratio is clipped above at 1 + clip_high"),
    "gamma": ("> 0", "f(p) = p / (p + gamma): gamma <= 0 divides by zero or inverts it"),
    "logp_coef": (">= 0", "the log r coefficient of p_logp; a negative one turns its gradient around"),
    "pow_exp": ("> 0", "r ** pow_exp with pow_exp <= 0 decreases in r, turning the gradient around"),
})
def reshaped_ppo(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    reshape: str = "no_reshape",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    gamma: float = 0.1,
    logp_coef: float = 0.1,
    pow_exp: float = 0.5,
) -> PolicyLossOutput:
    """PPO clip on a reshaped ratio (LUFFY's ``on_policy_reshape`` options).

    Formula: ``l_t = max(-A g_t, -A clip(g_t, 1 - {clip_low}, 1 + {clip_high}))``, g = {reshape}: no_reshape r | p_div_p f(p) / f(p_old), f(p) = p / (p + {gamma}) | logp log r | p_logp r + {logp_coef} log r | square_root sqrt(r) | pow r^{pow_exp}

    ``no_reshape`` is ``ppo_clip``. LUFFY's ``p_div_p_0.1`` / ``p_div_p_0.5`` are
    ``p_div_p`` with gamma 0.1 / 0.5; its ``on_policy_reshape_weight`` is ``logp_coef`` (used
    by p_logp only; LUFFY's ``logp`` form takes no weight on the on-policy side). Its upper
    bound ``max(clip_upper_bound, 1 + eps)`` is ``1 + clip_high`` here. Clipped tokens: where
    the constant branch is active.

    Paper: LUFFY, "Learning to Reason under Off-Policy Guidance" (arXiv 2504.14945), the
    on_policy_reshape options of its verl fork; PPO ("Proximal Policy Optimization
    Algorithms", Schulman et al. 2017).

    Parameters:
        reshape (no_reshape): no_reshape | p_div_p | logp | p_logp | square_root | pow.
        clip_low (0.2): lower bound 1 - clip_low on the reshaped ratio.
        clip_high (0.2): upper bound 1 + clip_high on the reshaped ratio.
        gamma (0.1): p_div_p's constant.
        logp_coef (0.1): the log r coefficient of p_logp.
        pow_exp (0.5): the exponent of pow.
    """
    if reshape not in ON_POLICY_RESHAPES:
        raise ValueError(f"reshaped_ppo: reshape must be one of {', '.join(ON_POLICY_RESHAPES)}, got {reshape!r}")
    logp, old_logp, advantages = masked_inputs(logp, old_logp, advantages, mask)
    lr = log_ratio(logp, old_logp)
    ratio = torch.exp(lr)
    if reshape == "no_reshape":
        g = ratio
    elif reshape == "p_div_p":
        p, p_old = logp.exp(), old_logp.detach().exp()
        g = (p / (p + gamma)) / (p_old / (p_old + gamma))
    elif reshape == "logp":
        g = lr
    elif reshape == "p_logp":
        g = ratio + logp_coef * lr
    elif reshape == "square_root":
        g = ratio.sqrt()
    else:
        g = ratio.pow(pow_exp)
    adv = token_advantages(advantages, logp)
    loss1 = -adv * g
    loss2 = -adv * torch.clamp(g, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss1, loss2)
    return _finish(loss, loss2 > loss1, mask, _ratio_metrics(ratio, mask))



@POLICY_LOSSES.register("sapo", bounds={
    "tau_pos": ("> 0", "the gate is (4 / tau) sigmoid(tau (r - 1)): tau <= 0 divides by zero or inverts it"),
    "tau_neg": ("> 0", "the gate is (4 / tau) sigmoid(tau (r - 1)): tau <= 0 divides by zero or inverts it"),
})
def sapo(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    detach_gate: bool = False,
) -> PolicyLossOutput:
    """SAPO: a smooth sigmoid gate instead of the hard clip.

    Formula: ``l_t = -(4 / tau) sigmoid(tau (r_t - 1)) A``, ``tau = {tau_pos}`` if A > 0 else ``{tau_neg}``; detach_gate = {detach_gate}: ``l_t = -sg((4 / tau) sigmoid(tau (r_t - 1))) A log p_t`` instead

    Gradient: ``-A * 4 sigmoid(x)(1 - sigmoid(x)) * r * grad log p`` with x = tau (r - 1):
    equal to the PPO gradient at r = 1 and smoothly attenuated away from it. The gate never
    zeroes a gradient, so ``clipped`` is all False; metric ``gate_mean`` is the mean
    gradient weight ``4 s (1 - s)``.

    ``detach_gate: true`` reproduces Trinity-RFT's ``sapo`` loss, which multiplies
    ``log p`` by the stopped gate value: its gradient is ``-A (4 / tau) s * grad log p``,
    i.e. the gate VALUE ``(4 / tau) s`` is used as the token weight instead of the paper's
    gradient weight ``4 s (1 - s) r`` (at r = 1: 2 / tau against 1; Trinity's weight keeps
    growing with r where the paper's decays). The default (false) follows the paper, verl and
    TRL, which differentiate through the gate.

    Paper: "Soft Adaptive Policy Optimization" (SAPO, Qwen, Gao et al. 2025, arXiv
    2511.20347); tau_pos = 1.0, tau_neg = 1.05 as in the public implementations
    (Trinity-RFT, verl).

    Parameters:
        tau_pos (1.0): gate temperature for A > 0.
        tau_neg (1.05): gate temperature for A <= 0.
        detach_gate (false): Trinity-RFT's form, -sg(gate) A log p (gate value as token weight).
    """
    logp, old_logp, advantages = masked_inputs(logp, old_logp, advantages, mask)
    ratio = torch.exp(log_ratio(logp, old_logp))
    adv = token_advantages(advantages, logp)
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    sig = torch.sigmoid(tau * (ratio - 1.0))
    if detach_gate:
        loss = -((4.0 / tau) * sig).detach() * adv * logp
        gate = ((4.0 / tau) * sig).detach()
    else:
        loss = -(4.0 / tau) * sig * adv
        gate = (4.0 * sig * (1.0 - sig)).detach()
    metrics = _ratio_metrics(ratio, mask)
    metrics["gate_mean"] = masked_mean(gate, mask)
    return _finish(loss, torch.zeros_like(logp, dtype=torch.bool), mask, metrics)



def m2_keep_mask(log_r: Tensor, mask: Tensor, budget: float) -> Tensor:
    """Keep the most tokens such that mean over kept tokens of ``(log r)^2 <= budget``.

    Masks the fewest tokens, always those with the largest ``(log r)^2`` (ties broken by
    position). Returns a bool [B, T] keep-mask (False on padding).
    """
    m = bool_mask(mask)
    sq = log_r.detach().pow(2)
    flat_valid = m.reshape(-1)
    values = sq.reshape(-1)[flat_valid]
    keep_flat = torch.zeros_like(flat_valid)
    n = values.numel()
    if n:
        order = torch.argsort(values, stable=True)
        cummean = torch.cumsum(values[order], 0) / torch.arange(
            1, n + 1, dtype=values.dtype, device=values.device
        )
        # cumulative mean of ascending values is non-decreasing: keep the longest prefix
        k = int((cummean <= budget).sum().item())
        kept_sorted = torch.arange(n, device=values.device) < k
        kept_valid = torch.zeros(n, dtype=torch.bool, device=values.device)
        kept_valid[order] = kept_sorted
        keep_flat[flat_valid] = kept_valid
    return keep_flat.reshape(m.shape)


@POLICY_LOSSES.register("m2po", bounds={"m2_budget": (">= 0", "a budget on the mean squared log-ratio, which is >= 0")})
def m2po(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    m2_budget: float = 0.04,
    budget_over: str = "all",
) -> PolicyLossOutput:
    """M2PO: second-moment trust region; mask only the most extreme tokens.

    Formula: ``l_t = -r_t A`` on kept tokens, 0 on masked ones; the fewest tokens (largest
    ``(log r_t)^2``) are masked so that mean over kept tokens of ``(log r_t)^2 <= {m2_budget}``;
    budget_over = {budget_over}: all tokens, or only those with ``A log r_t > 0`` (the others always kept)

    ``budget_over: harmful`` is the paper's Algorithm 1 reading: only tokens whose ratio moved
    in the direction their advantage pushes (A > 0 and r > 1, or A < 0 and r < 1: ``A log r > 0``)
    count in the second moment and may be masked; the mean is over the kept ones of them.
    ``all`` (the default, unchanged) budgets every valid token.

    Kept tokens use the unclipped surrogate (gradient ``-r A grad log p``). The budget is
    enforced over the valid tokens of this call (one micro-batch). Clipped tokens: the
    masked ones. Metrics: ``m2_before``, ``m2_after``. The authors' public code instead
    derives a clip bound from the budget over "harmful" tokens only; this is the abstract's
    masking formulation.

    Paper: "Prosperity before Collapse: How Far Can Off-Policy RL Reach with Stale Data on
    LLMs?" (M2PO), tau = 0.04 from the paper.

    Parameters:
        m2_budget (0.04): budget tau on the mean of (log r)^2 over kept tokens.
        budget_over (all): all | harmful (only tokens with A log r > 0 are budgeted and may be masked).
    """
    if budget_over not in ("all", "harmful"):
        raise ValueError(f"m2po: budget_over must be 'all' or 'harmful', got {budget_over!r}")
    logp, old_logp, advantages = masked_inputs(logp, old_logp, advantages, mask)
    lr = log_ratio(logp, old_logp)
    ratio = torch.exp(lr)
    adv = token_advantages(advantages, logp)
    if budget_over == "harmful":
        valid = bool_mask(mask)
        harmful = valid & (adv * lr.detach() > 0)
        keep = m2_keep_mask(lr, harmful, m2_budget) | (valid & ~harmful)
    else:
        keep = m2_keep_mask(lr, mask, m2_budget)
    loss = zero_masked(-ratio * adv, keep)
    m = bool_mask(mask)
    sq = lr.detach().pow(2)
    metrics = _ratio_metrics(ratio, mask)
    metrics["m2_before"] = masked_mean(sq, m)
    metrics["m2_after"] = masked_mean(sq, keep)
    return _finish(loss, m & ~keep, mask, metrics)

