"""More pair losses on the rows of :mod:`mixrl.core.preference`: noise-debiased DPO (rDPO), the
SLiC / RSO hinge, CoPG's squared reward-difference contrast and OSP's soft-preference cross-entropy.

Every term here reads the pair links the pair injections write (``pair_index``, ``pair_side``, the
partner's sequence log-probs; see :mod:`mixrl.core.preference`) and spreads each pair's loss over
its two rows as the DPO family there does (``row_loss``: the population's rows are the 2K sides of
K pairs, so the objective is the mean pair loss). CoPG and OSP also read the sides' rewards,
``pair_reward`` (the row's own) and ``pair_partner_reward``, which the pair injections write from the
run's reward (the reward functions, a reward model or a judge: ``reward=...``).

Notation as in :mod:`mixrl.core.preference`: ``s(y)`` the sequence log-prob under the policy,
``Delta(y) = s(y) - s_ref(y)``, ``y_w`` chosen, ``y_l`` rejected; ``R(y)`` a side's reward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from mixrl.core.preference import PairView, _no_pairs, _pair_metrics, _to_tokens, dpo_margin, pair_view
from mixrl.core.terms import TERMS, TermInputs, TermOutput

#: per-row reward fields CoPG and OSP read (written by the pair injections)
REWARD_FIELDS = ("pair_reward", "pair_partner_reward")


def pair_rewards(x: TermInputs, v: PairView) -> tuple[Tensor, Tensor]:
    """Per row, (R(y_w), R(y_l)) of its pair from the ``pair_reward`` / ``pair_partner_reward`` fields
    (zeros on rows outside a pair); ValueError naming the missing field."""
    rows = x.rows or {}
    missing = [k for k in REWARD_FIELDS if k not in rows]
    if missing:
        raise ValueError(f"this pair term needs the per-row fields {', '.join(missing)}: the sides' rewards, "
                         "which the pair injections write")
    dt = x.logp.dtype
    own = torch.where(v.active, rows["pair_reward"].to(x.logp.device, dt), torch.zeros_like(v.own))
    partner = torch.where(v.active, rows["pair_partner_reward"].to(x.logp.device, dt), torch.zeros_like(v.own))
    if not bool(torch.isfinite(own).all() and torch.isfinite(partner).all()):
        raise ValueError("this pair term needs both sides' rewards, but a pair has a side nobody scored (an off-policy "
                         "pair from offpolicy=pairs); train it on on-policy pairs (tokens: [pair_on_policy])")
    return v.chosen_rejected(own.detach(), partner.detach())


@TERMS.register("rdpo", bounds={
    "beta": ("> 0", "the inverse temperature of the implicit reward; beta <= 0 inverts or removes the preference"),
    "epsilon": ("[0, 0.5)", "the label-flip rate; at 0.5 a label carries no information and the loss divides by 0"),
})
def rdpo(x: TermInputs, *, beta: float = 0.1, epsilon: float = 0.1) -> TermOutput:
    """Robust DPO: DPO de-biased for preference labels flipped at rate epsilon, per pair (TRL's ``loss_type="robust"``).

    Formula: L = [(1 - {epsilon}) l(h) - {epsilon} l(-h)] / (1 - 2 {epsilon}), l(z) = -log sigmoid(z), h = {beta} [Delta(y_w) - Delta(y_l)]
    Paper: rDPO, "Provably Robust DPO: Aligning Language Models with Noisy Feedback" (Chowdhury et al., arXiv 2403.00409): an
    unbiased estimate of the clean-label DPO loss when each label is flipped independently with probability epsilon.
    epsilon = 0 is DPO.

    Parameters:
        beta (0.1): inverse temperature of the implicit reward.
        epsilon (0.1): the assumed label-flip rate, in [0, 0.5).
    """
    v = pair_view(x)
    if v is None:
        return _no_pairs(x)
    h = dpo_margin(v, beta)
    row = ((1.0 - epsilon) * -F.logsigmoid(h) - epsilon * -F.logsigmoid(-h)) / (1.0 - 2.0 * epsilon)
    return TermOutput(_to_tokens(row, v, x.mask), _pair_metrics("rdpo", h, v))


rdpo.needs = ("ref_logp",)
rdpo.row_loss = True


@TERMS.register("slic", bounds={
    "beta": ("> 0", "the scale of the log-likelihood margin; beta <= 0 inverts or removes the preference"),
    "delta": (">= 0", "the hinge margin; a negative margin asks for nothing and trains on no pair"),
    "alpha": (">= 0", "the weight of the NLL on the chosen side; alpha < 0 pushes the chosen completion down"),
})
def slic(x: TermInputs, *, beta: float = 1.0, delta: float = 1.0, reference: bool = True, alpha: float = 0.0) -> TermOutput:
    """SLiC's rank-calibration hinge on pairs (RSO's hinge-norm with a reference), plus an optional NLL on the chosen side, per pair.

    Formula: L = max(0, {delta} - {beta} h) + {alpha} (-s(y_w) / |y_w|); reference = {reference}: true: h = Delta(y_w) - Delta(y_l) (RSO's hinge-norm, TRL's loss_type="hinge" at delta 1), false: h = s(y_w) - s(y_l) (SLiC-HF's calibration loss)
    Paper: SLiC-HF, "SLiC-HF: Sequence Likelihood Calibration with Human Feedback" (arXiv 2305.10425): L = max(0, delta - log P(y+|x) + log P(y-|x)) + lambda L_reg;
    RSO, "Statistical Rejection Sampling Improves Preference Optimization" (arXiv 2309.06657): the hinge on the log-ratios to the SFT policy (hinge-norm).
    SLiC-HF's regulariser is the cross-entropy on the SFT targets; here alpha weighs the chosen side's
    per-token NLL instead (the chosen side is the SFT target when chosen completions are demonstrations).

    Parameters:
        beta (1.0): scale of the margin (gamma in RSO; 1 in SLiC-HF).
        delta (1.0): the hinge margin (>= 0).
        reference (true): true: log-ratios to the reference (hinge-norm); false: raw sequence log-probs (SLiC-HF).
        alpha (0.0): weight of the chosen side's per-token NLL.
    """
    v = pair_view(x)
    if v is None:
        return _no_pairs(x)
    if reference:
        w, l = v.chosen_rejected(v.own - v.own_ref, v.partner - v.partner_ref)
    else:
        w, l = v.chosen_rejected(v.own, v.partner)
    h = beta * (w - l)
    per_token = _to_tokens(torch.relu(delta - h), v, x.mask)
    if alpha:
        # the chosen row's own NLL, twice on it (the rejected row carries none): the pair mean keeps alpha * NLL
        nll = torch.where(v.chosen, -v.own / v.own_len.clamp(min=1.0), torch.zeros_like(v.own))
        per_token = per_token + x.mask.to(h.dtype) * (2.0 * alpha * nll / v.own_len.clamp(min=1.0)).unsqueeze(-1)
    metrics = _pair_metrics("slic", h, v)
    if bool(v.chosen.any()):
        metrics["slic/active"] = float((h.detach()[v.chosen] < delta).float().mean())  # pairs inside the margin
    return TermOutput(per_token, metrics)


slic.needs = ("ref_logp",)
slic.row_loss = True


@TERMS.register("copg", bounds={"beta": ("> 0", "the KL regularisation strength; beta <= 0 removes the regularisation the target assumes")})
def copg(x: TermInputs, *, beta: float = 0.1) -> TermOutput:
    """CoPG: contrastive off-policy policy gradient on pairs of scored completions: the log-ratio difference regressed onto the reward difference, per pair.

    Formula: L = [R(y_w) - R(y_l) - {beta} (Delta(y_w) - Delta(y_l))]^2, R = the run's reward of each side
    Paper: CoPG, "Contrastive Policy Gradient: Aligning LLMs on sequence-level scores in a supervised-friendly fashion" (arXiv 2406.19185):
    the squared contrast of the regularised rewards R(y) - beta ln(pi(y)/pi_ref(y)) of two completions, whose minimiser is
    the KL-regularised optimum pi_ref exp(R / beta) for any sampling distribution of the pairs (no importance weight).
    With R(y_w) - R(y_l) = 1/2 it is beta^2 times IPO's loss at tau = beta (sequence sums, not token means).
    The side order does not matter (the square is symmetric); pairs of equal reward pull the log-ratios together.
    The Command A report (arXiv 2504.00698, p. 7), which trains with CoPG, states the loss over k samples of a prompt as
    1/(k-1) sum_{i>j} (R_beta(y_i) - R_beta(y_j))^2, R_beta = R - beta ln(pi/pi_ref): for one pair, this loss; the
    preset takes one pair per group (best vs worst) instead of all k(k-1)/2. No code of the authors was found.

    Parameters:
        beta (0.1): the KL regularisation strength.
    """
    v = pair_view(x)
    if v is None:
        return _no_pairs(x)
    r_w, r_l = pair_rewards(x, v)
    w, l = v.chosen_rejected(v.own - v.own_ref, v.partner - v.partner_ref)
    resid = (r_w - r_l) - beta * (w - l)
    metrics = _pair_metrics("copg", beta * (w - l), v)
    if bool(v.chosen.any()):
        metrics["copg/residual"] = float(resid.detach()[v.chosen].abs().mean())
    return TermOutput(_to_tokens(resid ** 2, v, x.mask), metrics)


copg.needs = ("ref_logp",)
copg.row_loss = True
copg.reads_pair_rewards = True  # config validation: on-policy pairs only (both sides scored)


@TERMS.register("osp", bounds={
    "beta": ("> 0", "the inverse temperature of the implicit reward"),
    "temperature": ("> 0", "the scale of the reward gap that sets the preference strength"),
})
def osp(x: TermInputs, *, beta: float = 0.1, temperature: float = 1.0, strength: str = "reward") -> TermOutput:
    """OSP's soft-preference cross-entropy: DPO against a soft label p, the strength of the preference, per pair.

    Formula: L = -p log sigmoid(h) - (1 - p) log sigmoid(-h), h = {beta} [Delta(y_w) - Delta(y_l)]; strength={strength}: reward: p = sigmoid((R(y_w) - R(y_l)) / {temperature}), self: p = the policy's own judgement of the pair (pair_strength, algo.inject.name=self_judged_pairs)
    Paper: OSP, "Online Self-Preferring Language Models" (arXiv 2405.14103): self-generated pairs, the preference strength
    judged by the model itself, and the soft-preference cross-entropy that trains toward it instead of toward a hard label.
    strength=self reads the strength the policy being trained gave the pair (:mod:`mixrl.sources.self_judged_pairs`);
    strength=reward computes it from the run's reward of the two sides. p = 1/2 pulls the two log-ratios together, p -> 1 is DPO.

    Parameters:
        beta (0.1): inverse temperature of the implicit reward.
        temperature (1.0): scale of the reward gap in the preference strength (strength=reward).
        strength (reward): reward (from the run's reward of the two sides) or self (the policy's own judgement, pair_strength).
    """
    v = pair_view(x)
    if v is None:
        return _no_pairs(x)
    if strength == "self":
        rows = x.rows or {}
        if "pair_strength" not in rows:
            raise ValueError("osp with strength=self needs the per-row field pair_strength, which "
                             "algo.inject.name=self_judged_pairs writes")
        p = torch.where(v.active, rows["pair_strength"].to(x.logp.device, x.logp.dtype), torch.zeros_like(v.own)).detach()
        if not bool(torch.isfinite(p[v.active]).all()):
            raise ValueError("osp with strength=self: a pair has no self-judged strength (an off-policy pair); "
                             "train it on on-policy pairs (tokens: [pair_on_policy])")
    else:
        r_w, r_l = pair_rewards(x, v)
        p = torch.sigmoid((r_w - r_l) / temperature)
    h = dpo_margin(v, beta)
    row = -p * F.logsigmoid(h) - (1.0 - p) * F.logsigmoid(-h)
    metrics = _pair_metrics("osp", h, v)
    if bool(v.chosen.any()):
        metrics["osp/strength"] = float(p[v.chosen].mean())
    return TermOutput(_to_tokens(row, v, x.mask), metrics)


osp.needs = ("ref_logp",)
osp.row_loss = True
osp.reads_pair_rewards = True  # config validation: on-policy pairs only (both sides scored)
osp.choices = {"strength": ("reward", "self")}  # config validation: the string options


#: ``seppo``'s choices of how the anchor decides the reference sample's side
SEPPO_FLIPS = ("sign", "indicator", "none")


@TERMS.register("seppo", bounds={"beta": ("> 0", "the inverse temperature of the implicit reward; beta <= 0 inverts or removes the preference")})
def seppo(x: TermInputs, *, beta: float = 0.1, flip: str = "sign") -> TermOutput:
    """SePPO's loss with the Anchor-based Adaptive Flipper: DPO between the winner anchor y_w and the
    reference sample y_ref, the latter's side decided per pair by whether the reference model fits
    the anchor better than the policy, per pair.

    Formula: L = -log sigmoid({beta} [Delta(y_w) - c Delta(y_ref)]), flip = {flip}: sign: c = +1 if Delta(y_w) >= 0 else -1; indicator: c = 1[Delta(y_w) >= 0]; none: c = 1 (SPIN's DPO); c detached
    Paper: SePPO, "SePPO: Semi-Policy Preference Optimization for Diffusion Alignment" (arXiv 2410.05255): the diffusion
    loss's prediction errors on the winner, current vs reference model, decide whether the reference sample is a loser
    (c = 1) or a winner (c = -1: both pushed up); the indicator variant drops the reference sample instead. For a
    language model the prediction error on y is -log pi(y), so "the policy fits the anchor better" is Delta(y_w) > 0;
    c at Delta(y_w) = 0 (the reference is the policy itself) is +1: our reading.

    Parameters:
        beta (0.1): inverse temperature of the implicit reward.
        flip (sign): sign | indicator | none.
    """
    if flip not in SEPPO_FLIPS:
        raise ValueError(f"seppo: flip={flip!r} must be one of {', '.join(SEPPO_FLIPS)}")
    v = pair_view(x)
    if v is None:
        return _no_pairs(x)
    w, l = v.chosen_rejected(v.own - v.own_ref, v.partner - v.partner_ref)
    ahead = (w.detach() >= 0).to(w.dtype)
    c = {"sign": 2.0 * ahead - 1.0, "indicator": ahead, "none": torch.ones_like(ahead)}[flip]
    h = beta * (w - c * l)
    metrics = _pair_metrics("seppo", h, v)
    if bool(v.chosen.any()):
        metrics["seppo/flipped"] = float((ahead[v.chosen] < 1).float().mean())  # reference samples treated as winners
    return TermOutput(_to_tokens(-F.logsigmoid(h), v, x.mask), metrics)


seppo.needs = ("ref_logp",)
seppo.row_loss = True
