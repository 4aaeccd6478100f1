"""Terms of the objective: each a per-token loss on the tokens a term selects.

Signature of every registered term::

    fn(x: TermInputs, *, <params>) -> TermOutput

The objective (:mod:`mixrl.core.objective`) selects each term's tokens by provenance,
hands them over as ``x.mask``, aggregates the returned ``per_token`` loss over the term's
normalising population and multiplies it by the term's weight. A term never aggregates and
never sees tokens outside its selection (their values in ``x`` are made finite, so NaN at
unselected positions cannot reach a gradient). Notation: ``p = exp(logp)``, ``A`` the row's
advantage, ``r = p / pi_b`` the importance ratio against the behaviour probability, ``sg``
stop-gradient.

Attributes a term function may declare (read by config validation and ``mixrl explain``):

* ``needs_behaviour = True``: it takes a ratio, so every provenance it selects must have a
  known behaviour probability (see :mod:`mixrl.core.provenance`);
* ``needs = ("ref_logp",)`` / ``("teacher_logp",)`` / ``("teacher_logp", "teacher_entropy")``:
  per-token inputs it reads;
* ``row_loss = True``: its per-token loss spreads a per-row (per-pair) loss over the row's
  tokens, so it is aggregated with ``seq-mean-token-sum`` (the preference terms);
* ``engine_corrected = True``: when an inference engine generates, the objective multiplies
  its per-token loss on policy-sampled tokens by the engine-mismatch weight
  (:mod:`mixrl.core.engine_mismatch`), as TRL multiplies its policy loss.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from mixrl.core import token_weights  # shaped() reads token_weights.luffy_shaped_ratio per call (the pins patch it)
from mixrl.core._tensor import masked_mean, token_advantages
from mixrl.core.policy_losses import POLICY_LOSSES
from mixrl.core.registry import Registry
from mixrl.core.regularizers import kl_penalty
from mixrl.core.regularizers import teacher_kl as _teacher_kl
from mixrl.core.token_weights import TOKEN_WEIGHTS

TERMS = Registry("term")


@dataclass
class TermInputs:
    """What a term may read. Every tensor is [B, T] unless noted; ``mask`` is the term's
    selection (bool), ``behaviour_logp`` the log-prob each selected token was sampled with
    (finite on the selection whenever the term needs it), ``overrides`` knob values a
    controller set for this step (e.g. ``{"clip_low": 0.3}`` for the policy loss)."""

    logp: Tensor
    mask: Tensor
    advantages: Tensor  # [B] or [B, T]
    behaviour_logp: Tensor
    ref_logp: Tensor | None = None
    teacher_logp: Tensor | None = None
    entropies: Tensor | None = None
    overrides: dict = field(default_factory=dict)
    #: the teacher's next-token entropy at each position (SRPO's weights; NaN where not scored)
    teacher_entropy: Tensor | None = None
    #: log-probs of the policy at generation time (pi_old) on every selected token, whatever its
    #: provenance (RL-PLUS's mixture denominator on expert tokens); None: not given
    old_logp: Tensor | None = None
    #: per-row fields [B] of the batch a term may read (the pair links of :mod:`mixrl.core.preference`)
    rows: dict | None = None
    #: [B, T] the policy turn of each token of a multi-turn row (:func:`mixrl.core.turns.turn_ids`; -1: none); None: single-turn
    turns: Tensor | None = None


@dataclass
class TermOutput:
    per_token: Tensor
    metrics: dict[str, float] = field(default_factory=dict)


def top_entropy_mask(mask: Tensor, entropies: Tensor | None, top_entropy: float | None) -> Tensor:
    """The selected tokens (``mask``) whose entropy is among the ``top_entropy`` share of highest
    entropies of the selection: k = ceil(top_entropy * n) of the n selected tokens (at least 1),
    plus tokens tied with the k-th. ``top_entropy`` None: ``mask`` itself."""
    if top_entropy is None:
        return mask
    if not 0.0 < float(top_entropy) <= 1.0:
        raise ValueError(f"top_entropy must be in (0, 1], got {top_entropy}")
    if entropies is None:
        raise ValueError("top_entropy needs the per-token entropies")
    h = entropies.detach()
    if h.dtype in (torch.float16, torch.bfloat16):
        h = h.float()  # topk of half precision is not on every device; float32 holds every half value exactly
    sel = h[mask]
    if not sel.numel():
        return mask
    k = max(1, math.ceil(float(top_entropy) * sel.numel()))
    # the threshold is one of the entropies, in their own dtype: the k-th token always passes
    # (a float32-rounded threshold of float64 entropies dropped it when rounding went up)
    threshold = torch.topk(sel, k).values.min()
    return mask & (h >= threshold)


@TERMS.register("policy", bounds={"top_entropy": ("(0, 1]", "a share of the selected tokens")})
def policy(x: TermInputs, *, loss: dict | None = None, top_entropy: float | None = None) -> TermOutput:
    """Policy-gradient term: the configured policy loss on tokens with a known behaviour,
    optionally only on the selected tokens of highest entropy in the micro-batch.

    Formula: l_t = {loss}(r_t, A) m_t with r_t = p_t / pi_b(y_t), pi_b the behaviour policy; m_t = 1[H_t in the top {top_entropy|1 (all tokens)} share of the selected tokens' entropies]
    Paper: PPO / GRPO (DeepSeekMath); the loss is any registered policy loss. top_entropy:
    "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective Reinforcement
    Learning for LLM Reasoning" (arXiv 2506.01939), rho = 0.2; TRL's top_entropy_quantile.

    Parameters:
        loss (None): the policy loss ``{name, params...}``; default ``algo.loss``.
        top_entropy (None): share rho of the selected tokens (highest entropy first) that keep
            their loss; the others get loss 0 but still count in the aggregation's denominator
            (as TRL). k = ceil(rho * n) of the n selected tokens of the micro-batch (at least 1);
            ties with the k-th entropy are kept. null = all tokens.
    """
    spec = dict(loss or {"name": "ppo_clip"})
    name = spec.pop("name")
    spec.update(x.overrides)
    fn = POLICY_LOSSES.get(name)
    if x.turns is not None and "turn_ids" in inspect.signature(fn).parameters:
        spec["turn_ids"] = x.turns  # a turn-level loss (mixrl.core.turns)
    out = fn(x.logp, x.behaviour_logp, x.advantages, x.mask, **spec)
    metrics = {f"policy/{k}": float(v) for k, v in out.metrics.items()}
    if top_entropy is not None:
        keep = top_entropy_mask(x.mask, x.entropies, top_entropy)
        metrics["policy/entropy_kept"] = float(keep.sum()) / max(float(x.mask.sum()), 1.0)
        return TermOutput(out.per_token_loss * keep.to(out.per_token_loss.dtype), {**metrics, **_policy_stats(out, x)})
    return TermOutput(out.per_token_loss, {**metrics, **_policy_stats(out, x)})


def _policy_stats(out, x: TermInputs) -> dict[str, float]:
    stats = {"clip_frac": float(masked_mean(out.clipped.float(), x.mask)) if bool(x.mask.any()) else 0.0}
    stats.update(ratio_stats(x.logp, x.behaviour_logp, x.mask))
    return stats


def ratio_stats(logp: Tensor, behaviour_logp: Tensor, mask: Tensor) -> dict[str, float]:
    """Importance-ratio statistics over the selected tokens (detached): ``ratio/mean``,
    ``ratio/max``, ``ratio/m2`` = mean (log r)^2 (M2PO's second moment) and ``ratio/ess``, the
    normalised effective sample size (sum r)^2 / (n sum r^2) in (0, 1] (1: all weights equal)."""
    sel = mask.bool()
    if not bool(sel.any()):
        return {}
    lr = (logp.detach() - behaviour_logp.detach())[sel].double().clamp(-20.0, 20.0)
    r = lr.exp()
    return {
        "ratio/mean": float(r.mean()),
        "ratio/max": float(r.max()),
        "ratio/m2": float((lr * lr).mean()),
        "ratio/ess": float(r.sum() ** 2 / (r.numel() * (r * r).sum())) if bool(torch.isfinite(r).all()) else 0.0,
    }


policy.needs_behaviour = True
policy.engine_corrected = True


@TERMS.register("nll")
def nll(x: TermInputs, *, token_weight: dict | None = None) -> TermOutput:
    """Weighted negative log-likelihood (supervised term; no ratio, no advantage).

    Formula: l_t = -sg(w(p_t)) log p_t, w the token weight ({token_weight})
    Paper: SFT; CHORD ("On-Policy RL Meets Off-Policy Experts", arXiv 2508.11408) with w = phi.

    Parameters:
        token_weight (None): ``{name, params...}`` from the token-weight registry; default one.
    """
    spec = dict(token_weight or {"name": "one"})
    fn = TOKEN_WEIGHTS.get(spec.pop("name"))
    weight = fn(x.logp, **spec)
    logp = x.logp
    if getattr(fn, "clamps_logp", False):  # Trinity-RFT's cutoff: log p clamped at log(cutoff)
        logp = token_weights.clamped_logp(logp, spec.get("cutoff"))
    return TermOutput(-weight * logp)


@TERMS.register("shaped", bounds={"gamma": ("> 0", "-A p / (p + gamma): gamma < 0 inverts the gradient (and divides by zero at p = -gamma), gamma = 0 removes it")})
def shaped(x: TermInputs, *, gamma: float = 0.1) -> TermOutput:
    """LUFFY's policy shaping on off-policy tokens: the ratio is replaced by f(p), no clip.

    Formula: l_t = -A f(p_t), f(p) = p / (p + {gamma}) (behaviour probability taken as 1)
    Paper: LUFFY, "Learning to Reason under Off-Policy Guidance" (arXiv 2504.14945).

    Parameters:
        gamma (0.1): shaping constant; the gradient weight gamma p / (p + gamma)^2 peaks at p = gamma.
    """
    adv = token_advantages(x.advantages, x.logp)
    return TermOutput(-adv * token_weights.luffy_shaped_ratio(x.logp, gamma=gamma))


@TERMS.register("shaped_ratio", bounds={"gamma": ("> 0", "-A w / (w + gamma): gamma <= 0 inverts the gradient or divides by zero")})
def shaped_ratio(x: TermInputs, *, gamma: float = 0.1) -> TermOutput:
    """ExGRPO's shaped importance weight on replayed tokens: LUFFY's f applied to the importance
    ratio against the stored behaviour log-probs, no clip.

    Formula: l_t = -A f(w_t), w_t = p_t / pi_b(y_t) (pi_b: the log-prob stored when the token was sampled), f(w) = w / (w + {gamma})
    Paper: ExGRPO, "ExGRPO: Learning to Reason from Experience" (arXiv 2510.02245); its code (ElliottYan/LUFFY ExGRPO/, mix_core_alg.py:133-143 at 01f4ae06): off_ratio = exp(log_prob - old_log_prob) with the recorded old log-probs (exp_is_correct), then off_ratio / (off_ratio + 0.1).

    Parameters:
        gamma (0.1): shaping constant (the authors' p_div_p_0.1).
    """
    adv = token_advantages(x.advantages, x.logp)
    w = torch.exp(x.logp - x.behaviour_logp.detach())
    f = w / (w + gamma)
    return TermOutput(-adv * f, {"shaped_ratio/f_mean": float(masked_mean(f.detach(), x.mask)) if bool(x.mask.any()) else 0.0})


shaped_ratio.needs_behaviour = True


@TERMS.register("reshaped", bounds={
    "gamma": ("> 0", "p / (p + gamma): gamma <= 0 inverts the gradient or divides by zero"),
    "logp_coef": (">= 0", "the log p coefficient; a negative one turns the gradient around"),
    "pow_exp": ("> 0", "p ** pow_exp with pow_exp <= 0 decreases in p, turning the gradient around"),
    "max_clip": ("> 0", "an upper bound on f(p), as LUFFY's off_policy_max_clip (a probability-like value)"),
    "min_clip": (">= 0", "a lower bound on f(p), as LUFFY's off_policy_min_clip (a probability-like value)"),
})
def reshaped(
    x: TermInputs,
    *,
    reshape: str = "p_div_p",
    gamma: float = 0.1,
    logp_coef: float = 0.1,
    pow_exp: float = 0.5,
    max_clip: float | None = None,
    min_clip: float | None = None,
) -> TermOutput:
    """LUFFY's off-policy loss with any of its reshape functions and its max / min clips.

    Formula: l_t = -A clip(f(p_t), {min_clip}, {max_clip}) (None: no bound), f = {reshape}: no_reshape p | p_div_p p / (p + {gamma}) | logp {logp_coef} log p | p_logp p + {logp_coef} log p | square_root sqrt(p) | pow p^{pow_exp}
    Paper: LUFFY, "Learning to Reason under Off-Policy Guidance" (arXiv 2504.14945); the options of its verl fork (off_policy_reshape, off_policy_max_clip, off_policy_min_clip).

    The behaviour probability is taken as 1 (r = p). With the defaults this is the ``shaped``
    term (p_div_p, gamma 0.1). A clip bound replaces f by the constant bound where f passes it
    (zero gradient there), as LUFFY's clamp does; LUFFY's -1 (off) is None here.

    Parameters:
        reshape (p_div_p): no_reshape | p_div_p | logp | p_logp | square_root | pow (LUFFY's p_div_p_0.1 = p_div_p with gamma 0.1).
        gamma (0.1): p_div_p's constant.
        logp_coef (0.1): the log p coefficient of logp and p_logp (LUFFY's off_policy_reshape_weight).
        pow_exp (0.5): the exponent of pow (LUFFY's off_policy_reshape_pow_exp).
        max_clip (None): f is clamped above at max_clip (LUFFY's off_policy_max_clip).
        min_clip (None): f is clamped below at min_clip (LUFFY's off_policy_min_clip).
    """
    adv = token_advantages(x.advantages, x.logp)
    f = token_weights.luffy_off_policy_ratio(x.logp, reshape, gamma=gamma, weight=logp_coef, pow_exp=pow_exp)
    if max_clip is not None:
        f = torch.clamp(f, max=max_clip)
    if min_clip is not None:
        f = torch.clamp(f, min=min_clip)
    return TermOutput(-adv * f, {"reshaped/f_mean": float(masked_mean(f.detach(), x.mask))})


@TERMS.register("advantage_nll", bounds={"top_entropy": ("(0, 1]", "a share of the selected tokens")})
def advantage_nll(x: TermInputs, *, top_entropy: float | None = None) -> TermOutput:
    """Advantage-weighted log-likelihood on written tokens (their behaviour probability is
    unknown, so no ratio: it is taken as 1, unclipped); optionally only on the selected
    tokens of highest entropy in the micro-batch.

    Formula: l_t = -A m_t log p_t, m_t = 1[H_t >= the ({top_entropy}) top-entropy quantile of the selected tokens] (all when null)
    Paper: Prefix-RFT, "Blending Supervised and Reinforcement Fine-Tuning with Prefix Sampling" (arXiv 2507.01679): demonstration-prefix tokens get the rollout's advantage, updates only on the top 20% by entropy.

    Parameters:
        top_entropy (None): share of the selected tokens (highest entropy first) that get a gradient; null = all.
            k = ceil(top_entropy * n) of the n selected tokens are kept (at least 1); tokens tied with the
            k-th entropy are kept too, so ties may keep more than k.
    """
    adv = token_advantages(x.advantages, x.logp)
    keep = top_entropy_mask(x.mask, x.entropies, top_entropy)
    return TermOutput(-adv * keep.to(x.logp.dtype) * x.logp, {"advantage_nll/kept": float(keep.sum()) / max(float(x.mask.sum()), 1.0)})


advantage_nll.needs = ("entropies",)


@TERMS.register("kl")
def kl(x: TermInputs, *, estimator: str = "k3") -> TermOutput:
    """KL penalty to the reference policy on sampled tokens.

    Formula: l_t = KL_{estimator}(pi_theta || pi_ref) per token
    Paper: GRPO (DeepSeekMath); estimators from Schulman, "Approximating KL divergence".

    Parameters:
        estimator (k3): k1 | k2 | k3 | k3_clamped.
    """
    per_token = kl_penalty(x.logp, x.ref_logp, estimator=estimator)
    d = (x.ref_logp - x.logp.detach())
    return TermOutput(per_token, {"kl": float(masked_mean(d.exp() - d - 1, x.mask))})


kl.needs = ("ref_logp",)


@TERMS.register("entropy")
def entropy(x: TermInputs) -> TermOutput:
    """Token entropy of the policy (weight it negatively for a bonus).

    Formula: l_t = H(pi_theta(. | s_t))
    Paper: entropy regularisation (Williams & Peng 1991); EntroPIC sets its coefficient.

    Parameters: none.
    """
    return TermOutput(x.entropies)


entropy.needs = ("entropies",)


@TERMS.register("teacher_kl")
def teacher_kl(x: TermInputs, *, estimator: str = "k2") -> TermOutput:
    """Reverse KL to a teacher on student-sampled tokens (teacher log-probs carried per token).

    Formula: l_t = KL_{estimator}(pi_theta || pi_teacher) per token
    Paper: on-policy distillation (Agarwal et al., "On-Policy Distillation of Language Models",
    arXiv 2306.13649); KDRL ("KDRL: Post-Training Reasoning LLMs via Unified Knowledge Distillation and
    Reinforcement Learning", arXiv 2506.02208) adds it to the RL objective with the k2 estimator.

    Parameters:
        estimator (k2): k1 | k2 | k3 | k3_clamped. As a loss on y_t ~ pi_theta: k2's gradient
            (log p - log q) grad log p is the reverse-KL gradient (KDRL's choice); k3's is the
            forward-KL gradient; k1's is grad log p, zero in expectation (a value to monitor, not to train).
    """
    return TermOutput(_teacher_kl(x.logp, x.teacher_logp, estimator=estimator))


teacher_kl.needs = ("teacher_logp",)


@TERMS.register("kl_convex", bounds={"lam": ("[0, 1]", "the weight of a convex combination")})
def kl_convex(x: TermInputs, *, lam: float = 0.5, estimator: str = "k3") -> TermOutput:
    """ReMix's KL-Convex policy constraint: a convex combination of the KL to the base
    (reference) model and the KL to the precedent policy, the one each token was sampled by.

    Formula: l_t = {lam} KL_{estimator}(pi_theta || pi_ref)_t + (1 - {lam}) KL_{estimator}(pi_theta || pi_b)_t, pi_b the token's behaviour policy
    Paper: ReMix, "Squeeze the Soaked Sponge: Efficient Off-policy Reinforcement Finetuning for Large Language Model" (arXiv 2507.06892). Only the abstract's description was found ("combines the KL constraints on the base model and the precedent model"); this is the closest stated reading: the precedent model is taken to be the behaviour policy (pi_old for rollouts), the combination weight is lam.

    With ``trainer.num_iterations = 1`` the precedent part is 0 with zero gradient on fresh
    rollouts (pi_theta = pi_old on the only pass); it acts from the second pass on.

    Parameters:
        lam (0.5): weight of the KL to the base model (1 - lam on the precedent policy), in [0, 1].
        estimator (k3): k1 | k2 | k3 | k3_clamped.
    """
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"kl_convex: lam must be in [0, 1], got {lam}")
    base = kl_penalty(x.logp, x.ref_logp, estimator=estimator)
    prev = kl_penalty(x.logp, x.behaviour_logp, estimator=estimator)
    m = x.mask
    metrics = {"kl_convex/base": float(masked_mean(base.detach(), m)), "kl_convex/precedent": float(masked_mean(prev.detach(), m))}
    return TermOutput(lam * base + (1.0 - lam) * prev, metrics)


kl_convex.needs = ("ref_logp",)
kl_convex.needs_behaviour = True


def term_needs(kind: str) -> tuple[str, ...]:
    return tuple(getattr(TERMS.get(kind), "needs", ()))


def term_needs_behaviour(kind: str) -> bool:
    return bool(getattr(TERMS.get(kind), "needs_behaviour", False))
