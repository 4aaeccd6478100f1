"""CalibRL: the expert's log-probs as a calibration baseline for each rollout's tokens (a term).

"Controllable Exploration in Hybrid-Policy RLVR for Multi-Modal Reasoning" (ICLR 2026,
OpenReview 5wxyCidRsK; no arXiv id found). Authors' code: zhh6425/CalibRL @
0efd799160ec69a3c212e75ba4eb6334c721b8ec, ``src/core_algos.py``:

* lines 94-126 (``compute_mix_grpo_outcome_advantage``): the GRPO advantage over each group's
  rollouts only; every row of a group gets the group's expert row's per-token log-probs at rollout
  time (``pref_log_prob``, position by position) and ``pass = score > 0.1``;
* lines 262-271 (``compute_mix_policy_loss``, ``expert-guided``): the expert rows leave the policy
  loss; on the rollouts a guided loss ``|A| LeakyReLU_{0.5}(-(2 pass - 1)(log pi_theta - log
  pi_old(expert)))`` per token, aggregated like the policy loss over the rollouts' tokens;
* ``src/dp_actor.py`` line 449: ``policy_loss + 0.1 * guided_loss``.

The "distribution-aware advantage weighting by group rareness" of the paper is, in the code, the
``|A|`` factor (``weight_with_adv``): a rare outcome in its group has a large ``|A|``.

Pieces here: :func:`expert_baseline` (the per-row baseline, computed once per batch by the
``calibrl`` shaping hook of :mod:`mixrl.trainer.parts.advantage_shaping`, which writes it into the
batch as the row fields ``calib_logp``, ``calib_has`` and ``calib_pass``) and the term
``calibrl`` that reads them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from mixrl.core import provenance as prov
from mixrl.core._tensor import token_advantages
from mixrl.core.advantage_shaping import SHAPINGS
from mixrl.core.terms import TERMS, TermInputs, TermOutput

#: the batch's row fields the term reads (written by the shaping hook)
CALIB_FIELDS = ("calib_logp", "calib_has", "calib_pass")


def expert_baseline(token_logp: Tensor, mask: Tensor, group_ids: Tensor, is_expert: Tensor) -> tuple[Tensor, Tensor]:
    """Each row's baseline ``b[i, t]`` = the first expert row of its group's log-prob at position t,
    and where one exists (``has``: the group has an expert row with a token at t)."""
    n, width = token_logp.shape
    base = torch.zeros_like(token_logp, dtype=torch.float32)
    has = torch.zeros((n, width), dtype=torch.bool, device=token_logp.device)
    first: dict[int, int] = {}
    for i in range(n):
        g = int(group_ids[i])
        if bool(is_expert[i]) and g not in first:
            first[g] = i
    for i in range(n):
        j = first.get(int(group_ids[i]))
        if j is not None:
            base[i] = token_logp[j].float()
            has[i] = mask[j].bool()
    return base, has


@SHAPINGS.register("calibrl")
def calibrl(advantages: Tensor, *, rewards: Tensor | None = None, group_ids: Tensor | None = None,
            include: Tensor | None = None, token_logp: Tensor | None = None, mask: Tensor | None = None,
            pass_threshold: float = 0.1) -> Tensor:
    """CalibRL's baseline: the advantage unchanged; each row is given its group's expert log-probs.

    Not a re-weighting: ``A' = A``. The stage hands each row the per-token log-probs at rollout time
    of its group's expert row (position by position) and whether its reward passes
    ``pass_threshold``, as the row fields the ``calibrl`` term reads (the authors'
    ``pref_log_prob`` and ``pass_sample_mask``, zhh6425/CalibRL @
    0efd799160ec69a3c212e75ba4eb6334c721b8ec ``src/core_algos.py`` lines 104-126).

    Formula: ``A'_i = A_i``; b_i,t = log pi_old(e_t | x, e_<t), e the group's expert row; pass_i = 1[R_i > {pass_threshold}]

    Paper: CalibRL, "Controllable Exploration in Hybrid-Policy RLVR for Multi-Modal Reasoning"
    (ICLR 2026, OpenReview 5wxyCidRsK).

    Parameters:
        pass_threshold (0.1): a row whose reward is above it passes (the authors' 0.1).
    """
    return advantages.detach().float()


calibrl.needs = ("token_logp", "mask")


def calibrl_fields(runtime: dict, *, rewards: Tensor, group_ids: Tensor, sources: Tensor, params: dict) -> dict:
    """The row fields of the global batch [N, ...] the ``calibrl`` term reads."""
    base, has = expert_baseline(runtime["token_logp"], runtime["mask"], group_ids, sources == prov.EXPERT)
    passed = rewards.float() > float(params.get("pass_threshold", 0.1))
    return {"calib_logp": base, "calib_has": has, "calib_pass": passed}


calibrl.fields = calibrl_fields


@TERMS.register("calibrl", bounds={"negative_slope": ("[0, 1]", "LeakyReLU's slope below 0: above 1 the calibrated side would be pushed harder than the other")})
def calibrl_term(x: TermInputs, *, negative_slope: float = 0.5) -> TermOutput:
    """CalibRL's guided loss: ``|A| LeakyReLU(s (log pi - b))`` per token, b the expert's log-prob at the same position.

    s = -1 for a passing rollout (its tokens pulled up towards, then past, the expert's
    log-prob), +1 for a failing one (pushed down); LeakyReLU's slope ``negative_slope`` on the side
    past the baseline moderates the update there (the authors' asymmetric activation, slope 0.5).
    ``|A|`` weights rare outcomes in their group. Tokens with no expert token at their position
    (past the expert's end, or a group without an expert row) get loss 0. Reads the row fields
    ``calib_logp``, ``calib_has``, ``calib_pass`` (``algo.shaping.name=calibrl`` writes them).

    Formula: l_t = |A| LeakyReLU_{negative_slope}(-(2 pass - 1)(log pi(y_t) - b_t)) on tokens with an expert token at t
    Paper: CalibRL, "Controllable Exploration in Hybrid-Policy RLVR for Multi-Modal Reasoning"
    (ICLR 2026, OpenReview 5wxyCidRsK); zhh6425/CalibRL @ 0efd799160ec69a3c212e75ba4eb6334c721b8ec
    src/core_algos.py lines 262-271.

    Parameters:
        negative_slope (0.5): LeakyReLU's slope for negative inputs.
    """
    rows = x.rows or {}
    missing = [k for k in CALIB_FIELDS if k not in rows]
    if missing:
        raise ValueError("the calibrl term reads the expert baseline that algo.shaping.name=calibrl writes; it is not in the batch")
    base = rows["calib_logp"].to(x.logp.device, x.logp.dtype)[:, : x.logp.shape[1]]
    has = rows["calib_has"].to(x.logp.device).bool()[:, : x.logp.shape[1]]
    sign = rows["calib_pass"].to(x.logp.device).to(x.logp.dtype) * 2.0 - 1.0
    sel = x.mask & has
    logp = torch.where(sel, x.logp, torch.zeros_like(x.logp))
    gap = -sign.unsqueeze(-1) * (logp - torch.where(sel, base, torch.zeros_like(base)))
    adv = token_advantages(x.advantages, x.logp).detach().abs()
    per_token = adv * F.leaky_relu(gap, negative_slope=negative_slope)
    per_token = torch.where(sel, per_token, torch.zeros_like(per_token))
    return TermOutput(per_token, {"calibrl/covered": float(sel.sum()) / max(float(x.mask.sum()), 1.0)})


#: the provenance whose rows the term reads without training them (config validation: the injected expert rows are used)
calibrl_term.reads_rows = ("expert",)
