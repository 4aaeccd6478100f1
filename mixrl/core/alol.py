"""A-LoL's offline policy-gradient term (registered in ``TERMS`` as ``alol``).

"Leftover Lunch: Advantage-based Offline Reinforcement Learning for Language Models"
(Baheti et al., arXiv 2305.14718; published as "Improving Language Models with
Advantage-based Offline Policy Gradients"). What its abstract fixes: the whole output
sequence is one action, its reward is sequence-level, the advantage uses the LM's own
sequence-level value estimate, and negative-advantage (low-quality) rows are filtered out;
training uses pre-existing data only (offline).

Our reading, for mixrl's pieces:

* **advantage** ``A(x, y) = R(x, y) - V(x)``: ``V(x)`` is estimated by Monte Carlo as the mean
  reward of the policy's own rollouts of ``x`` in the same group (the paper fits a value head
  on the frozen reference LM instead; our model has none). In a recipe this is the ``dr_grpo``
  advantage with ``advantage_include_offpolicy: false``: an expert row gets ``R - mean`` of the
  rollouts of its group. The rollouts only estimate ``V``; no term trains on them (offline);
* **negative-advantage rows dropped**: rows with ``A <= 0`` get no gradient (the term is 0 on
  them; they still count in the row mean of the aggregation, a per-batch constant factor);
* **clipped sequence-level importance weight** ``w = clip(pi_theta(y|x) / pi_ref(y|x), 1 - eps,
  1 + eps)``, a constant (stop-gradient) per row; ``pi_ref`` is the reference (initial) policy,
  the behaviour-policy proxy of the offline data, as in the paper; ``eps`` is PPO's 0.2 by default
  (our choice);
* per row the loss is ``-A w log pi_theta(y|x)``: with the ``seq-mean-token-sum`` aggregation
  (a sum over the row's tokens, a mean over rows), its gradient is the paper's
  ``-A w grad log pi_theta(y|x)``.
"""

from __future__ import annotations

import torch

from mixrl.core._tensor import LOG_RATIO_CLAMP, masked_mean, token_advantages
from mixrl.core.terms import TERMS, TermInputs, TermOutput


def sequence_log_ratio(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B]: ``sum_t (log p_t - log pi_ref_t)`` over each row's selected tokens, detached and
    clamped to [-20, 20] (before ``exp``)."""
    m = mask.bool()
    d = torch.where(m, logp.detach() - ref_logp.detach(), torch.zeros((), dtype=logp.dtype, device=logp.device))
    return d.sum(-1).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


@TERMS.register("alol", bounds={"clip_eps": ("[0, 1)", "the weight is clipped to [1 - eps, 1 + eps], which must stay positive")})
def alol(x: TermInputs, *, clip_eps: float = 0.2) -> TermOutput:
    """A-LoL: offline policy gradient with the whole sequence as one action, positive-advantage rows only.

    Formula: l_t = -1[A > 0] A sg(w) log p_t, w = clip(pi_theta(y|x) / pi_ref(y|x), 1 - {clip_eps}, 1 + {clip_eps}) per row (sequence-level ratio), A = R - V(x)
    Paper: A-LoL, "Leftover Lunch: Advantage-based Offline Reinforcement Learning for Language Models" (arXiv 2305.14718). The abstract fixes the sequence as one action, the LM's value estimate and the negative-advantage filter; the clipped sequence-level weight against the reference policy is from the paper's body; V(x) as the mean reward of the policy's rollouts of x is our reading (the paper trains a value head on the reference LM).

    Parameters:
        clip_eps (0.2): the sequence weight pi_theta / pi_ref is clipped to [1 - clip_eps, 1 + clip_eps].
    """
    m = x.mask.bool()
    adv = x.advantages.detach()
    if adv.dim() == 2:  # a per-token advantage: A-LoL's is per sequence, read at the first selected token
        first = m.float().argmax(-1, keepdim=True)
        adv = adv.gather(-1, first).squeeze(-1)
    adv = adv.to(x.logp.dtype)
    rows = m.any(-1)
    keep = rows & (adv > 0)
    w = sequence_log_ratio(x.logp, x.ref_logp, m).exp().clamp(1.0 - clip_eps, 1.0 + clip_eps)
    coef = torch.where(keep, adv * w, torch.zeros_like(adv))
    per_token = -token_advantages(coef, x.logp) * x.logp
    n_rows = float(rows.sum())
    metrics = {
        "alol/kept": float(keep.sum()) / n_rows if n_rows else 0.0,
        "alol/weight": float(masked_mean(w, keep)) if bool(keep.any()) else 0.0,
        "alol/advantage": float(masked_mean(adv, rows)) if n_rows else 0.0,
    }
    return TermOutput(per_token, metrics)


alol.needs = ("ref_logp",)
