"""SRPO's self-distillation term for failed rollouts (registered in ``TERMS`` as ``srpo_distill``).

"Unifying Group-Relative and Self-Distillation Policy Optimization via Sample Routing" (SRPO).
What its abstract fixes: samples are routed by outcome, correct ones to GRPO's reward-aligned
reinforcement and failed ones to SDPO's logit-level self-distillation (the self-teacher: the
policy given privileged context); an entropy-aware dynamic weight suppresses high-entropy,
unreliable distillation targets and emphasises confident ones.

Our reading, in mixrl's pieces (the routing is :class:`mixrl.sources.verdict.RouteByOutcome`,
which marks the tokens of failed rollouts ``failed``; the policy term trains the ``on_policy``
ones, now the correct rollouts, with their group advantage):

* the distillation is the per-token reverse KL to the privileged self-teacher on the failed
  rollout's own tokens, estimated on the sampled token as OPSD's here (k2: value
  ``(log p - log q)^2 / 2``, gradient ``(log p - log q) grad log p``); SDPO's is over the full
  next-token distributions (mixrl carries one teacher number per token);
* the weight of a position is ``w_t = exp(-H_T,t / tau)``, ``H_T,t`` the teacher's next-token
  entropy there (computed in the teacher's forward): 1 for a certain target, small for a
  diffuse one; the exact form and ``tau`` are ours.
"""

from __future__ import annotations

import torch

from mixrl.core._tensor import masked_mean
from mixrl.core.terms import TERMS, TermInputs, TermOutput


def entropy_weight(teacher_entropy: torch.Tensor, tau: float) -> torch.Tensor:
    """``exp(-H / tau)``, detached (a weight, never a gradient path)."""
    return torch.exp(-teacher_entropy.detach().clamp(min=0.0) / float(tau))


@TERMS.register("srpo_distill", bounds={"tau": ("> 0", "exp(-H / tau): tau <= 0 divides by zero or favours diffuse targets")})
def srpo_distill(x: TermInputs, *, tau: float = 1.0) -> TermOutput:
    """SRPO's entropy-weighted self-distillation on failed rollouts (reverse KL to the privileged self-teacher).

    Formula: l_t = w_t (log p_t - log q_t)^2 / 2, w_t = sg(exp(-H_T,t / {tau})), q the privileged self-teacher, H_T its next-token entropy; gradient w_t (log p_t - log q_t) grad log p_t
    Paper: SRPO, "Unifying Group-Relative and Self-Distillation Policy Optimization via Sample Routing": routing correct rollouts to GRPO and failed ones to self-distillation, with entropy-aware weights, is the abstract's; the sampled-token k2 estimate and the form of w are our reading.

    Parameters:
        tau (1.0): entropy scale of the weight exp(-H / tau) (nats).
    """
    if x.teacher_entropy is None:
        if bool(x.mask.any()):
            raise ValueError("srpo_distill needs the teacher's entropies (teacher_entropy), which the batch does not carry")
        return TermOutput(torch.zeros_like(x.logp))
    w = entropy_weight(x.teacher_entropy, tau)
    d = x.logp - x.teacher_logp.detach()
    per_token = w * 0.5 * d * d
    m = x.mask
    metrics = {"srpo/weight": float(masked_mean(w, m)), "srpo/teacher_entropy": float(masked_mean(x.teacher_entropy.detach(), m))} if bool(m.any()) else {}
    return TermOutput(per_token, metrics)


srpo_distill.needs = ("teacher_logp", "teacher_entropy")
