"""Preference terms: DPO and its family, on (chosen, rejected) pairs that sit in the batch as rows.

A pair is two rows of the batch (its chosen and its rejected completion of one prompt), linked by
per-row fields that the pair injection (:mod:`mixrl.sources.pairs`) writes:

* ``pair_index`` [B] long: the pair a row belongs to (-1: no pair);
* ``pair_side`` [B] long: 1 chosen, 0 rejected (-1: no pair);
* ``pair_partner_logp``, ``pair_partner_ref_logp`` [B] float: the other side's sequence log-prob
  under the policy (when the pair was appended) and under the reference model;
* ``pair_partner_len`` [B] float: the other side's completion length in tokens;
* ``pair_reward``, ``pair_partner_reward`` [B] float: the run's reward of the row's side and of the
  other side (NaN where nobody scored it); read only by the reward-aware terms of
  :mod:`mixrl.core.preference_losses` (copg, osp).

Why the partner is carried: TRL shuffles a generation batch's rows and splits them into
micro-batches, so the two sides of a pair may be in different micro-batches. Each row therefore
computes its pair's loss from its own live log-probs and the partner's detached value: the
partner's live value (detached) when it is in the same micro-batch, else the value recorded when
the pair was appended. The two rows' gradients add up to the pair's exact gradient, since a
pair's loss depends on the two sides only through their sequence log-probs, and the policy does
not change between the append and the first optimisation pass (``steps_per_generation`` is the
gradient accumulation). With ``trainer.num_iterations > 1`` a partner in another micro-batch keeps
its first-pass value on later passes.

Each row's part is ``l_row = 2 L - sg(L)`` (value L, gradient twice the own side's), spread evenly
over its tokens; with the ``seq-mean-token-sum`` aggregation (the default of every term here,
``row_loss = True``), the population's rows are the 2K sides of K pairs, so the objective is the
mean pair loss and its gradient the mean pair gradient.

Notation: ``s(y) = sum_t log pi_theta(y_t | x, y_<t)`` the sequence log-prob, ``s_ref(y)`` under the
reference model, ``Delta(y) = s(y) - s_ref(y)``, ``y_w`` chosen, ``y_l`` rejected.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from mixrl.core.terms import TERMS, TermInputs, TermOutput

#: per-row fields a pair term reads (written by the pair injection)
PAIR_FIELDS = ("pair_index", "pair_side", "pair_partner_logp", "pair_partner_ref_logp", "pair_partner_len")


@dataclass
class PairView:
    """Per row [B]: own and partner sequence log-probs (own live, partner detached), lengths,
    which rows are active sides of a pair, and which of them are the chosen side."""

    own: Tensor
    own_ref: Tensor
    own_len: Tensor
    partner: Tensor
    partner_ref: Tensor
    partner_len: Tensor
    active: Tensor  # bool
    chosen: Tensor  # bool

    def chosen_rejected(self, own: Tensor, partner: Tensor) -> tuple[Tensor, Tensor]:
        """Per row, (the chosen side's value, the rejected side's value) from own/partner values."""
        return torch.where(self.chosen, own, partner), torch.where(self.chosen, partner, own)


def pair_view(x: TermInputs) -> PairView | None:
    """Sequence log-probs of each row's side and of its partner (see the module docstring);
    None when the term selects no token here (a micro-batch, or a step, without pairs)."""
    if not bool(x.mask.any()):
        return None
    rows = x.rows or {}
    missing = [k for k in PAIR_FIELDS if k not in rows]
    if missing:
        raise ValueError(f"a pair term needs the per-row fields {', '.join(missing)}; rows must come from a pair injection")
    if x.ref_logp is None:
        raise ValueError("a pair term needs reference log-probs (ref_logp)")
    m = x.mask.to(x.logp.dtype)
    own = (x.logp * m).sum(-1)
    own_ref = (x.ref_logp.detach() * m).sum(-1)
    own_len = m.sum(-1)
    index = rows["pair_index"].to(x.mask.device)
    side = rows["pair_side"].to(x.mask.device)
    active = x.mask.any(-1) & (index >= 0) & (side >= 0)
    dt = x.logp.dtype
    partner = rows["pair_partner_logp"].to(dt)
    partner_ref = rows["pair_partner_ref_logp"].to(dt)
    partner_len = rows["pair_partner_len"].to(dt)
    # the partner's live value (detached) where it sits in this micro-batch
    n = index.shape[0]
    same = (index.unsqueeze(0) == index.unsqueeze(1)) & active.unsqueeze(0) & active.unsqueeze(1)
    same &= ~torch.eye(n, dtype=torch.bool, device=index.device)
    here = same.any(1)
    j = same.to(torch.int64).argmax(1)
    partner = torch.where(here, own.detach()[j], partner)
    partner_ref = torch.where(here, own_ref[j], partner_ref)
    partner_len = torch.where(here, own_len[j], partner_len)
    zero = torch.zeros_like(own)
    fin = active  # values of inactive rows never reach a loss (NaN-safe)
    return PairView(
        own=torch.where(fin, own, zero), own_ref=torch.where(fin, own_ref, zero), own_len=own_len,
        partner=torch.where(fin, partner, zero), partner_ref=torch.where(fin, partner_ref, zero),
        partner_len=torch.where(fin, partner_len, zero.detach() + 1.0), active=active, chosen=active & (side == 1),
    )


def _no_pairs(x: TermInputs) -> TermOutput:
    """No selected token: a zero loss that still depends on logp (every process joins backward)."""
    return TermOutput(x.logp * 0.0)


def _to_tokens(row_loss: Tensor, v: PairView, mask: Tensor) -> Tensor:
    """Spread each active row's loss evenly over its selected tokens (row token sum = row loss)."""
    per_row = torch.where(v.active, 2.0 * row_loss - row_loss.detach(), torch.zeros_like(row_loss))
    return mask.to(row_loss.dtype) * (per_row / v.own_len.clamp(min=1.0)).unsqueeze(-1)


def _pair_metrics(prefix: str, margin: Tensor, v: PairView) -> dict[str, float]:
    """Detached pair statistics over the chosen rows (one per pair): reward margin and accuracy."""
    sel = v.chosen
    if not bool(sel.any()):
        return {}
    mg = margin.detach()[sel].float()
    return {f"{prefix}/margin": float(mg.mean()), f"{prefix}/accuracy": float((mg > 0).float().mean())}


def dpo_margin(v: PairView, beta: float) -> Tensor:
    """``beta (Delta(y_w) - Delta(y_l))`` per row."""
    w, l = v.chosen_rejected(v.own - v.own_ref, v.partner - v.partner_ref)
    return beta * (w - l)


@TERMS.register("dpo", bounds={"beta": ("> 0", "the inverse temperature of the implicit reward beta log(pi/pi_ref); beta <= 0 inverts or removes the preference")})
def dpo(x: TermInputs, *, beta: float = 0.1) -> TermOutput:
    """DPO's sigmoid loss on preference pairs, per pair.

    Formula: L = -log sigmoid({beta} [(s(y_w) - s_ref(y_w)) - (s(y_l) - s_ref(y_l))]), s = sum of token log-probs
    Paper: DPO, "Direct Preference Optimization: Your Language Model is Secretly a Reward Model" (arXiv 2305.18290).

    Parameters:
        beta (0.1): inverse temperature of the implicit reward.
    """
    v = pair_view(x)
    if v is None:
        return _no_pairs(x)
    h = dpo_margin(v, beta)
    return TermOutput(_to_tokens(-F.logsigmoid(h), v, x.mask), _pair_metrics("dpo", h, v))


dpo.needs = ("ref_logp",)
dpo.row_loss = True


@TERMS.register("ipo", bounds={"tau": ("> 0", "the regularisation strength; the target margin is 1 / (2 tau)")})
def ipo(x: TermInputs, *, tau: float = 0.1) -> TermOutput:
    """IPO's squared loss on length-averaged log-ratios, per pair (TRL's ``loss_type="ipo"`` averages over tokens).

    Formula: L = (h - 1 / (2 {tau}))^2, h = (s(y_w) - s_ref(y_w)) / |y_w| - (s(y_l) - s_ref(y_l)) / |y_l|
    Paper: IPO, "A General Theoretical Paradigm to Understand Learning from Human Preferences" (arXiv 2310.12036).

    Parameters:
        tau (0.1): regularisation strength (TRL's beta for ipo).
    """
    v = pair_view(x)
    if v is None:
        return _no_pairs(x)
    own = (v.own - v.own_ref) / v.own_len.clamp(min=1.0)
    partner = (v.partner - v.partner_ref) / v.partner_len.clamp(min=1.0)
    w, l = v.chosen_rejected(own, partner)
    h = w - l
    return TermOutput(_to_tokens((h - 1.0 / (2.0 * tau)) ** 2, v, x.mask), _pair_metrics("ipo", h, v))


ipo.needs = ("ref_logp",)
ipo.row_loss = True


@TERMS.register("rpo", bounds={
    "beta": ("> 0", "the inverse temperature of the implicit reward"),
    "alpha": (">= 0", "the weight of the NLL on the chosen side; alpha < 0 pushes the chosen completion down"),
})
def rpo(x: TermInputs, *, beta: float = 0.1, alpha: float = 1.0, nll_mean: str = "pair") -> TermOutput:
    """RPO: DPO plus an NLL on the chosen completion (the SFT regulariser against over-optimisation), per pair.

    Formula: L = -log sigmoid({beta} [Delta(y_w) - Delta(y_l)]) - {alpha} NLL; nll_mean = {nll_mean}: pair: NLL = s(y_w) / |y_w| per pair (the mean over pairs of each chosen completion's token mean), tokens: NLL = sum_w s(y_w) / sum_w |y_w| over the micro-batch's chosen completions (TRL)

    ``nll_mean: pair`` (the default) length-normalises each pair's NLL, as "Iterative Reasoning
    Preference Optimization" (arXiv 2404.19733) writes it. TRL 1.16 (``DPOConfig``
    ``loss_type=["sigmoid", "sft"]``, ``loss_weights=[1, alpha]``; its former ``rpo_alpha``)
    token-averages instead: ``-chosen_per_token_logps[chosen_mask].mean()`` over every chosen
    token of the micro-batch, so a long chosen completion weighs more: ``nll_mean: tokens``
    (exact for one micro-batch per step; with several, each micro-batch's token mean is
    weighted by its pairs).

    Paper: RPO, "Provably Mitigating Overoptimization in RLHF: Your SFT Loss is Implicitly an Adversarial Regularizer" (arXiv 2405.16436); "Iterative Reasoning Preference Optimization" (arXiv 2404.19733).

    Parameters:
        beta (0.1): inverse temperature of the implicit reward.
        alpha (1.0): weight of the chosen side's NLL.
        nll_mean (pair): pair (each chosen completion's token mean, averaged over pairs) | tokens (the token mean over all chosen tokens of the micro-batch, as TRL's sft loss).
    """
    if nll_mean not in ("pair", "tokens"):
        raise ValueError(f"rpo: nll_mean must be 'pair' or 'tokens', got {nll_mean!r}")
    v = pair_view(x)
    if v is None:
        return _no_pairs(x)
    h = dpo_margin(v, beta)
    row = -F.logsigmoid(h)
    # the NLL is the chosen row's own: twice on it (the rejected row carries none) keeps the pair mean
    nll = torch.where(v.chosen, -v.own / v.own_len.clamp(min=1.0), torch.zeros_like(v.own))
    if nll_mean == "tokens":
        # row sums that, averaged over the active rows (seq-mean-token-sum), give alpha * sum(-s(y_w)) / sum |y_w|
        chosen_tokens = torch.where(v.chosen, v.own_len, torch.zeros_like(v.own_len)).sum().clamp(min=1.0)
        row_nll = torch.where(v.chosen, -v.own * v.active.sum().to(row.dtype) / chosen_tokens, torch.zeros_like(v.own))
        per_token = _to_tokens(row, v, x.mask) + x.mask.to(row.dtype) * (alpha * row_nll / v.own_len.clamp(min=1.0)).unsqueeze(-1)
    else:
        per_token = _to_tokens(row, v, x.mask) + x.mask.to(row.dtype) * (2.0 * alpha * nll / v.own_len.clamp(min=1.0)).unsqueeze(-1)
    metrics = _pair_metrics("rpo", h, v)
    if bool(v.chosen.any()):
        metrics["rpo/nll"] = float(nll.detach()[v.chosen].mean())
    return TermOutput(per_token, metrics)


rpo.needs = ("ref_logp",)
rpo.row_loss = True


@TERMS.register("wpo", bounds={"beta": ("> 0", "the inverse temperature of the implicit reward")})
def wpo(x: TermInputs, *, beta: float = 0.1) -> TermOutput:
    """WPO: DPO with each pair weighted by the policy's own (detached, length-normalised) probability of the pair.

    Formula: L = -sg(w(y_w) w(y_l)) log sigmoid({beta} [Delta(y_w) - Delta(y_l)]), w(y) = exp(s(y) / |y|)
    Paper: WPO, "WPO: Enhancing RLHF with Weighted Preference Optimization" (arXiv 2406.11827). The paper's
    weight alignment (dividing each token probability by sum_v pi(v)^2, TRL's use_weighting) needs the full
    next-token distribution, which mixrl's fused LM head never builds; this is its length-normalised weight without it.

    Parameters:
        beta (0.1): inverse temperature of the implicit reward.
    """
    v = pair_view(x)
    if v is None:
        return _no_pairs(x)
    h = dpo_margin(v, beta)
    log_w = (v.own.detach() / v.own_len.clamp(min=1.0)) + (v.partner / v.partner_len.clamp(min=1.0))
    weight = log_w.exp().detach()
    metrics = _pair_metrics("wpo", h, v)
    if bool(v.chosen.any()):
        metrics["wpo/weight"] = float(weight[v.chosen].mean())
    return TermOutput(_to_tokens(-weight * F.logsigmoid(h), v, x.mask), metrics)


wpo.needs = ("ref_logp",)
wpo.row_loss = True


def sequence_kl(logp: Tensor, ref_logp: Tensor, mask: Tensor) -> Tensor:
    """Per row: ``sum_t (log pi - log pi_ref)`` over the mask, the single-sample estimate of
    KL(pi || pi_ref) of one sequence sampled from pi (detached inputs give a detached value)."""
    m = mask.to(logp.dtype)
    return ((logp - ref_logp) * m).sum(-1)


@TERMS.register("seq_kl")
def seq_kl(x: TermInputs) -> TermOutput:
    """HyPO's online KL: the sequence-level reverse KL to the reference on the policy's own samples,
    as a REINFORCE surrogate (value: the KL estimate; gradient: its score-function gradient).

    Formula: l(y) = KL(y) = sum_t log(pi_theta / pi_ref)(y_t), y ~ pi_theta; gradient sg(KL(y)) grad log pi_theta(y) (REINFORCE)
    Paper: HyPO, "The Importance of Online Data: Understanding Preference Fine-tuning via Coverage" (arXiv 2406.01462): DPO on offline pairs plus lambda times KL(pi || pi_ref) on online samples.

    Parameters: none.
    """
    kl = sequence_kl(x.logp.detach(), x.ref_logp.detach(), x.mask)  # [B]
    m = x.mask.to(x.logp.dtype)
    n = m.sum(-1).clamp(min=1.0)
    # per token: the row's KL spread over its tokens (value), plus sg(KL) (log p - sg(log p)) (gradient)
    per_token = m * (kl / n).unsqueeze(-1) + m * kl.unsqueeze(-1) * (x.logp - x.logp.detach())
    sel = x.mask.any(-1)
    return TermOutput(per_token, {"seq_kl": float(kl[sel].mean())} if bool(sel.any()) else {})


seq_kl.needs = ("ref_logp",)
seq_kl.row_loss = True
