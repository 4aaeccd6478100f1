"""Uni-O4's offline phase (registered in ``TERMS`` as ``unio4_offline``): PPO's clipped
objective on the offline rows, the ratio taken against a behaviour policy estimated by
behaviour cloning.

"Uni-O4: Unifying Online and Offline Deep Reinforcement Learning with Multi-Step On-Policy
Optimization" (Lei et al., arXiv 2311.03351). The same on-policy objective serves both phases:
offline, the policy starts from the behaviour-cloned policy ``pi_b`` and maximises
``min(r A, clip(r, 1 - eps, 1 + eps) A)`` with ``r = pi_theta(a|s) / pi_b(a|s)`` over the
dataset's actions; online, it runs PPO from the offline policy. The authors' offline loss:
Lei-Kun/Uni-O4 @ 1eecc451952c54775c5902f21d25555a8c575593, ppo.py:89-114 (ratio against
``_old_policy``, a copy of the BC-initialised policy; ``-(min(loss1, loss2) + entropy).mean()``);
the online loss: ppo_finetune/ppo.py:157-161 (the same clipped surrogate on GAE advantages).

mixrl's pieces (the staged preset ``algo=unio4``): stage ``bc`` fits ``pi_b`` by SFT on the
offline (expert) rows; stage ``offline`` starts from those weights, so the reference model *is*
``pi_b``, and this term applies the registered policy loss (``ppo_clip`` by default, the one the
online stage uses) to the expert tokens with ``ref_logp`` as the behaviour log-prob, each token
one action; stage ``online`` runs ``ppo`` (critic + GAE) from the offline weights.

Differences from the paper (our reading): one BC policy, not an ensemble of diverse ones; the
denominator stays ``pi_b`` for the whole offline stage (the paper replaces it by the improved
policy when its offline policy evaluation approves: multi-step improvement); the advantage of
an offline row is ``R - V(x)`` with ``V(x)`` the mean reward of the policy's rollouts of ``x``
(``dr_grpo`` on on-policy rows only, as A-LoL's preset) instead of ``Q - V`` fitted by SARSA/IQL;
no asymmetric advantage weight (the authors' ``omega`` 0.7) and no entropy bonus; the online
critic starts fresh (the paper carries the offline value function over).
"""

from __future__ import annotations

from mixrl.core.policy_losses import POLICY_LOSSES
from mixrl.core.terms import TERMS, TermInputs, TermOutput, ratio_stats


@TERMS.register("unio4_offline")
def unio4_offline(x: TermInputs, *, loss: dict | None = None) -> TermOutput:
    """Uni-O4 offline phase: the online stage's clipped objective on offline tokens, the ratio against the BC policy.

    Formula: l_t = {loss}(r_t, A) on the selected (offline) tokens, r_t = p_t / pi_ref(y_t), pi_ref the reference model = the behaviour-cloned (BC) policy the offline stage starts from (in algo=unio4); ppo_clip: l_t = max(-A r_t, -A clip(r_t, 1 - eps, 1 + eps))
    Paper: "Uni-O4: Unifying Online and Offline Deep Reinforcement Learning with Multi-Step On-Policy Optimization" (arXiv 2311.03351); authors' code Lei-Kun/Uni-O4 @ 1eecc45, ppo.py:89-114. One BC policy (not an ensemble), no OPE-gated replacement of pi_b, A = R - V(x) from the policy's rollouts: our reading.

    Parameters:
        loss (None): the policy loss ``{name, params...}`` (default ``ppo_clip`` with clip 0.2, the authors' clip_ratio).
    """
    spec = dict(loss or {"name": "ppo_clip"})
    fn = POLICY_LOSSES.get(spec.pop("name"))
    out = fn(x.logp, x.ref_logp, x.advantages, x.mask, **spec)
    if not bool(x.mask.any()):  # a micro-batch without offline rows: no metrics (a 0 would drag their means down)
        return TermOutput(out.per_token_loss, {})
    metrics = {f"unio4/{k}": float(v) for k, v in out.metrics.items() if k != "ratio_mean"}
    metrics.update({f"unio4/{k}": v for k, v in ratio_stats(x.logp, x.ref_logp, x.mask).items()})
    metrics["unio4/clip_frac"] = float(out.clipped[x.mask.bool()].float().mean())
    return TermOutput(out.per_token_loss, metrics)


unio4_offline.needs = ("ref_logp",)
