"""The training objective: policy loss, off-policy terms and regularisers, per row source.

Pure tensor math (no TRL, no transformers). The trainer hands over one micro-batch of
rows, each tagged with its source, plus the global counts needed to normalise each term
over the whole optimizer step; this module returns the scalar loss and its parts.

Rows and sources (``row_source`` values):
    ON_POLICY = 0   rollouts of the current policy (behaviour log-probs = old_logp)
    EXPERT    = 1   off-policy expert demonstrations (behaviour probability unknown)
    REPLAY    = 2   stale rollouts with known behaviour log-probs (treated like on-policy)

Mixing modes (``ObjectiveSpec.mix_mode``):
    none          L = Agg_all[ l_pi ]
    aux_loss      L = (1 - mu_t) * Agg_on[ l_pi ] + mu_t * Agg_exp[ -sg(w(p)) * log p ]      (CHORD)
                  each term normalised over its own rows/tokens, so mu alone sets the balance.
    group_inject  L = Agg_all[ l_pi on on-policy tokens ;  -A * f(p) on expert tokens ]        (LUFFY)
                  with f(p) = p / (p + gamma) (behaviour probability taken as 1, no clip).
    sft           L = Agg_exp[ -sg(w(p)) * log p ]  (aux_loss with mu = 1: supervised fine-tuning)
Regularisers (on on-policy rows only): + kl_coef * Agg_on[ KL_est(pi || pi_ref) ] - c_ent(t) * mean_on[ H ].
``Agg`` is the configured aggregation; its normaliser is the global token count (token-mean)
or the global row count (sequence modes) of the rows it covers, pre-scaled by the trainer
for processes and gradient accumulation, so micro-batch losses add up to the full-step loss.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

ON_POLICY, EXPERT, REPLAY = 0, 1, 2
SOURCE_NAMES = {ON_POLICY: "on_policy", EXPERT: "expert", REPLAY: "replay"}


@dataclass
class ObjectiveSpec:
    """Everything the objective needs from the config, as plain values."""

    policy_loss: str = "ppo_clip"
    policy_params: dict = field(default_factory=dict)
    aggregation: str = "token-mean"
    aggregation_params: dict = field(default_factory=dict)
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: Any = 0.0  # number or schedule spec
    mix_mode: str = "none"  # none | aux_loss | group_inject | sft
    mu: Any = 0.0  # number or schedule spec (aux_loss)
    token_weight: str = "one"  # aux_loss expert-token weight
    token_weight_params: dict = field(default_factory=dict)
    shaping_gamma: float = 0.1  # group_inject: f(p) = p / (p + gamma)


def _counts(mask: torch.Tensor) -> tuple[float, float]:
    """(tokens, rows with at least one token) under a [B, T] mask."""
    m = mask.float()
    return float(m.sum()), float((m.sum(-1) > 0).sum())


def _normaliser(aggregation: str, counts: tuple[float, float]) -> float:
    tokens, rows = counts
    return max(tokens if aggregation == "token-mean" else rows, 1.0)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.float()
    return (x * m).sum() / m.sum().clamp(min=1.0)


def compute_objective(
    spec: ObjectiveSpec,
    *,
    logp: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    row_source: torch.Tensor | None = None,
    old_logp: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    entropies: torch.Tensor | None = None,
    step: int = 0,
    normalisers: Mapping[str, tuple[float, float]] | None = None,
    policy_overrides: Mapping[str, float] | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss of one micro-batch and its parts (as floats, for logging).

    ``normalisers[k] = (tokens, rows)`` for k in ``on_policy``, ``expert``, ``all``: the
    effective counts that each term divides by (the trainer scales global counts by
    processes and accumulation steps). Without them, local counts of this micro-batch are
    used. ``policy_overrides`` replaces policy-loss parameters for this step (controllers).
    """
    from mixrl.core import AGGREGATIONS, POLICY_LOSSES, TOKEN_WEIGHTS
    from mixrl.core.regularizers import kl_penalty
    from mixrl.core.schedules import resolve_schedule
    from mixrl.core.token_weights import luffy_shaped_ratio

    mask = mask.float()
    if row_source is None:
        row_source = torch.zeros(logp.shape[0], dtype=torch.long, device=logp.device)
    if old_logp is None:
        old_logp = logp.detach()
    is_expert = (row_source == EXPERT).float().unsqueeze(1)
    mask_exp = mask * is_expert
    mask_on = mask * (1.0 - is_expert)
    local = {"on_policy": _counts(mask_on), "expert": _counts(mask_exp), "all": _counts(mask)}
    norm = {k: _normaliser(spec.aggregation, (normalisers or local)[k]) for k in local}

    aggregate = AGGREGATIONS.get(spec.aggregation)
    params = dict(spec.policy_params)
    params.update(policy_overrides or {})
    pol = POLICY_LOSSES.get(spec.policy_loss)(logp, old_logp, advantages, mask_on, **params)
    metrics: dict[str, float] = {}
    for k, v in pol.metrics.items():
        metrics[f"policy/{k}"] = float(v)
    metrics["clip_frac"] = float(_masked_mean(pol.clipped.float(), mask_on)) if local["on_policy"][0] else 0.0

    if spec.mix_mode == "group_inject":
        # LUFFY: expert tokens use the shaped probability in place of the ratio, no clipping
        shaped = luffy_shaped_ratio(logp, gamma=spec.shaping_gamma)
        exp_tok = -advantages.unsqueeze(1) * shaped * mask_exp
        per_token = pol.per_token_loss * mask_on + exp_tok
        loss = aggregate(per_token, mask, num_items=norm["all"], **spec.aggregation_params)
        metrics["loss/policy"] = float(aggregate(pol.per_token_loss.detach(), mask_on, num_items=norm["on_policy"], **spec.aggregation_params))
        metrics["loss/offpolicy"] = float(aggregate(exp_tok.detach(), mask_exp, num_items=norm["expert"], **spec.aggregation_params))
    elif spec.mix_mode in ("aux_loss", "sft"):
        mu = 1.0 if spec.mix_mode == "sft" else float(resolve_schedule(spec.mu)(step))
        rl = aggregate(pol.per_token_loss, mask_on, num_items=norm["on_policy"], **spec.aggregation_params)
        weight = TOKEN_WEIGHTS.get(spec.token_weight)(logp, **spec.token_weight_params)
        sft = aggregate(-weight * logp * mask_exp, mask_exp, num_items=norm["expert"], **spec.aggregation_params)
        loss = (1.0 - mu) * rl + mu * sft
        metrics.update({"loss/policy": float(rl.detach()), "loss/sft": float(sft.detach()), "mu": mu})
    elif spec.mix_mode == "none":
        loss = aggregate(pol.per_token_loss, mask_on, num_items=norm["on_policy"], **spec.aggregation_params)
        metrics["loss/policy"] = float(loss.detach())
    else:
        raise ValueError(f"unknown mix mode {spec.mix_mode!r}")

    if local["expert"][0]:
        metrics["expert/token_prob"] = float(_masked_mean(logp.detach().exp(), mask_exp))
    metrics["expert/row_frac"] = float(is_expert.mean()) if logp.shape[0] else 0.0

    if spec.kl_coef and ref_logp is not None:
        kl_tok = kl_penalty(logp, ref_logp, estimator=spec.kl_estimator)
        kl = aggregate(kl_tok * mask_on, mask_on, num_items=norm["on_policy"], **spec.aggregation_params)
        loss = loss + spec.kl_coef * kl
        metrics["loss/kl"] = float(kl.detach())
    if ref_logp is not None:
        metrics["kl"] = float(_masked_mean((ref_logp - logp.detach()).exp() - (ref_logp - logp.detach()) - 1, mask_on))

    if entropies is not None:
        metrics["entropy"] = float(_masked_mean(entropies.detach(), mask_on))
        coef = float(resolve_schedule(spec.entropy_coef)(step))
        if coef:
            # token-mean entropy of on-policy tokens over the whole step (same scaling as the loss terms)
            ent = (entropies * mask_on).sum() / max((normalisers or local)["on_policy"][0], 1.0)
            loss = loss - coef * ent
            metrics["loss/entropy_bonus"] = float(-coef * ent.detach())
            metrics["entropy_coef"] = coef
    metrics["loss/total"] = float(loss.detach())
    return loss, metrics
