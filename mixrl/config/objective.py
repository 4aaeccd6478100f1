"""The objective's checks: is the objective, source and injection a config describes one a
run can train? (They are built by :mod:`mixrl.config.builders`, re-exported here.)

:func:`check_objective` is part of :func:`mixrl.config.validate.validate_config` (through
:func:`mixrl.config.rules.validate_rules`), which every command runs before any model loads. Each rule below belongs to what a
component declares about itself, so a new component brings its own checks:

* a term selects provenances that exist; a term that takes a ratio (``needs_behaviour``)
  selects only provenances with a known behaviour probability; a term's ``needs``
  (reference or teacher log-probs) must be provided;
* a coefficient used as ``1-c`` stays in [0, 1], as ``c`` or ``-c`` stays >= 0, at every step;
* an injection needs a source, and a source needs an injection and a term that trains
  on what it injects;
* a controller's knobs exist in the objective (its ``check(objective)``);
* the policy loss's and the controller's own constructor checks.
"""

from __future__ import annotations

import math
from typing import Any

from omegaconf import DictConfig

from mixrl.config.builders import (
    ROW_LOSS_AGGREGATION,
    _row_loss,
    build_injection,
    build_objective,
    build_teacher,
    check_steps,
    component,
    controller_class,
    plain,
)
from mixrl.config.geometry import geometry
from mixrl.core import provenance as prov
from mixrl.core.engine_mismatch import check_bounds
from mixrl.core.offpolicy_reinforce import LOSS_CHOICES
from mixrl.core.objective import Objective, TermSpec, parse_weight_ref
from mixrl.core.policy_losses import ON_POLICY_RESHAPES
from mixrl.core.schedules import resolve_schedule
from mixrl.core.terms import TERMS, term_needs, term_needs_behaviour
from mixrl.core.token_weights import OFF_POLICY_RESHAPES
from mixrl.envs.patching import EPISODE_PROVENANCES
from mixrl.errors import ConfigError
from mixrl.sources import INJECTIONS, SOURCES


def _g(x: Any) -> str:
    if isinstance(x, float) and x == int(x) and abs(x) < 1e6:
        return str(int(x))
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def _teacher_name(cfg: DictConfig) -> str:
    node = cfg.get("teacher")
    return "none" if node is None else str(component(node.source)[0] or "none")


# --------------------------------------------------------------------------- checks
def check_objective(cfg: DictConfig) -> list[str]:
    """Raise :class:`ConfigError` (one line) for a contradictory objective; return notes
    (non-fatal remarks) for the rest. A staged algo is checked stage by stage when its
    stages are composed."""
    algo, notes = cfg.algo, []
    if list(algo.get("stages") or []):
        return notes
    if not algo.get("terms"):
        raise ConfigError(f"algo={algo.name} has no terms (algo.terms); add at least one, e.g. "
                          "algo.terms.policy={name: policy, tokens: [on_policy]}")
    _check_engine_correction(cfg)
    try:
        objective = build_objective(cfg)
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"could not build the objective from algo: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    source_name, _ = component(cfg.offpolicy.source)
    inject_name, _ = component(algo.inject)
    wanted = getattr(_injection_class(inject_name), "sources", None)
    if wanted and source_name not in wanted:
        raise ConfigError(
            f"algo.inject={inject_name} reads a {' or '.join(wanted)} source but offpolicy.source is '{source_name}'; "
            f"add offpolicy={wanted[0]}"
        )
    injected, optional = _injection_provenances(cfg, source_name, inject_name)
    available = injected | ({"on_policy"} if not _skips_generation(inject_name) else set())
    available |= set(EPISODE_PROVENANCES.get(str((algo.get("episode") or {}).get("name", "none")), ()))  # mixrl.envs.patching
    known = set(prov.provenance_names())

    for t in objective.terms:
        where = f"algo.terms.{t.label}" if t.label in (algo.get("terms") or {}) else f"the {t.label} term"
        for p in (*t.tokens, *(t.normalise_over or ())):
            if p not in known:
                raise ConfigError(f"{where}: unknown provenance '{p}'; provenances: {', '.join(sorted(known))}")
        _check_term(t, where, available, cfg)
        _check_weight(objective, t, where, cfg)

    # --- sources and injections
    _check_teacher(cfg, inject_name, objective)
    if _needs_source(inject_name) and source_name == "none":
        raise ConfigError(
            f"algo.inject={inject_name} places off-policy rows but offpolicy.source is 'none'; add offpolicy=expert"
        )
    if source_name != "none" and not _needs_source(inject_name):
        raise ConfigError(
            f"offpolicy={cfg.offpolicy.name} loads off-policy rows but algo.inject is '{inject_name}', which places "
            "none, so they never enter a batch; use an algo that injects them (algo=chord, luffy, sft, mix) or offpolicy=none"
        )
    trained = {p for t in objective.terms for p in (*t.tokens, *getattr(TERMS.get(t.kind), "reads_rows", ()))}  # CalibRL reads the expert rows
    for p in sorted(injected - trained - optional):
        raise ConfigError(
            f"algo.inject={inject_name} adds '{p}' tokens but no term trains on them; add a term with tokens: [{p}] "
            "(e.g. algo.terms.sft={name: nll, tokens: [" + p + "]})"
        )
    if inject_name == "group_replace":
        adv_name = algo.advantage.name
        expert_trained = any("expert" in t.tokens for t in objective.terms)  # CalibRL reads its expert rows, never trains them
        if adv_name in ("grpo", "batch_norm") and not bool(algo.advantage_include_offpolicy) and expert_trained:
            notes.append(
                f"advantage {adv_name} with algo.advantage_include_offpolicy=false: an expert row in a group whose "
                "rollouts all got the same reward gets (r - mean) / eps, a huge advantage; LUFFY's script uses dr_grpo"
            )
    _check_injection(cfg)

    # --- policy loss parameters and the controller
    _check_policy_loss(cfg)
    extra = set(cfg.algo.get("reposition") or {}) - {"alpha"}
    if extra:
        raise ConfigError(f"algo.reposition takes only alpha, got {', '.join(sorted(extra))}; the fast steps are trainer.num_iterations - 1")
    _check_perturbation(cfg)
    ctrl_name, ctrl_params = component(algo.get("controller"))
    if ctrl_name is not None:
        try:
            controller = controller_class(ctrl_name)(**ctrl_params)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"algo.controller ({ctrl_name}): {str(e).splitlines()[0]}") from None
        _check_controller(cfg, ctrl_name, controller, objective)
    notes += _notes(cfg, objective)
    return notes


def _check_engine_correction(cfg: DictConfig) -> None:
    """``algo.engine_correction``: a known mode and bounds TRL accepts (checked with vLLM off
    too, so a config fails here rather than on the GPU machine)."""
    node = cfg.algo.get("engine_correction")
    if node is None:
        return
    c_min = None if node.c_min is None else float(node.c_min)
    c_max = None if node.c_max is None else float(node.c_max)
    try:
        check_bounds(str(node.mode), c_min, c_max)
    except ValueError as e:
        raise ConfigError(f"algo.engine_correction: {e}; TRL's defaults are mode=sequence_mask c_min=null c_max=3 "
                          "(algo.engine_correction.enabled=false turns the correction off)") from None


def _injection_provenances(cfg: DictConfig, source_name: str, inject_name: str) -> tuple[set[str], set[str]]:
    """(provenances the configured injection puts in the batch, those it may leave untrained):
    what the injection declares, else its source's material."""
    cls = INJECTIONS.get(inject_name)
    declared = cls.provenances
    if isinstance(declared, property):  # depends on the injection's parameters
        declared = build_injection(cfg, geometry=geometry(cfg)).provenances
    if declared is None:
        declared = _injected_provenances(source_name) if _needs_source(inject_name) else set()
    optional = cls.may_leave_untrained
    if isinstance(optional, property):
        optional = build_injection(cfg, geometry=geometry(cfg)).may_leave_untrained
    return set(declared), set(optional)


def _injected_provenances(source_name: str) -> set[str]:
    """What the configured source's material is, as provenances (declared by the source)."""
    return set(SOURCES.get(source_name).provenances)


def _check_teacher(cfg: DictConfig, inject_name: str, objective: Objective) -> None:
    """The teacher source's own constructor checks; an injection that needs a teacher has one
    that can generate (not ``self``)."""
    try:
        teacher = build_teacher(cfg)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"teacher.source: {str(e).splitlines()[0]}") from None
    if getattr(INJECTIONS.get(inject_name), "needs_teacher", False):
        if teacher is None:
            raise ConfigError(f"algo.inject={inject_name} places teacher completions but no teacher is configured; add teacher=tiny "
                              "(or teacher=model teacher.source.models=[...])")
        if "self" in teacher.models:
            raise ConfigError(f"algo.inject={inject_name} needs teacher models that generate; teacher.source.models "
                              "lists 'self' (the policy); name real teacher models")
    reads = any("teacher_logp" in term_needs(t.kind) for t in objective.terms)
    if teacher is not None and not reads and not getattr(INJECTIONS.get(inject_name), "needs_teacher", False):
        raise ConfigError(
            f"teacher={cfg.teacher.name} loads a teacher, but no term reads teacher log-probs and algo.inject={inject_name} "
            "places no teacher completions; use an algo that does (algo=opd, kdrl, opsd, ampo) or teacher=none"
        )


def _needs_source(inject_name: str) -> bool:
    return bool(INJECTIONS.get(inject_name).needs_source)


def _injection_class(inject_name: str):
    return INJECTIONS.get(inject_name)


def _skips_generation(inject_name: str) -> bool:
    return bool(INJECTIONS.get(inject_name).skips_generation)


def _check_term(t: TermSpec, where: str, available: set[str], cfg: DictConfig) -> None:
    _check_choices(t, where)
    if t.label in (cfg.algo.get("terms") or {}) and t.kind in ("kl", "entropy"):
        raise ConfigError(
            f"{where}: the {t.kind} term is set by algo.{'kl.coef' if t.kind == 'kl' else 'entropy_coef'}; "
            f"remove {where} and set that key instead"
        )
    if t.params.get("strength") == "self" and not getattr(INJECTIONS.get(cfg.algo.inject.get("name", "none")), "judges_pairs", False):
        raise ConfigError(f"{where}.strength=self reads the policy's own judgement of each pair, which only "
                          f"algo.inject.name=self_judged_pairs writes; set it, or {where}.strength=reward")
    if getattr(TERMS.get(t.kind), "reads_pair_rewards", False) and "pair_off_policy" in t.tokens:
        raise ConfigError(f"{where} ({t.kind}) needs both sides' rewards, which off-policy pair sides do not carry; "
                          "set its tokens to [pair_on_policy] (algo.inject.name=group_pairs or rso_pairs)")
    if term_needs_behaviour(t.kind):
        unknown = [p for p in t.tokens if prov.provenance(p).behaviour == "unknown"]
        if unknown:
            raise ConfigError(
                f"{where} ({t.kind}) takes an importance ratio, but '{unknown[0]}' tokens have no behaviour "
                f"probability; train them with a term that needs none (nll, shaped) instead"
            )
    with_ref = {"on_policy", *getattr(_injection_class(cfg.algo.inject.name), "ref_provenances", ())}
    if "ref_logp" in term_needs(t.kind) and set(t.tokens) - with_ref and not getattr(
        _injection_class(str(cfg.algo.inject.name)), "rows_scored_with_rollouts", False
    ):
        raise ConfigError(
            f"{where} ({t.kind}) needs reference log-probs, which are computed for "
            + ("rollout" if with_ref == {"on_policy"} else ", ".join(sorted(with_ref))) + " tokens only; set its tokens to [on_policy]"
        )
    if _row_loss(t.kind) and t.aggregation != ROW_LOSS_AGGREGATION:
        raise ConfigError(
            f"{where} ({t.kind}) is a loss per pair spread over its rows' tokens, so it is averaged over rows; "
            f"remove {where}.aggregation (or set it to {{name: {ROW_LOSS_AGGREGATION}}})"
        )
    if "teacher_logp" in term_needs(t.kind) and _teacher_name(cfg) == "none":
        raise ConfigError(f"{where} ({t.kind}) needs teacher log-probs, but no teacher is configured; add teacher=tiny "
                          "(built-in), teacher=self (privileged self-teacher) or teacher=model teacher.source.models=[...]")
    missing = [p for p in t.tokens if p not in available]
    if missing:
        fix = {"kl": "set algo.kl.coef=0", "entropy": "set algo.entropy_coef=0"}.get(
            t.kind if t.label not in (cfg.algo.get("terms") or {}) else "", "set an injection that does or drop the term")
        raise ConfigError(
            f"{where} trains on '{missing[0]}' tokens, but nothing puts them in the batch "
            f"(algo.inject={cfg.algo.inject.name}, offpolicy.source={cfg.offpolicy.source.name}); {fix}"
        )


def _check_choices(t: TermSpec, where: str) -> None:
    """String options of the peers' loss variants (LUFFY's reshapes) and of a term's ``choices``."""
    for key, allowed in (getattr(TERMS.get(t.kind), "choices", None) or {}).items():
        if key in t.params and t.params[key] not in allowed:
            raise ConfigError(f"{where}.{key} must be one of {', '.join(allowed)}, got {t.params[key]}")
    loss = t.params.get("loss") or {} if t.kind == "policy" else {}
    if loss.get("name") == "reshaped_ppo" and loss.get("reshape", "no_reshape") not in ON_POLICY_RESHAPES:
        raise ConfigError(f"{where}.loss.reshape must be one of {', '.join(ON_POLICY_RESHAPES)}, got {loss['reshape']}")
    if t.kind == "reshaped" and t.params.get("reshape", "p_div_p") not in OFF_POLICY_RESHAPES:
        raise ConfigError(f"{where}.reshape must be one of {', '.join(OFF_POLICY_RESHAPES)}, got {t.params['reshape']}")


def _check_weight(objective: Objective, t: TermSpec, where: str, cfg: DictConfig) -> None:
    if isinstance(t.weight, str):
        try:
            sign, name = parse_weight_ref(t.weight)
        except ValueError as e:
            raise ConfigError(f"{where}.weight: {e}") from None
        if name not in objective.coefs:
            raise ConfigError(
                f"{where}.weight = '{t.weight}' refers to coefficient '{name}', which is not defined; "
                f"set algo.coefs.{name} (a number or a schedule)"
            )
        key = "algo.entropy_coef" if name == "entropy_coef" else f"algo.coefs.{name}"
        fn = resolve_schedule(objective.coefs[name])
        lo, hi, why = (0.0, 1.0, f"it weighs (1 - {name}) and {name} terms against each other") if sign == "1-" else (
            0.0, math.inf, "a negative coefficient turns the term around (gradient ascent on what it should minimise)")
        if name == "entropy_coef":
            why = "a negative coefficient pushes entropy down"
        for s in check_steps(cfg):
            v = fn(s)
            if not (lo <= v <= hi) or not math.isfinite(v):
                rng = "in [0, 1]" if sign == "1-" else ">= 0"
                raise ConfigError(f"{key} = {_g(v)} at step {s}: {why}; it must stay {rng}")
        return
    try:
        fn = resolve_schedule(t.weight)
        fn(0)
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"{where}.weight: {str(e).splitlines()[0]}") from None
    for s in check_steps(cfg):
        v = fn(s)
        if not (math.isfinite(v) and v >= 0):
            raise ConfigError(
                f"{where}.weight = {_g(v)} at step {s}: a negative weight turns the term around (gradient ascent on "
                "what it should minimise); it must stay >= 0"
            )


def _check_injection(cfg: DictConfig) -> None:
    """The injection's own constructor checks (with the batch geometry)."""
    build_injection(cfg, geometry=geometry(cfg))


def _check_policy_loss(cfg: DictConfig) -> None:
    name, lp = component(cfg.algo.loss)  # numeric ranges: the losses' declared bounds (mixrl.core.registry)
    if name == "m2po" and lp.get("budget_over", "all") not in ("all", "harmful"):
        raise ConfigError(f"algo.loss.budget_over must be all or harmful, got {lp['budget_over']}")
    if name == "reshaped_ppo" and lp.get("reshape", "no_reshape") not in ON_POLICY_RESHAPES:
        raise ConfigError(f"algo.loss.reshape must be one of {', '.join(ON_POLICY_RESHAPES)}, got {lp['reshape']}")
    if name == "topr" and lp.get("taper", "token") not in ("token", "trajectory"):
        raise ConfigError(f"algo.loss.taper must be token or trajectory, got {lp['taper']}")
    if name == "minpro" and (lp.get("clip_low") is None) != (lp.get("clip_high") is None):
        raise ConfigError("algo.loss.clip_low and algo.loss.clip_high of minpro go together: set both (a token clip) or neither")
    for param, choices in LOSS_CHOICES.get(name, {}).items():
        if param in lp and lp[param] not in choices:
            raise ConfigError(f"algo.loss.{param} must be one of {', '.join(choices)}, got {lp[param]}")
    if name == "sft" and float(cfg.algo.kl.coef) > 0:
        raise ConfigError(
            f"algo.loss.name=sft with algo.kl.coef={_g(float(cfg.algo.kl.coef))}: a supervised loss has no reference "
            "policy to stay close to; set algo.kl.coef=0"
        )


def _check_perturbation(cfg: DictConfig) -> None:
    """ALP's noise (algo.perturbation): only sigma; no gradient checkpointing (it would redraw the noise in the backward)."""
    spec = cfg.algo.get("perturbation")
    if spec is None:
        return
    extra = set(spec) - {"sigma"}
    if extra:
        raise ConfigError(f"algo.perturbation takes only sigma, got {', '.join(sorted(extra))}")
    if cfg.hardware.get("gradient_checkpointing", False):
        raise ConfigError("algo.perturbation with hardware.gradient_checkpointing=true: the recomputed forward would draw "
                          "other noise than the loss saw; set hardware.gradient_checkpointing=false")


def _check_controller(cfg: DictConfig, name: str, controller, objective: Objective) -> None:
    """The controller's own ``check(objective)``; and a coefficient it sets must not also be
    set by the config."""
    if not any(t.kind == "policy" for t in objective.terms) and any(k.startswith("loss.") for k in controller.knob_names):
        raise ConfigError(f"algo.controller={name} sets policy-loss knobs, but the objective has no policy term")
    try:
        controller.check(objective)
    except ValueError as e:
        raise ConfigError(f"algo.controller={name}: {e}") from None
    for knob in controller.knob_names:
        if knob.startswith("loss."):
            continue
        spec = plain(cfg.algo.get(knob)) if knob in cfg.algo else objective.coefs.get(knob, 0.0)
        fn = resolve_schedule(spec)
        if any(fn(s) != 0.0 for s in check_steps(cfg)):
            raise ConfigError(
                f"algo.controller={name} sets {knob} every step, which would overwrite algo.{knob}; set algo.{knob}=0"
            )


RATIO_WHAT = {
    "ppo_clip": "clip", "reshaped_ppo": "clip", "gspo": "clip", "cispo": "IS-weight clip", "sapo": "gate", "m2po": "M2 mask",
    "topr": "IS taper", "rec": "token clip", "sppo": "clip", "vespo": "kernel", "minpro": "prefix weight",
    "etr": "elastic clip", "r2vpo": "ratio-variance penalty",
}


def _notes(cfg: DictConfig, objective: Objective) -> list[str]:
    notes = []
    for t in objective.terms:
        loss = (t.params.get("loss") or {}).get("name") if t.kind == "policy" else None
        stale = int(cfg.trainer.get("staleness", 0) or 0) > 0
        if loss in RATIO_WHAT and int(cfg.trainer.num_iterations) == 1 and not cfg.hardware.use_vllm and t.tokens == ("on_policy",) and not stale:
            notes.append(
                f"trainer.num_iterations=1: rollouts are scored by the policy that generated them, so r_t = 1 and the "
                f"{RATIO_WHAT[loss]} never acts on them (it does from trainer.num_iterations=2)"
            )
    if component(cfg.algo.get("shaping"))[0] == "aspo" and str((cfg.get("env") or {}).get("name", "single")) == "single":
        notes.append("algo.shaping=aspo with env=single: no rollout calls a tool, so A' = A; set env=tools (recipe aspo/arith-tools)")
    if cfg.algo.get("reposition") is not None and int(cfg.trainer.num_iterations) < 2:
        notes.append("algo.reposition with trainer.num_iterations=1: no fast steps to reposition (plain GRPO); "
                     "SFPO takes K fast steps and one slow one per batch: set trainer.num_iterations=K+1")
    name, params = component(cfg.algo.aggregation)
    if name == "seq-mean-token-sum-norm":
        # without max_len it divides by trainer.max_completion_length (mixrl.config.builders._aggregation)
        if params.get("max_len") is not None and params["max_len"] < int(cfg.trainer.max_completion_length):
            notes.append(
                f"algo.aggregation.max_len={params['max_len']} < trainer.max_completion_length="
                f"{cfg.trainer.max_completion_length}: long completions weigh more than 1 per row"
            )
    elif params.get("max_len") is not None:
        notes.append(f"algo.aggregation.max_len is ignored by {name}")
    return notes
