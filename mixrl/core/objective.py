"""The training objective: a weighted sum of registered terms, each on the tokens it selects.

Pure tensor math (no TRL, no transformers). For one micro-batch::

    L = sum_k  w_k(t) * Agg_k[ l_k ; tokens_k ] / N_k

* ``l_k``: the per-token loss of term k (a :data:`mixrl.core.terms.TERMS` entry), computed on
  the tokens whose provenance is in ``tokens_k`` (0 elsewhere);
* ``Agg_k``: the term's aggregation (token-mean, seq-mean-...); its normaliser ``N_k`` is the
  global token (or row) count of the population ``normalise_over_k`` (default: ``tokens_k``),
  pre-scaled by the trainer for processes and gradient accumulation, so micro-batch losses
  add up to the full-step loss. Aggregations are linear in ``l`` for a fixed mask, so two
  terms with the same population add up to one aggregate over their union (LUFFY);
* ``w_k(t)``: a number, a schedule, or a named coefficient (``mu``, ``1-mu``, ``-entropy_coef``)
  that a controller may override for the step.

Methods as terms: GRPO = policy(on_policy); CHORD = (1 - mu_t) policy(on_policy) +
mu_t nll_phi(expert); LUFFY = policy(on_policy) + shaped(expert), both normalised over
on_policy + expert; SFT = nll(expert). KL and entropy regularisers are terms on on-policy
tokens. Tokens a term selects must have what it needs: a ratio needs a known behaviour
probability (see :mod:`mixrl.core.provenance`), so no ratio is ever taken against a silent 0.

Engine-mismatch correction (``Objective.engine_correction``, set when an inference engine
such as vLLM generates): the per-token loss of every term that declares ``engine_corrected``
(the policy term) is multiplied, on the tokens the policy sampled, by the weight ``w`` of
:mod:`mixrl.core.engine_mismatch` between the trainer's ``old_logp`` and the engine's
``engine_logp``, before aggregation, as TRL's ``GRPOTrainer`` does::

    l_k,t  <-  w_t * l_k,t      (w_t = 1 on tokens the engine did not sample)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from mixrl.core import provenance as prov
from mixrl.core._tensor import masked_mean, zero_masked
from mixrl.core.aggregation import AGGREGATIONS
from mixrl.core.engine_mismatch import EngineCorrection, engine_mismatch_weight
from mixrl.core.schedules import resolve_schedule
from mixrl.core.terms import TERMS, TermInputs


@dataclass
class TermSpec:
    """One term of the objective, as plain values."""

    label: str  # metrics key: loss/<label>
    kind: str  # a TERMS name
    tokens: tuple[str, ...] = ("on_policy",)
    normalise_over: tuple[str, ...] | None = None  # default: tokens
    weight: Any = 1.0  # number | schedule spec | coefficient reference ("mu", "1-mu", "-entropy_coef")
    aggregation: str = "token-mean"
    aggregation_params: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)

    @property
    def population(self) -> tuple[str, ...]:
        return tuple(self.normalise_over or self.tokens)


@dataclass
class Objective:
    """Terms plus the named coefficients (numbers or schedules) their weights refer to."""

    terms: list[TermSpec]
    coefs: dict[str, Any] = field(default_factory=dict)
    #: the engine-mismatch correction (None: none; set only when an inference engine generates)
    engine_correction: EngineCorrection | None = None

    def populations(self) -> list[tuple[str, ...]]:
        """The distinct token populations the terms normalise over (trainer counts them)."""
        out: list[tuple[str, ...]] = []
        for t in self.terms:
            if t.population not in out:
                out.append(t.population)
        return out

    def selected(self) -> list[str]:
        """Every provenance some term trains on."""
        return sorted({p for t in self.terms for p in t.tokens})

    def coefficient(self, name: str, step: int, knobs: Mapping[str, float] | None = None) -> float:
        if knobs and name in knobs:
            return float(knobs[name])
        if name not in self.coefs:
            raise KeyError(f"term weight refers to coefficient {name!r}, which is not defined; defined: {', '.join(self.coefs) or 'none'}")
        return float(resolve_schedule(self.coefs[name])(step))

    def weight(self, term: TermSpec, step: int, knobs: Mapping[str, float] | None = None) -> float:
        """``w_k(t)``: the term's weight at ``step`` (controller knobs win over coefficients)."""
        w = term.weight
        if isinstance(w, str):
            ref = parse_weight_ref(w)
            c = self.coefficient(ref[1], step, knobs)
            return {"+": c, "-": -c, "1-": 1.0 - c}[ref[0]]
        return float(resolve_schedule(w)(step))


def parse_weight_ref(text: str) -> tuple[str, str]:
    """``"mu"`` -> ``("+", "mu")``; ``"1-mu"`` -> ``("1-", "mu")``; ``"-c"`` -> ``("-", "c")``."""
    s = text.replace(" ", "")
    for prefix in ("1-", "-"):
        if s.startswith(prefix) and s[len(prefix):].isidentifier():
            return prefix, s[len(prefix):]
    if s.isidentifier():
        return "+", s
    raise ValueError(f"term weight {text!r} is not a number, a schedule or a coefficient name ('mu', '1-mu', '-mu')")


def population_key(population: tuple[str, ...]) -> str:
    return "+".join(population)


def _counts(mask: torch.Tensor, member: torch.Tensor | None = None) -> tuple[float, float, float]:
    """(tokens, rows with at least one token, rows of the population) under a [B, T] mask;
    ``member`` [B, T]: the positions of the population, mask or not (a row with none of its
    tokens trainable, e.g. a truncated completion under ``mask_truncated_completions``, is
    still one of its rows); default: the rows with a token."""
    m = mask.float()
    rows = float((m.sum(-1) > 0).sum())
    return float(m.sum()), rows, float(member.any(-1).sum()) if member is not None else rows


def row_count(counts: tuple[float, ...], count_empty_rows: bool) -> float:
    """The rows a ``seq-mean-*`` aggregation divides by: those with a trainable token, or
    with ``count_empty_rows`` every row of the population (the third count; normalisers saved
    before it existed have two, and then only the first reading is known)."""
    if not count_empty_rows:
        return counts[1]
    if len(counts) < 3:
        raise ValueError("count_empty_rows needs the population's row count (normalisers of (tokens, rows, all rows)), got (tokens, rows)")
    return counts[2]


def uses_rows(aggregation: str) -> bool:
    """Does the aggregation divide by rows (seq-mean-*) rather than tokens (token-mean)?"""
    return aggregation != "token-mean"


def compute_objective(
    objective: Objective,
    *,
    logp: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    token_source: torch.Tensor | None = None,
    old_logp: torch.Tensor | None = None,
    behaviour_logp: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    teacher_logp: torch.Tensor | None = None,
    engine_logp: torch.Tensor | None = None,
    teacher_entropy: torch.Tensor | None = None,
    entropies: torch.Tensor | None = None,
    step: int = 0,
    normalisers: Mapping[str, tuple[float, ...]] | None = None,
    knobs: Mapping[str, float] | None = None,
    row_fields: Mapping[str, torch.Tensor] | None = None,
    turn_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss of one micro-batch and its parts (floats, for logging).

    ``token_source`` [B, T]: provenance codes (default: every token on-policy).
    ``old_logp``: the policy's log-probs at generation time (default ``sg(logp)``): the
    behaviour of ``policy`` provenances. ``behaviour_logp``: recorded log-probs of ``stored``
    provenances (NaN where not recorded). ``engine_logp``: the log-probs the inference engine
    reported when it sampled each token (NaN where it sampled none); with
    ``objective.engine_correction`` they weight the engine-corrected terms (module docstring).
    ``teacher_entropy``: the teacher's next-token entropy per position (NaN where not scored).
    ``normalisers[population_key] = (tokens, rows, all_rows)``:
    the effective counts each population divides by (rows: with a trainable token; all_rows:
    every row of the population, for ``count_empty_rows``); without them, this micro-batch's
    own counts. ``knobs``: controller values for this step: ``loss.<param>`` for the policy loss,
    any other name for a coefficient. ``row_fields``: per-row fields [B] terms may read (pair links).
    ``turn_ids`` [B, T]: the policy turn of each token of multi-turn rows (-1: a tool's or an
    environment's token; :mod:`mixrl.core.turns`), read by turn-level losses.
    """
    valid = mask.bool() if mask.dtype != torch.bool else mask
    if token_source is None:
        token_source = torch.full_like(valid, prov.ON_POLICY, dtype=torch.long)
    if old_logp is None:
        old_logp = logp.detach()
    behaviour = _behaviour(token_source, old_logp.detach(), behaviour_logp)
    loss_knobs = {k.split(".", 1)[1]: v for k, v in (knobs or {}).items() if k.startswith("loss.")}
    pop_masks, counts = _populations(objective, valid, token_source, normalisers)
    total = torch.zeros((), dtype=logp.dtype, device=logp.device)
    metrics: dict[str, float] = {}
    engine_w = _engine_weight(objective.engine_correction, old_logp, engine_logp, valid, token_source)
    for term in objective.terms:
        sel = valid & prov.select(token_source, term.tokens)
        x = _term_inputs(
            term, sel, logp=logp, advantages=advantages, behaviour=behaviour, old_logp=old_logp, ref_logp=ref_logp,
            teacher_logp=teacher_logp, teacher_entropy=teacher_entropy, entropies=entropies, loss_knobs=loss_knobs,
            row_fields=row_fields, turn_ids=turn_ids,
        )
        if getattr(TERMS.get(term.kind), "needs_behaviour", False) and bool(sel.any()):
            _check_behaviour(term, behaviour, sel, token_source)
        value, term_metrics = _aggregated_term(term, x, sel, engine_w, pop_masks, counts)
        total = total + objective.weight(term, step, knobs) * value
        metrics.update(term_metrics)
        metrics[f"loss/{term.label}"] = float(value.detach())
        if isinstance(term.weight, str):
            name = parse_weight_ref(term.weight)[1]
            metrics[name] = objective.coefficient(name, step, knobs)
    metrics.update(_provenance_metrics(objective, logp, valid, token_source, entropies))
    metrics["loss/total"] = float(total.detach())
    return total, metrics


def _term_inputs(
    term: TermSpec,
    sel: torch.Tensor,
    *,
    logp: torch.Tensor,
    advantages: torch.Tensor,
    behaviour: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    teacher_logp: torch.Tensor | None,
    teacher_entropy: torch.Tensor | None,
    entropies: torch.Tensor | None,
    loss_knobs: Mapping[str, float],
    row_fields: Mapping[str, torch.Tensor] | None,
    turn_ids: torch.Tensor | None,
) -> TermInputs:
    """What ``term`` reads, on its selection ``sel``: log-probs it must not read outside ``sel``
    are ``sg(logp)`` there, and only the policy term sees the controller's ``loss.*`` knobs."""
    return TermInputs(
        logp=logp,
        mask=sel,
        advantages=advantages,
        behaviour_logp=_finite_on(behaviour, sel, logp),
        ref_logp=None if ref_logp is None else _finite_on(ref_logp, sel, logp),
        teacher_logp=None if teacher_logp is None else _finite_on(teacher_logp, sel, logp),
        entropies=entropies,
        overrides=loss_knobs if term.kind == "policy" else {},
        teacher_entropy=None if teacher_entropy is None else torch.where(sel, teacher_entropy, torch.zeros_like(logp.detach())),
        old_logp=_finite_on(old_logp.detach(), sel, logp),
        rows=dict(row_fields) if row_fields else None,
        turns=turn_ids,
    )


def _populations(
    objective: Objective,
    valid: torch.Tensor,
    token_source: torch.Tensor,
    normalisers: Mapping[str, tuple[float, ...]] | None,
) -> tuple[dict[str, torch.Tensor], dict[str, tuple[float, ...]]]:
    """Per population key: its trainable-token mask [B, T], and the counts it divides by (the
    given ``normalisers``, else this micro-batch's own counts)."""
    pop_masks = {population_key(p): valid & prov.select(token_source, p) for p in objective.populations()}
    counts = {population_key(p): (normalisers[population_key(p)] if normalisers else
                                  _counts(pop_masks[population_key(p)], prov.select(token_source, p)))
              for p in objective.populations()}
    return pop_masks, counts


def _aggregated_term(
    term: TermSpec,
    x: TermInputs,
    sel: torch.Tensor,
    engine_w: torch.Tensor | None,
    pop_masks: Mapping[str, torch.Tensor],
    counts: Mapping[str, tuple[float, ...]],
) -> tuple[torch.Tensor, dict[str, float]]:
    """One term, unweighted: its per-token loss on ``sel`` (engine-corrected if it declares so)
    aggregated over its population, and the term's own metrics."""
    out = TERMS.get(term.kind)(x, **term.params)
    if engine_w is not None and getattr(TERMS.get(term.kind), "engine_corrected", False):
        out.per_token = out.per_token * engine_w
    key = population_key(term.population)
    rows = row_count(counts[key], bool(term.aggregation_params.get("count_empty_rows", False)))
    num_items = max(rows if uses_rows(term.aggregation) else counts[key][0], 1.0)
    value = AGGREGATIONS.get(term.aggregation)(
        zero_masked(out.per_token, sel), pop_masks[key], num_items=num_items, **term.aggregation_params
    )
    # a second policy term (replayed rows) logs under its label: replay/clip_frac, replay/ratio/max
    prefix = f"{term.label}/" if term.kind == "policy" and term.label != "policy" else ""
    return value, {prefix + k: v for k, v in out.metrics.items()}


def _provenance_metrics(
    objective: Objective,
    logp: torch.Tensor,
    valid: torch.Tensor,
    token_source: torch.Tensor,
    entropies: torch.Tensor | None,
) -> dict[str, float]:
    """The on-policy entropy, and per trained provenance other than on-policy: its mean token
    probability and the fraction of rows holding it."""
    metrics: dict[str, float] = {}
    if entropies is not None:
        on = valid & (token_source == prov.ON_POLICY)
        metrics["entropy"] = float(masked_mean(entropies.detach(), on))
    for name in objective.selected():
        if name == "on_policy":
            continue
        sel = valid & prov.select(token_source, (name,))
        if bool(sel.any()):
            metrics[f"{name}/token_prob"] = float(masked_mean(logp.detach().exp(), sel))
        metrics[f"{name}/row_frac"] = float(sel.any(-1).float().mean()) if logp.shape[0] else 0.0
    return metrics


def _engine_weight(
    correction: EngineCorrection | None,
    old_logp: torch.Tensor,
    engine_logp: torch.Tensor | None,
    valid: torch.Tensor,
    token_source: torch.Tensor,
) -> torch.Tensor | None:
    """[B, T] engine-mismatch weight on the tokens the policy sampled (behaviour ``policy``),
    1 elsewhere; None without a correction or engine log-probs."""
    if correction is None or engine_logp is None:
        return None
    policy_codes = [prov.code(n) for n in prov.provenance_names() if prov.provenance(n).behaviour == "policy"]
    sampled = valid & torch.isin(token_source, torch.tensor(policy_codes, dtype=token_source.dtype, device=token_source.device))
    w = engine_mismatch_weight(old_logp, engine_logp, sampled, mode=correction.mode, c_min=correction.c_min, c_max=correction.c_max)
    return torch.where(sampled, w.expand_as(old_logp), torch.ones_like(old_logp))


def _behaviour(token_source: torch.Tensor, old_logp: torch.Tensor, stored: torch.Tensor | None) -> torch.Tensor:
    """Per-token behaviour log-prob: ``old_logp`` for policy provenances, the recorded value
    for stored ones, NaN for unknown ones (a ratio on them is a bug, caught by validation)."""
    out = torch.full_like(old_logp, float("nan"))
    for name in prov.provenance_names():
        p = prov.provenance(name)
        where = token_source == p.code
        if p.behaviour == "policy":
            out = torch.where(where, old_logp, out)
        elif p.behaviour == "stored" and stored is not None:
            out = torch.where(where, stored.detach().to(old_logp.dtype), out)
    return out


def _check_behaviour(term: TermSpec, behaviour: torch.Tensor, sel: torch.Tensor, token_source: torch.Tensor) -> None:
    """A ratio needs a behaviour log-prob on every selected token: a stored provenance
    whose recorded log-probs are missing (NaN) on some token is a bug of its source, never
    silently a ratio of 1 or exp(logp)."""
    bad = sel & ~torch.isfinite(behaviour)
    if bool(bad.any()):
        names = sorted({prov.provenance_names()[int(c)] for c in token_source[bad].unique().tolist()})
        raise ValueError(
            f"term {term.label!r} ({term.kind}) takes an importance ratio, but {int(bad.sum())} of its tokens "
            f"({', '.join(names)}) have no behaviour log-prob"
        )


def _finite_on(x: torch.Tensor, sel: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """``x`` on the selection, ``sg(logp)`` elsewhere: values a term must not read (padding,
    other provenances, unknown behaviour) can never reach a loss or a gradient as NaN."""
    return torch.where(sel, x, logp.detach())
