"""Distillation terms on teacher-scored tokens (registered in ``TERMS``).

Every term here reads ``teacher_logp`` (``log pi_T(y_t)``, the teacher's log-prob of the
token the student sampled, carried per token and constant) and the student's ``logp``. Only
the sampled token's probability is known per position, not the full next-token
distributions, so each divergence is a single-sample estimate over the student's own
rollouts (``y_t ~ pi_theta``): its **value** is an unbiased estimate of the per-position
divergence, and its **gradient** is an unbiased estimate of the divergence's gradient (the
score-function form ``E_y[g(y) grad log pi_theta(y)]``; the dependence of later positions on
earlier tokens is ignored, as in per-token on-policy distillation). Notation: ``p = pi_theta(y_t)``,
``q = pi_T(y_t)``, ``sg`` stop-gradient.

* ``teacher_kl`` (:mod:`mixrl.core.terms`) with ``estimator: k2`` is the reverse KL as a loss:
  the gradient of ``(log p - log q)^2 / 2`` is ``(log p - log q) grad log p``.
* ``teacher_jsd``: TRL's generalised JSD (``GKDTrainer.generalized_jsd_loss``: beta = 0 forward
  KL(T || S), beta = 1 reverse KL(S || T), else the beta-mixture JSD) as a sampled-token
  estimate. TRL's function needs both models' full logits [B, T, V]; mixrl carries one number
  per token, so TRL's function is the test oracle (exact expectation over a small vocabulary)
  rather than the implementation.
* ``opd_reward``: on-policy distillation as a dense per-token advantage
  ``lam (log q - log pi_old)`` inside a policy loss (OPD; with the student at generation time as
  the reference, lam > 1 only scales the step: see its docstring).
* ``gopd_reward``: G-OPD / ExOPD with the paper's fixed reference model (the frozen starting
  student, ``ref_logp``): ``lam (log q - log pi_ref) - (log pi_old - log pi_ref)``, so lam > 1
  extrapolates the reward beyond the teacher.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from mixrl.core.policy_losses import POLICY_LOSSES
from mixrl.core.terms import TERMS, TermInputs, TermOutput


def _with_grad(value: Tensor, coef: Tensor, logp: Tensor) -> Tensor:
    """``sg(value) + sg(coef) * (logp - sg(logp))``: the value ``value`` with the gradient
    ``coef * grad logp``."""
    return value.detach() + coef.detach() * (logp - logp.detach())


def jsd_per_token(logp: Tensor, teacher_logp: Tensor, beta: float, ratio_cap: float | None = None) -> Tensor:
    """Per-token generalised JSD estimate on student-sampled tokens (TRL's convention for beta).

    With ``p`` the student's and ``q`` the teacher's probability of the sampled token,
    ``w = q / p`` (capped at ``ratio_cap`` if set) and ``m = (1 - beta) p + beta q``:

    * beta = 0 (forward KL(q || p)): value ``w (log q - log p)``, gradient ``-w grad log p``;
    * beta = 1 (reverse KL(p || q)): value ``log p - log q``, gradient ``(log p - log q) grad log p``;
    * else: value ``beta w log(q / m) + (1 - beta) log(p / m)``, gradient ``(1 - beta) log(p / m) grad log p``.
    """
    q = teacher_logp.detach()
    lp = logp.detach()
    log_w = torch.clamp(q - lp, max=20.0)
    w = log_w.exp()
    if ratio_cap is not None:
        w = w.clamp(max=float(ratio_cap))
    if beta == 0.0:
        return _with_grad(w * (q - lp), -w, logp)
    if beta == 1.0:
        return _with_grad(lp - q, lp - q, logp)
    # log m = logsumexp(log(1-beta) + log p, log(beta) + log q)
    log_m = torch.logaddexp(lp + math.log1p(-beta), q + math.log(beta))
    value = beta * w * (q - log_m) + (1.0 - beta) * (lp - log_m)
    return _with_grad(value, (1.0 - beta) * (lp - log_m), logp)


@TERMS.register("teacher_jsd", bounds={
    "beta": ("[0, 1]", "the mixture m = (1 - beta) p + beta q is a distribution only for beta in [0, 1]"),
    "ratio_cap": ("> 0", "a cap on the importance weight q / p, which is > 0"),
})
def teacher_jsd(x: TermInputs, *, beta: float = 0.5, ratio_cap: float | None = None) -> TermOutput:
    """Generalised JSD to a teacher on student-sampled tokens (beta = 0: forward KL, 1: reverse KL).

    Formula: l_t = est. of JSD_{beta}(pi_T || pi_theta) at y_t ~ pi_theta: beta w log(q/m) + (1-beta) log(p/m), w = q/p, m = (1-beta) p + beta q; gradient (1-beta) log(p/m) grad log p
    Paper: GKD, "On-Policy Distillation of Language Models: Learning from Self-Generated Mistakes" (arXiv 2306.13649), TRL's generalized_jsd_loss.

    Parameters:
        beta (0.5): 0 forward KL(teacher || student), 1 reverse KL(student || teacher), else the mixture JSD.
        ratio_cap (None): cap on the importance weight w = q / p (forward KL and JSD); None: uncapped (unbiased).
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"teacher_jsd: beta must be in [0, 1], got {beta}")
    return TermOutput(jsd_per_token(x.logp, x.teacher_logp, beta, ratio_cap))


teacher_jsd.needs = ("teacher_logp",)


@TERMS.register("opd_reward", bounds={"lam": ("> 0", "A = lam (log q - log pi_old): lam < 0 pushes away from the teacher, 0 gives no signal")})
def opd_reward(x: TermInputs, *, lam: float = 1.0, loss: dict | None = None) -> TermOutput:
    """On-policy distillation as a dense per-token advantage in a policy loss (OPD; G-OPD / ExOPD).

    Formula: A_t = {lam} (log pi_T(y_t) - log pi_old(y_t)), used in place of the row's advantage; l_t = {loss}(r_t, A_t), r_t = pi_theta / pi_old
    Paper: G-OPD / ExOPD, "Learning beyond Teacher: Generalized On-Policy Distillation with Reward Extrapolation" (with a fixed reference model, lam > 1 extrapolates); OPD's per-token reward log pi_T - log pi_theta.

    Parameters:
        lam (1.0): reward scale lambda; 1 is standard OPD. Here the reference is pi_old, so lam > 1 scales the update (see below).
        loss (None): the policy loss ``{name, params...}``; default ``reinforce``: l_t = -A_t log p_t (no ratio, no clip; its gradient -A_t grad log p_t is that of -A_t r_t at r_t = 1).

    What is computed: the advantage ``A_t = lam (log pi_T(y_t) - log pi_old(y_t))`` (teacher and
    behaviour log-probs, both constants) goes into the configured policy loss; with the default
    ``reinforce`` the per-token loss is ``-A_t log p_t`` and its gradient ``-A_t grad log p_t``.
    At lam = 1 on-policy (pi_old = pi_theta) this is the gradient of the k2 reverse KL to the
    teacher (standard OPD).

    How this relates to the paper: G-OPD maximises ``E_y~pi_theta[lam log(pi_T / pi_ref) -
    KL(pi_theta || pi_ref)]`` with a fixed reference model pi_ref (the student's base model; the
    teacher's pre-RL base for "reward correction"), a per-token advantage
    ``lam (log pi_T - log pi_ref) - (log pi_theta - log pi_ref)`` whose optimum
    ``pi_ref (pi_T / pi_ref)^lam`` lies beyond the teacher when lam > 1 (reward extrapolation). This
    term takes pi_ref = pi_old, the student at generation time: the KL part then has no gradient
    on-policy and the update is lam times OPD's, so lam > 1 scales the gradient rather than
    extrapolating, and AdamW's per-parameter normalisation undoes that scale (measured on the tiny
    model, 4 steps of ``algo=exopd`` when it used this term: lam = 1, 1.25 and 3 end within 2.2e-6 of each other in
    weight norm, for an update of norm 0.096). The fixed-reference form is ``gopd_reward``
    (``algo=exopd``).
    """
    spec = dict(loss or {"name": "reinforce"})
    name = spec.pop("name")
    adv = float(lam) * (x.teacher_logp.detach() - x.behaviour_logp.detach())
    out = POLICY_LOSSES.get(name)(x.logp, x.behaviour_logp, adv, x.mask, **spec)
    metrics = {"opd/advantage": float((adv * x.mask).sum() / x.mask.sum().clamp(min=1))}
    return TermOutput(out.per_token_loss, metrics)


opd_reward.needs = ("teacher_logp",)
opd_reward.needs_behaviour = True


@TERMS.register("gopd_reward", bounds={"lam": ("> 0", "A = lam (log q - log pi_ref) - (log pi_old - log pi_ref): lam <= 0 drops or inverts the teacher's reward")})
def gopd_reward(x: TermInputs, *, lam: float = 1.25, loss: dict | None = None) -> TermOutput:
    """G-OPD / ExOPD: the teacher's log-ratio to a fixed reference model, scaled by lambda, minus the student's, as a dense advantage.

    G-OPD maximises ``E_y~pi_theta[lam log(pi_T(y) / pi_ref(y)) - KL(pi_theta || pi_ref)]``, whose
    optimum is ``pi_ref (pi_T / pi_ref)^lam``: beyond the teacher, away from the reference, when
    lam > 1. Its per-token reward ``lam (log pi_T - log pi_ref) - (log pi_theta - log pi_ref)`` is
    taken at the sampled token with ``pi_theta`` at generation time (``pi_old``, a constant), and
    goes into the configured policy loss as the advantage. ``pi_ref`` is the reference model mixrl
    already loads for KL terms: the starting student, frozen (TRL's reference model; with LoRA,
    the base with the adapter off). At lam = 1 the reference cancels and this is ``opd_reward``;
    with ``pi_ref = pi_old`` it would be ``lam (log pi_T - log pi_old)``, where lam only scales
    the step (``opd_reward``'s docstring), which is why the reference here is fixed. The paper's
    "reward correction" (pi_ref = the teacher's pre-RL base) needs that model's log-probs and is
    not offered.

    Formula: A_t = {lam} (log pi_T(y_t) - log pi_ref(y_t)) - (log pi_old(y_t) - log pi_ref(y_t)), pi_ref the frozen starting student, used in place of the row's advantage; l_t = {loss}(r_t, A_t), r_t = pi_theta / pi_old
    Paper: G-OPD / ExOPD, "Learning beyond Teacher: Generalized On-Policy Distillation with Reward Extrapolation": the reward lam log(pi_T / pi_ref) and the KL to pi_ref, both dense; lam > 1 (ExOPD) extrapolates beyond the teacher.

    Parameters:
        lam (1.25): reward scale lambda; 1 is OPD (the reference cancels), > 1 reward extrapolation (ExOPD; the paper's 1.25).
        loss (None): the policy loss ``{name, params...}``; default ``reinforce``: l_t = -A_t log p_t.
    """
    spec = dict(loss or {"name": "reinforce"})
    name = spec.pop("name")
    q, ref, old = x.teacher_logp.detach(), x.ref_logp.detach(), x.behaviour_logp.detach()
    adv = float(lam) * (q - ref) - (old - ref)
    out = POLICY_LOSSES.get(name)(x.logp, x.behaviour_logp, adv, x.mask, **spec)
    n = x.mask.sum().clamp(min=1)
    metrics = {"opd/advantage": float((adv * x.mask).sum() / n),
               "opd/teacher_vs_ref": float(((q - ref) * x.mask).sum() / n)}
    return TermOutput(out.per_token_loss, metrics)


gopd_reward.needs = ("teacher_logp", "ref_logp")
gopd_reward.needs_behaviour = True
