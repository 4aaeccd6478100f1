"""RL-PLUS's term on external (expert) tokens (registered in ``TERMS`` as ``rlplus_external``).

"RL-PLUS: Countering Capability Boundary Collapse of LLMs in Reinforcement Learning with
Hybrid-policy Optimization" (arXiv 2508.00222). What its abstract fixes: external data is
mixed with on-policy rollouts; Multiple Importance Sampling addresses the distribution
mismatch of the external data; an Exploration-Based Advantage Function steers the model to
"high-value, unexplored reasoning paths".

Our reading (the abstract gives neither formula):

* **multiple importance sampling**: an external token's ratio is taken against the mixture of
  the two behaviour policies the batch was drawn from, the policy at generation time and the
  external one, ``r_t = pi_theta(e_t) / (omega pi_old(e_t) + (1 - omega) pi_e(e_t))``. The
  external policy's probability is unknown for a written demonstration: ``pi_e`` is taken as
  the constant ``external_prob`` (1 by default: the demonstrator wrote that token; LUFFY's
  convention). The mixture keeps the ratio bounded by ``1 / (1 - omega)`` where ``pi_old`` is
  small, unlike a ratio against ``pi_old`` alone, and finite where ``pi_e`` is unknown;
* **exploration-based advantage**: the external row's group advantage ``A`` (it shares its
  GRPO group with the rollouts) is scaled per token by ``C_t = (1 - sg(p_t))^gamma``, large
  on tokens the policy finds unlikely (paths it would not explore itself);
* the external term is ``-C_t A r_t``, unclipped; rollouts keep the GRPO policy loss. The
  defaults (``omega`` = 0.5, ``gamma`` = 1) are ours.
"""

from __future__ import annotations

import torch

from mixrl.core._tensor import LOG_RATIO_CLAMP, masked_mean, token_advantages
from mixrl.core.terms import TERMS, TermInputs, TermOutput


def mixture_ratio(logp: torch.Tensor, old_logp: torch.Tensor, omega: float, external_prob: float) -> torch.Tensor:
    """``p / (omega sg(p_old) + (1 - omega) pi_e)``: differentiable in ``logp`` only."""
    denom = omega * old_logp.detach().clamp(max=0.0).exp() + (1.0 - omega) * float(external_prob)
    return torch.exp(logp.clamp(-LOG_RATIO_CLAMP, 0.0)) / denom


def exploration_weight(logp: torch.Tensor, gamma: float) -> torch.Tensor:
    """``C_t = (1 - sg(p_t))^gamma``."""
    return (1.0 - logp.detach().clamp(max=0.0).exp()).clamp(min=0.0) ** float(gamma)


@TERMS.register("rlplus_external", bounds={
    "omega": ("[0, 1)", "the weight of pi_old in the behaviour mixture; 1 leaves no share to the external policy"),
    "external_prob": ("(0, 1]", "a probability; 0 divides by zero where pi_old is 0"),
    "gamma": (">= 0", "(1 - p)^gamma: gamma < 0 weighs likely tokens most"),
})
def rlplus_external(x: TermInputs, *, omega: float = 0.5, external_prob: float = 1.0, gamma: float = 1.0) -> TermOutput:
    """RL-PLUS on external tokens: a ratio against the mixture of behaviour policies, times an exploration-weighted advantage.

    Formula: l_t = -C_t A r_t, r_t = p_t / ({omega} sg(pi_old(e_t)) + (1 - {omega}) {external_prob}), C_t = (1 - sg(p_t))^{gamma}; unclipped
    Paper: RL-PLUS, "RL-PLUS: Countering Capability Boundary Collapse of LLMs in Reinforcement Learning with Hybrid-policy Optimization" (arXiv 2508.00222): multiple importance sampling and an exploration-based advantage are the abstract's; the mixture's weights, pi_e = external_prob and C_t's form are our reading.

    Parameters:
        omega (0.5): weight of pi_old (the policy at generation time) in the behaviour mixture.
        external_prob (1.0): the external policy's probability of its own token (unknown for a demonstration).
        gamma (1.0): exponent of the exploration weight (1 - p)^gamma.
    """
    if x.old_logp is None:
        raise ValueError("rlplus_external needs the policy's log-probs at generation time (old_logp)")
    r = mixture_ratio(x.logp, x.old_logp, omega, external_prob)
    c = exploration_weight(x.logp, gamma)
    adv = token_advantages(x.advantages, x.logp)
    m = x.mask
    metrics = {"rlplus/ratio": float(masked_mean(r.detach(), m)), "rlplus/explore": float(masked_mean(c, m))} if bool(m.any()) else {}
    return TermOutput(-c * adv * r, metrics)
