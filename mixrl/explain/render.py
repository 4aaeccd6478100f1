"""The objective of a composed config, as text: the equation and one row per part.

Everything here is rendered from the objective the trainer builds
(:func:`mixrl.config.objective.build_objective`: terms, their tokens, normalisers,
aggregations and weights, the named coefficients) and from what each configured component
declares about itself (:meth:`mixrl.core.registry.Registry.formula`: its ``Formula:`` with
the config's values filled in, its parameters; a controller's ``knob_names``; an
injection's ``skips_generation``; a source's ``provenances``; the registered token
provenances). No component is named here, so a new term, loss, injection or source shows
up in ``mixrl explain`` without editing this module. Contradictions and notes come from
:func:`mixrl.config.objective.check_objective`, the one validation pass.
"""

from __future__ import annotations

import inspect

from typing import Any

from omegaconf import DictConfig
from omegaconf import OmegaConf

from mixrl.core.policy_losses import POLICY_LOSSES
from mixrl.core.registry import format_value
from mixrl.envs.patching import describe_episode_injection
from mixrl.errors import ConfigError
from mixrl.explain.sampler import sampler_rows
from mixrl.explain.update_hooks import update_rows
from mixrl.explain.schedules import component, constant_value, controller_knobs, objective
from mixrl.config.components import component_kind, registry_for
from mixrl.config.critic import critic_description
from mixrl.config.objective import check_objective
from mixrl.config.geometry import geometry
from mixrl.core import ADVANTAGES, AGGREGATIONS, CONTROLLERS, SCHEDULES, TERMS, provenance as prov
from mixrl.core.advantages import advantage_needs
from mixrl.explain.shaping import shaping_row
from mixrl.core.objective import parse_weight_ref, uses_rows
from mixrl.core.schedules import describe_schedule, split_spec
from mixrl.core.step_votes import genprm_formula
from mixrl.rewards.components import REWARD_MODELS
from mixrl.sources import INJECTIONS, SOURCES
from mixrl.config.ref_reset import describe_ref_reset

NOTATION = (
    "p_t = pi_theta(y_t|s_t); r_t = p_t / pi_b(y_t|s_t), the ratio to the behaviour probability "
    "(pi_old for rollouts); A = the row's advantage; sg = stop-gradient; l_t = a term's per-token loss; "
    "term[provenances] = the term on the tokens of those provenances"
)


def _g(x: Any) -> str:
    return format_value(x)


def _max_steps(cfg: DictConfig) -> int:
    return int(cfg.trainer.max_steps)


# --------------------------------------------------------------------------- weights
def coefficient_symbol(cfg: DictConfig, name: str) -> str:
    """``mu`` for a coefficient that is the same at every step, ``mu_t`` otherwise (a schedule,
    or a value a controller sets)."""
    _, knobs = controller_knobs(cfg)
    if name in knobs:
        return f"{name}_t"
    spec = objective(cfg).coefs.get(name, 0.0)
    return name if constant_value(spec, _max_steps(cfg)) is not None else f"{name}_t"


def _weight_factor(cfg: DictConfig, term) -> tuple[str, str]:
    """``(sign, factor)`` of a term's weight in the equation: ``("+", "(1 - mu) * ")``."""
    w = term.weight
    if isinstance(w, str):
        sign, name = parse_weight_ref(w)
        sym = coefficient_symbol(cfg, name)
        return {"+": ("+", f"{sym} * "), "-": ("-", f"{sym} * "), "1-": ("+", f"(1 - {sym}) * ")}[sign]
    value = constant_value(w, _max_steps(cfg))
    if value is None:
        return "+", f"w_{term.label}(t) * "
    if value < 0:
        return "-", "" if value == -1 else f"{_g(-value)} * "
    return "+", "" if value == 1 else f"{_g(value)} * "


def _weight_text(cfg: DictConfig, term) -> str:
    """The weight of a term in words, for its row."""
    w = term.weight
    if isinstance(w, str):
        sign, name = parse_weight_ref(w)
        sym = coefficient_symbol(cfg, name)
        return {"+": sym, "-": f"-{sym}", "1-": f"1 - {sym}"}[sign] + f" (coefficient {name}, below)"
    value = constant_value(w, _max_steps(cfg))
    if value is not None:
        return _g(value)
    return f"w_{term.label}(t) = {describe_schedule(w)}"


def _population_text(term) -> str:
    unit = "rows" if uses_rows(term.aggregation) else "tokens"
    return f"{' + '.join(term.population)} {unit}"


# --------------------------------------------------------------------------- equation
def objective_equation(cfg: DictConfig) -> str:
    """The one-line objective ``L = ...`` of a validated config, built from its terms:
    ``w * label[tokens]`` for each term, and which terms share a normaliser other than
    their own tokens."""
    terms = objective(cfg).terms
    shared: dict[tuple[str, ...], list[int]] = {}
    for i, t in enumerate(terms):
        if t.population != tuple(t.tokens):
            shared.setdefault(t.population, []).append(i)
    parts = []
    for i, t in enumerate(terms):
        sign, factor = _weight_factor(cfg, t)
        text = f"{factor}{t.label}[{' + '.join(t.tokens)}]"
        group = next((g for g in shared.values() if g[-1] == i), None)
        if group is not None:
            who = "" if len(group) == 1 else (
                "both " if group == [i - 1, i] else ", ".join(terms[j].label for j in group) + ": ")
            text += f" ({who}normalised over {_population_text(t)})"
        if not parts:
            parts.append(text if sign == "+" else f"-{text}")
        else:
            parts.append(f"{sign} {text}")
    return "L = " + " ".join(parts)


# --------------------------------------------------------------------------- rows
def _nested(term, section: str) -> tuple[Any, str] | None:
    """The registry of a term parameter that is itself a component (``loss``, ``token_weight``)."""
    path = f"algo.terms.{term.label}.{section}"
    if component_kind(path) is None:
        return None
    return registry_for(path), path


def _term_rows(cfg: DictConfig, term) -> list[tuple[str, str]]:
    ctrl, knobs = controller_knobs(cfg)
    head = (
        f"{term.kind} term on {' + '.join(term.tokens)} tokens, weight {_weight_text(cfg, term)}; "
        f"{term.aggregation} over {_population_text(term)}"
    )
    if objective(cfg).engine_correction is not None and getattr(TERMS.get(term.kind), "engine_corrected", False):
        head += "; per-token loss times the engine-mismatch weight w_t on policy-sampled tokens (engine, below)"
    rows = [(term.label, head), ("", f"  {term.kind}: {TERMS.formula(term.kind, term.params)}")]
    for key, value in term.params.items():
        found = _nested(term, key) if isinstance(value, dict) and value.get("name") else None
        if found is None:
            continue
        registry, _ = found
        params = {k: v for k, v in value.items() if k != "name"}
        # a controller knob "<section>.<param>" sets a parameter of the component in that section
        set_by = [k.split(".", 1)[1] for k in knobs if "." in k and k.split(".", 1)[0] == key]
        for p in set_by:
            params[p] = f"{p}(t)"
        text = f"  {value['name']}: {registry.formula(value['name'], params)}"
        if set_by:
            text += f"; {', '.join(f'{p}(t)' for p in set_by)} set every step by the controller {ctrl}"
        rows.append(("", text))
    rows.append(("", f"  {term.aggregation}: {AGGREGATIONS.formula(term.aggregation, term.aggregation_params)}"))
    return rows


def _coefficient_rows(cfg: DictConfig) -> list[tuple[str, str]]:
    ctrl, knobs = controller_knobs(cfg)
    rows = []
    for name, spec in objective(cfg).coefs.items():
        if name in knobs:
            start = constant_value(spec, 0)
            rows.append((name, f"{name}_t set after every step by the controller {ctrl} (before its first update: {_g(start)})"))
            continue
        value = constant_value(spec, _max_steps(cfg))
        if value is not None:
            how = "" if isinstance(spec, (int, float)) else f": {describe_schedule(spec)}"
            rows.append((name, f"{name} = {_g(value)} (constant over the run{how})"))
            continue
        sched, params = split_spec(spec)
        rows.append((name, f"{name}_t = {describe_schedule(spec)}: {SCHEDULES.formula(sched, params)}"))
    return rows


def _advantage_row(cfg: DictConfig, inject: str) -> str:
    name, params = component(cfg.algo.advantage)
    text = f"{name}: {ADVANTAGES.formula(name, params)}"
    if inject != "none":
        inc = bool(cfg.algo.advantage_include_offpolicy)
        text += (
            f"; off-policy rows counted in the statistics: {'yes' if inc else 'no'} "
            f"(algo.advantage_include_offpolicy={str(inc).lower()})"
        )
    return text


def _injection_row(cfg: DictConfig) -> str:
    name, params = component(cfg.algo.inject)
    geo = geometry(cfg)
    rows = f"{geo.prompts_per_step} prompts x {geo.num_generations} = {geo.rollouts_per_step} rows in groups"
    if INJECTIONS.get(name).skips_generation:
        rows += " (nothing generated: every completion is the source's)"
    if geo.expert_rows_per_step:
        rows += f" + {geo.expert_rows_per_step} appended rows"
    return f"{name}: {INJECTIONS.formula(name, params)}; rows per step: {rows}"


def _source_row(cfg: DictConfig) -> str:
    name, params = component(cfg.offpolicy.source)
    text = f"{name}: {SOURCES.formula(name, params)}"
    provenances = tuple(getattr(SOURCES.get(name), "provenances", ()))
    if provenances:
        text += f"; its tokens: {', '.join(provenances)}"
    return text


def _teacher_row(cfg: DictConfig) -> str | None:
    """The teacher (``teacher.source``), or None without one."""
    node = OmegaConf.select(cfg, "teacher.source")
    name, params = component(node) if node is not None else (None, {})
    if name in (None, "none"):
        return None
    models = ", ".join(str(m) for m in params.get("models") or [])
    what = f"{name} [{models}]" + (f", privileged context: {params['privileged']}" if params.get("privileged") else "")
    return f"{what}: {SOURCES.formula(name, params)}"


def _controller_row(cfg: DictConfig) -> str:
    name, params = component(cfg.algo.get("controller"))
    if name is None:
        return "none"
    _, knobs = controller_knobs(cfg)
    sets = ["the optimizer's learning rate for the step (x lr_scale)" if k == "optimizer.lr_scale"
            else f"algo.{k}" if "." in k else f"coefficient {k}" for k in knobs]
    if getattr(CONTROLLERS.get(name), "when", None) == "after_rewards":  # PALU
        sets.append("the rollouts' rewards, before the advantages")
    return f"{name}: {CONTROLLERS.formula(name, params)}; sets {', '.join(sets) or 'nothing'}"


def _provenance_row(cfg: DictConfig) -> str:
    obj = objective(cfg)
    used = sorted({p for t in obj.terms for p in (*t.tokens, *t.population)}, key=prov.code)
    return "; ".join(
        f"{p} [behaviour {prov.provenance(p).behaviour}]: {prov.provenance(p).description}" for p in used
    )


def _engine_row(cfg: DictConfig) -> str | None:
    """The engine-mismatch correction when vLLM generates (None when it does not)."""
    if not bool(cfg.hardware.use_vllm):
        return None
    correction = objective(cfg).engine_correction
    if correction is None:
        return ("vLLM generates; its sampling log-probs differ slightly from the trainer's and this run does not "
                "correct for it (algo.engine_correction.enabled=false)")
    return (f"vLLM generates; {correction.formula()} (algo.engine_correction; TRL's vLLM importance-sampling "
            "correction; metrics engine/*)")


def _reward_rows(cfg: DictConfig) -> list[tuple[str, str]]:
    """The rewards computed by a model (``reward.name`` or ``reward.extra``: model, judge, process) with their formulas;
    none for the verifiers (their rows would add nothing to the objective's page)."""
    specs = [cfg.reward, *(cfg.reward.get("extra") or [])]
    rows = []
    for spec in specs:
        name = str(spec.get("name"))
        if name not in REWARD_MODELS.names():
            continue
        params = OmegaConf.to_container(spec.get("params"), resolve=True) if spec.get("params") is not None else {}
        params = {k: v for k, v in params.items() if k in REWARD_MODELS.params(name)}
        defaults = REWARD_MODELS.defaults(name)
        params = {k: repr(v) if isinstance(v, str) and any(c in v for c in "\n\t") else v  # a separator, a template: on one line
                  for k, v in {**defaults, **params}.items()}
        text = f"{name} (weight {_g(float(spec.get('weight', 1.0)))}): {REWARD_MODELS.formula(name, params)}"
        if name == "process" and params.get("scorer") == "genprm":  # CAPO's voted critiques (mixrl.rewards.genprm)
            text += f". {genprm_formula(params.get('scorer_params') or {})}"
        if name == "process":  # a dense reward: what of it reaches the advantage
            text += f". {_dense_use(str(cfg.algo.advantage.name), cfg.algo.get('critic') is not None)}"
        rows.append(("reward", text))
    return rows


def _dense_use(advantage: str, critic: bool) -> str:
    """How a per-token reward reaches the advantage ``advantage`` (mixrl.rewards.registry, dense rewards):
    through the critic when one runs, else as the estimator's runtime inputs (its ``needs``) read it."""
    needs = advantage_needs(ADVANTAGES.get(advantage))
    if critic:
        return f"Per token: every token's reward enters the critic's advantage ({advantage})"
    if "token_credit" in needs:
        return (f"Per token, critic-free (advantage {advantage}): the outcome on every token, each token's step reward "
                "on top, normalised over the group's tokens")
    return (f"Summed: the {advantage} advantage sees one reward per row, the sum of the tokens' rewards (every token of "
            "the row alike; an advantage that reads per-token credit keeps the step rewards per token)")


def _env_row(cfg: DictConfig) -> str | None:
    """The tool turns or an environment's episodes and their masking (``env=tools``, ``env=<environment>``;
    None for single-turn rollouts)."""
    env = cfg.get("env")
    if env is None or env.name == "single":
        return None
    env_prov = prov.provenance("environment")
    takes_turns = "turn_ids" in inspect.signature(POLICY_LOSSES.get(cfg.algo.loss.name)).parameters
    turn = " The policy loss takes one ratio per turn (turn_id)." if takes_turns else ""
    kept = ("the advantage reads them per turn" if "turn_rewards" in advantage_needs(ADVANTAGES.get(cfg.algo.advantage.name))
            else "kept as turn_rewards")
    if env.name != "tools":
        return (f"multi-turn episodes in the environment {env.name} (mixrl.envs, TRL's rollout_func): at most {env.max_turns} "
                f"policy turns; each observation (a user turn) stays in the row as provenance {env_prov.name} [behaviour "
                f"{env_prov.behaviour}], in no term: masked from every loss, KL term, token weight and normaliser. The "
                f"rollout's reward is the episode's return (the sum of the turns' rewards; per-turn rewards: {kept})."
                f"{turn}")
    calls = "until the completion budget" if env.max_tool_calls is None else f"at most {env.max_tool_calls} rounds"
    return (f"multi-turn rollouts: the policy may call {', '.join(env.tools)} ({calls}, TRL's tool loop); each tool "
            f"result stays in the row as provenance {env_prov.name} [behaviour {env_prov.behaviour}], in no term: "
            f"masked from every loss, KL term, token weight and normaliser (expert trajectories' tool turns too).{turn}")


def explain_lines(cfg: DictConfig) -> list[tuple[str, str]]:
    """``(label, text)`` rows: each term (with the formulas of its components), each
    coefficient, the advantage, injection, source, controller, tokens and batch geometry.
    A label of ``""`` continues the row above."""
    rows: list[tuple[str, str]] = []
    for term in objective(cfg).terms:
        rows += _term_rows(cfg, term)
    rows += _coefficient_rows(cfg)
    inject, _ = component(cfg.algo.inject)
    rows.append(("advantage", _advantage_row(cfg, inject)))
    shaping = shaping_row(cfg)
    if shaping is not None:
        rows.append(("shaping", shaping))
    critic = critic_description(cfg)
    if critic is not None:
        rows.append(("critic", critic))
    rows.append(("injection", _injection_row(cfg)))
    rows.append(("source", _source_row(cfg)))
    teacher = _teacher_row(cfg)
    if teacher is not None:
        rows.append(("teacher.source", teacher))
    rows.append(("controller", _controller_row(cfg)))
    rows += [("update", text) for text in update_rows(cfg)]  # SFPO's reposition, ALP's noise (mixrl.explain.update_hooks)
    rows += _reward_rows(cfg)
    engine = _engine_row(cfg)
    if engine is not None:
        rows.append(("engine", engine))
    rows.append(("tokens", _provenance_row(cfg)))
    reference = describe_ref_reset(cfg)  # algo.kl.reset_every (mixrl.config.ref_reset)
    if reference is not None:
        rows.append(("reference", reference))
    env = _env_row(cfg)
    if env is not None:
        rows.append(("env", env))
    rows += [("episode", x) for x in [describe_episode_injection(cfg)] if x]  # algo.episode (mixrl.envs.patching)
    rows.append(("batch", geometry(cfg).describe()))

    rows += sampler_rows(cfg)
    k = int(cfg.trainer.get("staleness", 0) or 0)
    if k:
        rows.append(("staleness", f"rollouts are generated by the policy as it was {k} optimizer steps earlier "
                                  f"(trainer.staleness={k}; fewer in the first {k} steps); their behaviour log-probs "
                                  "pi_old are that lagged policy's"))
    return rows


def explain_text(cfg: DictConfig, *, title: str | None = None) -> str:
    """The full readable block: header, equation, one row per part, notes.

    Raises :class:`ConfigError` (one line) for a contradictory config, from
    :func:`mixrl.config.objective.check_objective`; a staged algo is explained stage by stage.
    """
    if list(cfg.algo.get("stages") or []):
        raise ConfigError(
            f"algo={cfg.algo.name} runs {len(cfg.algo.stages)} stages; explain each stage's config "
            "(mixrl explain does this for you) instead of the top-level one"
        )
    notes = check_objective(cfg)
    head = title or f"objective of algo={cfg.algo.name}"
    if cfg.get("recipe_info") is not None and cfg.recipe_info.get("name"):
        head += f", recipe {cfg.recipe_info.name}"
    lines = [head, "", "  " + objective_equation(cfg), "", "where"]
    rows = explain_lines(cfg) + [("notation", NOTATION)]
    width = max(len(label) for label, _ in rows)
    for label, text in rows:
        lines.append(f"  {label.ljust(width)}  {text}")
    for n in notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)
