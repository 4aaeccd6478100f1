"""``mixrl explain``: the objective a composed config trains, written out as math.

Pure functions over a validated ``DictConfig`` (from ``compose_config``); the CLI command
in ``mixrl.cli.explain`` only prints what they return. Everything is derived from
``mixrl.trainer.build.build_objective(cfg)`` (the ``ObjectiveSpec`` the trainer trains)
plus ``cfg.algo`` (advantage, controller, mixing keys) and the batch geometry, so the text
cannot drift from what ``mixrl train`` does with the same overrides.

Entry points:

* :func:`check_objective` raises :class:`ConfigError` (one line) for contradictory
  combinations and returns notes (non-fatal remarks) for the rest;
* :func:`explain_text` returns the whole readable block (equation, terms, notes);
* :func:`schedules` / :func:`schedule_rows` give each scheduled coefficient and its value
  at chosen steps; :func:`plot_schedules` draws them (matplotlib, Agg backend).

Notation in the output: ``r_t = pi_theta(y_t|s_t) / pi_old(y_t|s_t)``, ``p = pi_theta(y_t|s_t)``,
``A`` the row's advantage, ``sg`` stop-gradient, "rollouts" the on-policy rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mixrl.errors import ConfigError

#: keys of ``algo.mix`` and the mix modes that use them
MIX_KEYS: dict[str, tuple[str, ...]] = {
    "mode": ("none", "aux_loss", "group_inject", "sft"),
    "mu": ("aux_loss",),
    "token_weight": ("aux_loss", "sft"),
    "expert_rows": ("aux_loss",),
    "expert_ratio": ("aux_loss",),
    "shaping_gamma": ("group_inject",),
    "experts_per_group": ("group_inject",),
}
#: policy losses whose value depends on the importance ratio r_t
RATIO_LOSSES = ("ppo_clip", "gspo", "cispo", "sapo", "m2po", "topr")
#: how far schedules are checked when trainer.max_steps is huge
_CHECK_LIMIT = 200_000


# --------------------------------------------------------------------------- helpers
def _g(x: Any) -> str:
    """Compact number: 0.2, 1e-06, 24, 0.9997."""
    if isinstance(x, bool) or x is None:
        return str(x)
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if x == int(x) and abs(x) < 1e6:
            return str(int(x))
        return f"{x:.6g}"
    return str(x)


def _plain(node: Any) -> Any:
    if isinstance(node, (DictConfig,)) or OmegaConf.is_list(node):
        return OmegaConf.to_container(node, resolve=True)
    return node


def _mix(cfg: DictConfig) -> dict:
    return dict(_plain(cfg.algo.get("mix")) or {})


def _component(node: Any) -> tuple[str | None, dict]:
    d = dict(_plain(node) or {})
    return d.pop("name", None), d


def _is_constant(spec: Any) -> bool:
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        return True
    if isinstance(spec, Mapping):
        name = spec.get("name")
        if name == "constant":
            return True
        if name == "cosine":
            p = {"warmup": 0, "peak": 0.1, "decay": 0, "valley": 0.1, **spec}
            return p["warmup"] == 0 and p["peak"] == p["valley"]
    return False


def _constant_value(spec: Any) -> float | None:
    if not _is_constant(spec):
        return None
    from mixrl.core.schedules import resolve_schedule

    return float(resolve_schedule(spec)(0))


def _describe(spec: Any) -> str:
    from mixrl.core.schedules import describe_schedule

    const = _constant_value(spec)
    if const is not None:
        return f"{_g(const)} (constant)"
    text = describe_schedule(spec)
    name = spec.get("name") if isinstance(spec, Mapping) else None
    if name == "cosine":
        p = {"warmup": 0, "peak": 0.1, "decay": 0, "valley": 0.1, **spec}
        w, d = int(p["warmup"]), int(p["decay"])
        parts = []
        if w:
            parts.append(f"linear 0 -> {_g(p['peak'])} over steps 0..{w}")
        if d:
            parts.append(f"cosine {_g(p['peak'])} -> {_g(p['valley'])} over steps {w}..{w + d}")
        parts.append(f"{_g(p['valley'])} from step {w + d}")
        text += ": " + ", ".join(parts)
    elif name == "linear":
        p = {"start": 0.0, "end": 1.0, "steps": 100, **spec}
        text += f": {_g(p['start'])} -> {_g(p['end'])} over steps 0..{p['steps']}, then {_g(p['end'])}"
    elif name == "step":
        p = {"switch_step": 0, "before": 0.0, "after": 1.0, **spec}
        text += f": {_g(p['before'])} before step {p['switch_step']}, {_g(p['after'])} from then on"
    return text


def _first_bad(fn: Callable[[int], float], max_steps: int, ok: Callable[[float], bool]) -> tuple[int, float] | None:
    for step in range(0, min(max_steps, _CHECK_LIMIT) + 1):
        v = fn(step)
        if not ok(v) or not math.isfinite(v):
            return step, v
    return None


def _objective(cfg: DictConfig):
    from mixrl.trainer.build import build_objective

    try:
        return build_objective(cfg)
    except ConfigError:
        raise
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"could not build the objective from algo: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


# --------------------------------------------------------------------------- checks
def check_objective(cfg: DictConfig) -> list[str]:
    """Raise ConfigError (one line) for a contradictory objective; return notes.

    Contradictions (errors): off-policy mixing without an off-policy source and vice
    versa; expert-only knobs (``mu``, ``token_weight`` ...) with ``mix.mode=none``; mu outside
    [0, 1] or a negative entropy coefficient at any step of the run; the ``sft`` loss with a
    KL to the reference; BAPO's controller with a loss other than ``ppo_clip``; EntroPIC's
    controller together with a non-zero ``algo.entropy_coef``; invalid loss / controller /
    mixing parameters that would only fail at training time.
    """
    from mixrl.config.rules import geometry
    from mixrl.core import CONTROLLERS
    from mixrl.core.schedules import resolve_schedule

    algo, notes = cfg.algo, []
    if list(algo.get("stages") or []):
        raise ConfigError(
            f"algo={algo.name} runs {len(algo.stages)} stages; explain each stage's config "
            "(mixrl explain does this for you) instead of the top-level one"
        )
    spec = _objective(cfg)
    mix = _mix(cfg)
    mode = spec.mix_mode
    source = str(cfg.offpolicy.source)
    max_steps = int(cfg.trainer.max_steps)
    G = int(algo.num_generations)
    steps = range(0, min(max_steps, _CHECK_LIMIT) + 1)
    ent = resolve_schedule(spec.entropy_coef)
    ent_nonzero = any(ent(s) != 0.0 for s in steps)

    # --- off-policy source vs mixing mode
    if mode not in MIX_KEYS["mode"]:
        raise ConfigError(f"unknown algo.mix.mode '{mode}'; choices: {', '.join(MIX_KEYS['mode'])}")
    if mode != "none" and source == "none":
        raise ConfigError(
            f"algo.mix.mode={mode} trains on off-policy rows but offpolicy.source is 'none'; add offpolicy=expert"
        )
    used_elsewhere = [k for k in mix if k != "mode" and k in MIX_KEYS and mode not in MIX_KEYS[k]]
    if mode == "none":
        if used_elsewhere:
            key = used_elsewhere[0]
            raise ConfigError(
                f"algo.mix.{key} acts on expert rows, but algo.mix.mode=none trains on rollouts only; "
                f"set algo.mix.mode={MIX_KEYS[key][0]} with offpolicy=expert, or drop it (~algo.mix.{key})"
            )
        if source != "none":
            raise ConfigError(
                f"offpolicy={cfg.offpolicy.name} loads expert rows but algo.mix.mode=none never trains on them; "
                "set algo.mix.mode=aux_loss (CHORD) or group_inject (LUFFY), or use offpolicy=none"
            )
    else:
        for key in used_elsewhere:
            notes.append(f"algo.mix.{key} is ignored with algo.mix.mode={mode} (it applies to {', '.join(MIX_KEYS[key])})")
    unknown = [k for k in mix if k not in MIX_KEYS]
    if unknown:
        notes.append(f"unknown algo.mix key(s) {', '.join(unknown)}: not read by the objective")

    # --- mixing parameters
    if mode == "aux_loss":
        mu = resolve_schedule(spec.mu)
        bad = _first_bad(mu, max_steps, lambda v: 0.0 <= v <= 1.0)
        if bad:
            raise ConfigError(
                f"algo.mix.mu = {_g(bad[1])} at step {bad[0]}: mu weighs (1 - mu) RL + mu SFT and must stay in [0, 1]"
            )
        values = {mu(s) for s in steps}
        if values == {0.0}:
            notes.append("mu = 0 at every step: the expert term never contributes (this is plain RL plus idle expert rows)")
        elif values == {1.0}:
            notes.append("mu = 1 at every step: the RL term has weight 0 (pure SFT on the expert rows)")
        geometry(cfg)  # expert_rows / expert_ratio are checked with the batch geometry
    if mode == "group_inject":
        gamma = mix.get("shaping_gamma", spec.shaping_gamma)
        if not isinstance(gamma, (int, float)) or isinstance(gamma, bool) or gamma <= 0:
            raise ConfigError(f"algo.mix.shaping_gamma must be > 0 (f(p) = p / (p + gamma)), got {gamma!r}")
        k = mix.get("experts_per_group")
        if k is not None:
            if not isinstance(k, int) or isinstance(k, bool) or k < 1:
                raise ConfigError(f"algo.mix.experts_per_group must be an integer >= 1, got {k!r}")
            if k >= G:
                raise ConfigError(
                    f"algo.mix.experts_per_group={k} leaves no rollout in a group of algo.num_generations={G}; "
                    f"use at most {G - 1}"
                )
        adv_name = algo.advantage.name
        if adv_name in ("grpo", "batch_norm") and not bool(algo.advantage_include_offpolicy):
            notes.append(
                f"advantage {adv_name} with algo.advantage_include_offpolicy=false: an expert row in a group whose "
                "rollouts all got the same reward gets (r - mean) / eps, a huge advantage; LUFFY's script uses dr_grpo"
            )

    # --- policy loss parameters
    lp = spec.policy_params
    for key in ("clip_low", "clip_high"):
        if key in lp and lp[key] is not None and lp[key] < 0:
            raise ConfigError(f"algo.loss.{key} must be >= 0 (an epsilon around r = 1), got {_g(lp[key])}")
    if spec.policy_loss == "ppo_clip" and lp.get("dual_clip_c") is not None and lp["dual_clip_c"] <= 1:
        raise ConfigError(f"algo.loss.dual_clip_c must be > 1 (or null), got {_g(lp['dual_clip_c'])}")
    if spec.policy_loss == "reinforce" and lp.get("tis_cap") is not None and lp["tis_cap"] < 1:
        raise ConfigError(f"algo.loss.tis_cap must be >= 1 (or null), got {_g(lp['tis_cap'])}")
    if spec.policy_loss == "sapo" and (lp.get("tau_pos", 1.0) <= 0 or lp.get("tau_neg", 1.05) <= 0):
        raise ConfigError("algo.loss.tau_pos and algo.loss.tau_neg must be > 0")
    if spec.policy_loss == "m2po" and lp.get("m2_budget", 0.04) < 0:
        raise ConfigError(f"algo.loss.m2_budget must be >= 0, got {_g(lp['m2_budget'])}")
    if mode == "sft":
        if spec.kl_coef > 0:
            raise ConfigError(
                f"algo.mix.mode=sft trains on expert rows only, but the KL term (algo.kl.coef={_g(spec.kl_coef)}) "
                "acts on rollouts; set algo.kl.coef=0"
            )
        if ent_nonzero:
            raise ConfigError(
                "algo.mix.mode=sft trains on expert rows only, but the entropy bonus (algo.entropy_coef) acts on "
                "rollouts; set algo.entropy_coef=0"
            )
    if spec.policy_loss == "sft" and spec.kl_coef > 0:
        raise ConfigError(
            f"algo.loss.name=sft with algo.kl.coef={_g(spec.kl_coef)}: a supervised loss has no reference policy to "
            "stay close to; set algo.kl.coef=0"
        )

    # --- entropy coefficient
    ctrl_name, ctrl_params = _component(algo.get("controller"))
    bad = _first_bad(ent, max_steps, lambda v: v >= 0.0)
    if bad:
        raise ConfigError(
            f"algo.entropy_coef = {_g(bad[1])} at step {bad[0]}: a negative coefficient pushes entropy down; "
            "use a coefficient >= 0"
        )

    # --- aggregation
    agg_params = spec.aggregation_params
    if spec.aggregation == "seq-mean-token-sum-norm":
        if agg_params.get("max_len") is None:
            notes.append(
                "seq-mean-token-sum-norm without algo.aggregation.max_len divides by the padded width of each "
                "micro-batch, which changes from step to step; set algo.aggregation.max_len=${trainer.max_completion_length}"
            )
        elif agg_params["max_len"] < int(cfg.trainer.max_completion_length):
            notes.append(
                f"algo.aggregation.max_len={agg_params['max_len']} < trainer.max_completion_length="
                f"{cfg.trainer.max_completion_length}: long completions weigh more than 1 per row"
            )
    elif agg_params.get("max_len") is not None:
        notes.append(f"algo.aggregation.max_len is ignored by {spec.aggregation}")

    # --- controller
    if ctrl_name is not None:
        try:
            CONTROLLERS.get(ctrl_name)(**ctrl_params)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"algo.controller ({ctrl_name}): {str(e).splitlines()[0]}") from None
        if ctrl_name == "bapo" and spec.policy_loss != "ppo_clip":
            raise ConfigError(
                f"algo.controller=bapo sets PPO clip bounds, but algo.loss.name={spec.policy_loss} has no PPO clip; "
                "use algo.loss.name=ppo_clip"
            )
        if ctrl_name == "entropic":
            if ent_nonzero:
                raise ConfigError(
                    "algo.controller=entropic sets the entropy coefficient every step, which would overwrite "
                    "algo.entropy_coef; set algo.entropy_coef=0"
                )

    # --- off-policyness of the rollouts
    if (
        spec.policy_loss in RATIO_LOSSES
        and mode != "sft"
        and int(cfg.trainer.num_iterations) == 1
        and not cfg.hardware.use_vllm
    ):
        what = {"ppo_clip": "clip", "gspo": "clip", "cispo": "IS-weight clip", "sapo": "gate",
                "m2po": "M2 mask", "topr": "IS taper"}[spec.policy_loss]
        notes.append(
            f"trainer.num_iterations=1: rollouts are scored by the policy that generated them, so r_t = 1 and the "
            f"{what} never acts on them (it does from trainer.num_iterations=2)"
        )
    return notes


# --------------------------------------------------------------------------- rendering
def _policy_label(name: str, p: dict, controller: str | None) -> str:
    if name == "ppo_clip":
        if controller == "bapo":
            inner = "eps_low, eps_high <- BAPO"
        else:
            inner = f"eps_low={_g(p.get('clip_low'))}, eps_high={_g(p.get('clip_high'))}"
        if p.get("dual_clip_c") is not None:
            inner += f", dual_c={_g(p['dual_clip_c'])}"
        return f"PPOclip[{inner}]"
    if name == "reinforce":
        return "REINFORCE" if p.get("tis_cap") is None else f"REINFORCE-TIS[cap={_g(p['tis_cap'])}]"
    if name == "topr":
        return "TOPR"
    if name == "cispo":
        return f"CISPO[eps_low={_g(p.get('clip_low'))}, eps_high={_g(p.get('clip_high'))}]"
    if name == "gspo":
        return f"GSPOclip[eps_low={_g(p.get('clip_low'))}, eps_high={_g(p.get('clip_high'))}]"
    if name == "sapo":
        return f"SAPOgate[tau_pos={_g(p.get('tau_pos'))}, tau_neg={_g(p.get('tau_neg'))}]"
    if name == "m2po":
        return f"M2PO[budget={_g(p.get('m2_budget'))}]"
    if name == "sft":
        return "NLL"
    inner = ", ".join(f"{k}={_g(v)}" for k, v in p.items())
    return f"{name}[{inner}]" if inner else name


def _policy_formula(name: str, p: dict, controller: str | None) -> str:
    if name == "ppo_clip":
        if controller == "bapo":
            text = "l_t = max(-A r_t, -A clip(r_t, c_low, c_high)), [c_low, c_high] chosen by BAPO"
        else:
            lo, hi = 1 - p.get("clip_low", 0.2), 1 + p.get("clip_high", 0.2)
            if lo <= 0 and hi >= 1e6:
                text = "l_t = -A r_t (clip disabled)"
            elif lo <= 0:
                text = f"l_t = max(-A r_t, -A min(r_t, {_g(hi)})) (no lower clip)"
            elif hi >= 1e6:
                text = f"l_t = max(-A r_t, -A max(r_t, {_g(lo)})) (no upper clip)"
            else:
                text = f"l_t = max(-A r_t, -A clip(r_t, {_g(lo)}, {_g(hi)}))"
        if p.get("dual_clip_c") is not None:
            text += f"; dual clip for A < 0: l_t = min(l_t, -{_g(p['dual_clip_c'])} A)"
        return text
    if name == "reinforce":
        if p.get("tis_cap") is None:
            return "l_t = -A log p_t (no importance weight)"
        return f"l_t = -sg(min(r_t, {_g(p['tis_cap'])})) A log p_t (truncated IS)"
    if name == "topr":
        return "l_t = -A log p_t if A >= 0 (no ratio); -sg(clip(r_t, 0, 1)) A log p_t if A < 0"
    if name == "cispo":
        lo, hi = 1 - p.get("clip_low", 1.0), 1 + p.get("clip_high", 0.28)
        lower = "no lower bound" if lo <= 0 else f"lower bound {_g(lo)}"
        return f"l_t = -sg(clip(r_t, {_g(max(lo, 0.0))}, {_g(hi)})) A log p_t ({lower}; every token keeps its gradient)"
    if name == "gspo":
        return (
            f"s = exp(mean_t log r_t) per row (length-normalised sequence ratio), s_t = sg(s) p_t / sg(p_t); "
            f"l_t = max(-A s_t, -A clip(s_t, {_g(1 - p.get('clip_low', 3e-4))}, {_g(1 + p.get('clip_high', 4e-4))}))"
        )
    if name == "sapo":
        return (
            f"l_t = -(4 / tau) sigmoid(tau (r_t - 1)) A, tau = {_g(p.get('tau_pos'))} if A > 0 else {_g(p.get('tau_neg'))} "
            "(smooth gate, no hard clip)"
        )
    if name == "m2po":
        return (
            f"l_t = -r_t A on kept tokens, 0 on masked ones; masks the fewest tokens (largest (log r_t)^2) so that "
            f"mean (log r_t)^2 <= {_g(p.get('m2_budget'))} over the micro-batch"
        )
    if name == "sft":
        return "l_t = -log p_t (advantage ignored)"
    from mixrl.core import POLICY_LOSSES

    doc = (POLICY_LOSSES.get(name).__doc__ or "").splitlines()
    formula = [ln.strip() for ln in doc if ln.strip().startswith("Formula")]
    return formula[0] if formula else "(see mixrl docs components)"


def _token_weight_label(name: str, p: dict) -> str:
    base = {
        "one": "NLL",
        "p": "NLL * sg(p)",
        "chord_phi": "NLL * phi(p)=p(1-p)",
        "luffy": f"NLL * sg(p/(p+{_g(p.get('gamma', 0.1))}))",
    }.get(name)
    if base is None:
        extra = ", ".join(f"{k}={_g(v)}" for k, v in p.items() if k != "cutoff")
        base = f"NLL * w_{name}(p)" + (f"[{extra}]" if extra else "")
    if p.get("cutoff") is not None:
        base += f" (0 where p > {_g(p['cutoff'])})"
    return base


def _aggregation_text(name: str, params: dict, cfg: DictConfig, over: str) -> str:
    if name == "token-mean":
        return f"token-mean: sum of l_t over all {over} tokens of the step / their number"
    if name == "seq-mean-token-mean":
        return f"seq-mean-token-mean: mean over {over} rows of (mean of l_t over the row's tokens)"
    if name == "seq-mean-token-sum":
        return f"seq-mean-token-sum: mean over {over} rows of (sum of l_t over the row's tokens)"
    if name == "seq-mean-token-sum-norm":
        max_len = params.get("max_len")
        if max_len is None:
            norm = "the padded width T of each micro-batch (no max_len)"
        else:
            norm = f"max_len={max_len}"
            if max_len == cfg.trainer.max_completion_length:
                norm += " (= trainer.max_completion_length)"
        return f"seq-mean-token-sum-norm (Dr.GRPO): mean over {over} rows of (sum of l_t / {norm})"
    return f"{name}: {params}" if params else name


def _advantage_text(cfg: DictConfig, mode: str, mix: dict) -> str:
    name, p = _component(cfg.algo.advantage)
    G = int(cfg.algo.num_generations)
    eps = _g(p.get("eps", 1e-6))
    dof = "n-1" if p.get("unbiased", True) else "n"
    formula = {
        "grpo": f"A = (R - mean_g R) / (std_g R + {eps}), std with {dof}",
        "dr_grpo": "A = R - mean_g R (no std division)",
        "rloo": "A = R - mean of the other rows of the group (leave-one-out)",
        "reinforce": "A = R - mean_batch R (batch baseline, groups ignored)",
        "batch_norm": f"A = (R - mean_batch R) / (std_batch R + {eps}), std with {dof}",
    }.get(name, f"{name}({', '.join(f'{k}={_g(v)}' for k, v in p.items())})")
    grouped = name in ("grpo", "dr_grpo", "rloo")
    if mode == "group_inject":
        k = mix.get("experts_per_group", 1)
        comp = f"{G - k} rollouts + {k} expert trace(s)" if isinstance(k, int) else "rollouts + expert trace(s)"
        inc = bool(cfg.algo.advantage_include_offpolicy)
        scope = f"group of {G} = {comp}" if grouped else "batch"
        stats = "yes" if inc else "no (they get A against the rollouts' statistics)"
        return f"{name}: {formula}; {scope}; expert rows counted in the statistics: {stats} (algo.advantage_include_offpolicy={str(inc).lower()})"
    where = f"group = the {G} completions of a prompt" if grouped else "all rollouts of the step"
    if mode == "aux_loss":
        return f"{name}: {formula}; {where}; expert rows get no advantage (they never enter a group)"
    return f"{name}: {formula}; {where}"


def _kl_text(spec) -> str:
    if not spec.kl_coef:
        return "none (algo.kl.coef = 0)"
    forms = {
        "k1": "k1 = log pi_theta - log pi_ref",
        "k2": "k2 = (log pi_ref - log pi_theta)^2 / 2",
        "k3": "k3 = exp(x) - 1 - x, x = log pi_ref - log pi_theta",
        "k3_clamped": "k3 with x clamped to [-10, 10], result clamped to [-10, 10]",
    }
    form = forms.get(spec.kl_estimator, spec.kl_estimator)
    return (
        f"+ {_g(spec.kl_coef)} * KL_{spec.kl_estimator}(pi_theta || pi_ref) per rollout token, {form}; "
        f"aggregated like the policy term ({spec.aggregation})"
    )


def _entropy_text(spec, controller: str | None, ctrl_params: dict) -> str:
    if controller == "entropic":
        p = {"target": 0.2, "kp": 1.0, "ki": 0.05, "coef_min": -1.0, "coef_max": 1.0, **ctrl_params}
        return (
            "- c_ent(t) * token-mean H over rollout tokens, c_ent(t) set by the EntroPIC controller "
            f"(target H = {_g(p['target'])} nats, see controller)"
        )
    const = _constant_value(spec.entropy_coef)
    if const == 0.0:
        return "none (algo.entropy_coef = 0)"
    sym = "c_ent" if const is not None else "c_ent(t)"
    return f"- {sym} * token-mean H over rollout tokens, {sym} = {_describe(spec.entropy_coef)}"


def _controller_text(name: str | None, p: dict) -> str:
    if name is None:
        return "none"
    if name == "bapo":
        from mixrl.core import CONTROLLERS

        p = {**CONTROLLERS.defaults("bapo"), **p}
        return (
            f"BAPO adaptive clipping: for each micro-batch, start at [c_low, c_high] = [{_g(p['low_min'])}, "
            f"{_g(p['high_min'])}] and raise c_high by {_g(p['step_high'])} (<= {_g(p['high_max'])}) and c_low by "
            f"{_g(p['step_low'])} (<= {_g(p['low_max'])}) until positive-advantage tokens carry >= {_g(p['rho0'])} "
            "of the clipped contribution; eps_low = 1 - c_low, eps_high = c_high - 1 replace algo.loss.clip_low/high"
        )
    if name == "entropic":
        from mixrl.core import CONTROLLERS

        p = {**CONTROLLERS.defaults("entropic"), **p}
        lim = "" if p.get("integral_limit") is None else f", |I| <= {_g(p['integral_limit'])}"
        return (
            f"EntroPIC PI controller: after each step e = {_g(p['target'])} - H, I += e{lim}, "
            f"c_ent = clamp({_g(p['kp'])} e + {_g(p['ki'])} I, {_g(p['coef_min'])}, {_g(p['coef_max'])}); "
            "replaces algo.entropy_coef"
        )
    return f"{name}({', '.join(f'{k}={_g(v)}' for k, v in p.items())})"


def objective_equation(cfg: DictConfig) -> str:
    """The one-line objective ``L = ...`` of a validated config."""
    spec = _objective(cfg)
    ctrl, _ = _component(cfg.algo.get("controller"))
    pol = _policy_label(spec.policy_loss, spec.policy_params, ctrl)
    tw = _token_weight_label(spec.token_weight, spec.token_weight_params)
    if spec.mix_mode == "aux_loss":
        mu = "mu" if _is_constant(spec.mu) else "mu_t"
        eq = f"L = (1 - {mu}) * {pol}(rollouts) + {mu} * {tw} (expert rows)"
    elif spec.mix_mode == "group_inject":
        gamma = _g(spec.shaping_gamma)
        eq = f"L = {spec.aggregation}[ {pol}(rollout tokens) ; -A * f(p), f(p)=p/(p+{gamma}), no clip (expert tokens) ]"
    elif spec.mix_mode == "sft":
        eq = f"L = {tw} (expert rows)"
    else:
        eq = f"L = {pol}(rollouts)"
    if spec.kl_coef:
        eq += f" + {_g(spec.kl_coef)} * KL_{spec.kl_estimator}(pi_theta || pi_ref)(rollouts)"
    if ctrl == "entropic":
        eq += " - c_ent(t) * H(rollouts)"
    else:
        const = _constant_value(spec.entropy_coef)
        if const is None:
            eq += " - c_ent(t) * H(rollouts)"
        elif const:
            eq += f" - {_g(const)} * H(rollouts)"
    return eq


def _expert_weight_text(spec) -> str:
    return {
        "one": "w = 1 (plain SFT)",
        "p": "w = sg(p) (IS-SFT)",
        "chord_phi": "w = sg(p (1 - p)), peaks at p = 0.5 (CHORD-phi)",
        "luffy": f"w = sg(p / (p + {_g(spec.token_weight_params.get('gamma', 0.1))}))",
    }.get(spec.token_weight, f"w = {spec.token_weight}(p)")


def _rows_text(cfg: DictConfig, mode: str, mix: dict) -> str:
    """Rows of one optimizer step, by source."""
    from mixrl.config.rules import geometry

    geo = geometry(cfg)
    P, G = geo.prompts_per_step, geo.num_generations
    if mode == "aux_loss":
        how = (
            f"algo.mix.expert_rows={mix['expert_rows']}" if mix.get("expert_rows") is not None
            else f"algo.mix.expert_ratio={_g(mix.get('expert_ratio', 0.2))} of all rows"
        )
        return (
            f"{geo.rollouts_per_step} rollouts + {geo.expert_rows_per_step} expert rows (other prompts, drawn from "
            f"the expert pool; {how}) per step"
        )
    if mode == "group_inject":
        k = int(mix.get("experts_per_group", 1))
        return (
            f"{P} groups x ({G - k} rollouts + {k} expert) = {P * (G - k)} rollouts + {P * k} expert rows per step "
            f"(algo.mix.experts_per_group={k})"
        )
    if mode == "sft":
        return f"{P} prompts x {G} copies of the prompt's expert completion = {P * G} expert rows per step; no rollouts"
    return f"{geo.rollouts_per_step} rollouts per step"


def explain_lines(cfg: DictConfig) -> list[tuple[str, str]]:
    """``(label, text)`` rows describing each term of the objective."""
    from mixrl.config.rules import geometry

    spec = _objective(cfg)
    mix = _mix(cfg)
    mode = spec.mix_mode
    ctrl, ctrl_params = _component(cfg.algo.get("controller"))
    rows: list[tuple[str, str]] = []
    if mode == "sft":
        rows.append((
            "expert term",
            f"-w(p) log p_t on expert tokens, {_expert_weight_text(spec)} (supervised: no ratio, no advantage)",
        ))
        rows.append(("aggregation", _aggregation_text(spec.aggregation, spec.aggregation_params, cfg, "expert")))
        rows.append(("policy loss", f"{spec.policy_loss}: not used (no rollouts)"))
    else:
        rows.append(("policy loss", f"{spec.policy_loss}: {_policy_formula(spec.policy_loss, spec.policy_params, ctrl)}"))
        over = "rollout + expert" if mode == "group_inject" else "rollout"
        agg = _aggregation_text(spec.aggregation, spec.aggregation_params, cfg, over)
        if mode == "aux_loss":
            agg += "; the expert term uses the same aggregation over expert rows only (own normaliser)"
        rows.append(("aggregation", agg))
        rows.append(("advantage", _advantage_text(cfg, mode, mix)))
    if mode == "aux_loss":
        sym = "mu" if _is_constant(spec.mu) else "mu_t"
        rows.append(("mu", f"{sym} = {_describe(spec.mu)}"))
        rows.append((
            "expert term",
            f"-w(p) log p_t on expert tokens, {_expert_weight_text(spec)} (CHORD auxiliary SFT: no ratio, no advantage)",
        ))
    if mode == "group_inject":
        g = spec.shaping_gamma
        rows.append((
            "expert term",
            f"-A * f(p_t) on expert tokens, f(p) = p / (p + {_g(g)}): behaviour probability taken as 1, no clip; "
            f"gradient weight {_g(g)} p / (p + {_g(g)})^2 peaks at p = {_g(g)} (LUFFY policy shaping)",
        ))
    rows.append(("KL", _kl_text(spec)))
    rows.append(("entropy", _entropy_text(spec, ctrl, ctrl_params)))
    rows.append(("controller", _controller_text(ctrl, ctrl_params)))
    rows.append(("off-policy", "none" if cfg.offpolicy.source == "none" else _offpolicy_text(cfg)))
    rows.append(("rows", _rows_text(cfg, mode, mix)))
    rows.append(("batch", geometry(cfg).describe()))
    return rows


def _offpolicy_text(cfg: DictConfig) -> str:
    off = cfg.offpolicy
    if off.get("dataset"):
        return f"expert completions from {off.dataset} (column {off.column or cfg.data.expert_column})"
    return f"expert completions from the training data's column {cfg.data.expert_column!r}"


NOTATION = (
    "r_t = pi_theta(y_t|s_t) / pi_old(y_t|s_t), p_t = pi_theta(y_t|s_t), A = advantage of the row, "
    "sg = stop-gradient, rollouts = on-policy rows"
)


def explain_text(cfg: DictConfig, *, title: str | None = None) -> str:
    """The full readable block: header, equation, one line per term, notes.

    Raises ConfigError for a contradictory config (see :func:`check_objective`).
    """
    notes = check_objective(cfg)
    spec = _objective(cfg)
    head = title or f"objective of algo={cfg.algo.name} (mix mode {spec.mix_mode})"
    if cfg.recipe_info.get("name"):
        head += f", recipe {cfg.recipe_info.name}"
    lines = [head, "", "  " + objective_equation(cfg), "", "where"]
    rows = explain_lines(cfg) + [("notation", NOTATION)]
    width = max(len(label) for label, _ in rows)
    for label, text in rows:
        lines.append(f"  {label.ljust(width)}  {text}")
    for n in notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- schedules
def _lr_schedule(cfg: DictConfig) -> Callable[[int], float]:
    """The learning rate at each optimizer step (transformers' scheduler, as the trainer uses)."""
    import torch
    from transformers import get_scheduler

    t = cfg.trainer
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=float(t.learning_rate))
    try:
        sched = get_scheduler(
            str(t.lr_scheduler_type), opt, num_warmup_steps=int(t.warmup_steps), num_training_steps=int(t.max_steps)
        )
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"trainer.lr_scheduler_type={t.lr_scheduler_type}: {str(e).splitlines()[0]}") from None
    lambdas = getattr(sched, "lr_lambdas", None)
    base = float(t.learning_rate)
    if lambdas:
        return lambda step: base * float(lambdas[0](int(step)))
    values = []  # not a LambdaLR: step it once per optimizer step
    for _ in range(int(t.max_steps) + 1):
        values.append(float(sched.get_last_lr()[0]))
        opt.step()
        sched.step()
    return lambda step: values[min(int(step), len(values) - 1)]


def _extra_schedules(node: Any, prefix: str, known: set[str]) -> dict[str, Any]:
    """Other mappings under ``algo`` that are schedule specs (``{name: cosine, ...}``)."""
    from mixrl.core import SCHEDULES

    out: dict[str, Any] = {}
    if isinstance(node, Mapping):
        name = node.get("name")
        if isinstance(name, str) and name in SCHEDULES and prefix not in known:
            params = SCHEDULES.params(name)
            if all(k == "name" or k in params for k in node):
                out[prefix] = dict(node)
                return out
        for k, v in node.items():
            out.update(_extra_schedules(v, f"{prefix}.{k}", known))
    return out


def schedules(cfg: DictConfig, *, include_lr: bool = True) -> dict[str, Callable[[int], float]]:
    """Each scheduled coefficient of the run as ``label -> f(step)``, in display order.

    ``mu`` (aux_loss only), ``entropy_coef`` (unless a controller sets it), any other schedule
    spec under ``algo``, and ``lr`` (the optimizer's learning rate).
    """
    from mixrl.core.schedules import resolve_schedule

    spec = _objective(cfg)
    ctrl, _ = _component(cfg.algo.get("controller"))
    out: dict[str, Callable[[int], float]] = {}
    if spec.mix_mode == "aux_loss":
        out["mu"] = resolve_schedule(spec.mu)
    if ctrl != "entropic":
        out["entropy_coef"] = resolve_schedule(spec.entropy_coef)
    known = {"algo.mix.mu", "algo.entropy_coef"}
    for path, s in _extra_schedules(_plain(cfg.algo), "algo", known).items():
        out[path.removeprefix("algo.")] = resolve_schedule(s)
    if include_lr:
        out["lr"] = _lr_schedule(cfg)
    return out


def table_steps(max_steps: int, n: int = 5, knots: list[int] | tuple[int, ...] = ()) -> list[int]:
    """``n`` evenly spaced steps from 0 to ``max_steps`` (both included), plus ``knots`` in range."""
    if n < 2:
        raise ConfigError(f"--steps must be >= 2 (0 and trainer.max_steps at least), got {n}")
    steps = {round(i * max_steps / (n - 1)) for i in range(n)}
    steps |= {int(k) for k in knots if 0 <= int(k) <= max_steps}
    return sorted(steps)


def schedule_knots(cfg: DictConfig) -> list[int]:
    """Steps where a schedule changes regime (end of warmup, end of decay, switch steps)."""
    spec = _objective(cfg)
    specs = [spec.entropy_coef] + ([spec.mu] if spec.mix_mode == "aux_loss" else [])
    specs += list(_extra_schedules(_plain(cfg.algo), "algo", {"algo.mix.mu", "algo.entropy_coef"}).values())
    knots: set[int] = set()
    for s in specs:
        if not isinstance(s, Mapping) or _is_constant(s):
            continue
        name = s.get("name")
        if name == "cosine":
            w, d = int(s.get("warmup", 0)), int(s.get("decay", 0))
            knots |= {w, w + d}
        elif name == "linear":
            knots.add(int(s.get("steps", 100)))
        elif name == "step":
            knots.add(int(s.get("switch_step", 0)))
    if int(cfg.trainer.warmup_steps):
        knots.add(int(cfg.trainer.warmup_steps))
    return sorted(knots)


def schedule_rows(cfg: DictConfig, n: int = 5) -> tuple[list[str], list[list[float]]]:
    """``(columns, rows)``: ``step`` and each schedule's value at :func:`table_steps`."""
    fns = schedules(cfg)
    steps = table_steps(int(cfg.trainer.max_steps), n, schedule_knots(cfg))
    return ["step", *fns], [[float(s), *(float(f(s)) for f in fns.values())] for s in steps]


def require_matplotlib():
    """The matplotlib module, or ConfigError with the install hint."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'mixrl[plot]'") from None
    return matplotlib


def plot_schedules(stages: DictConfig | list[tuple[str, DictConfig]], path: str) -> str:
    """Draw every schedule over steps 0..max_steps into a PNG at ``path``; returns the path.

    ``stages``: one config, or ``[(name, cfg), ...]`` for a staged algo (sft_then_rl), drawn
    one after the other on a common step axis.
    """
    matplotlib = require_matplotlib()
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if isinstance(stages, DictConfig):
        stages = [("", stages)]
    segments, labels, offset = [], [], 0
    for name, cfg in stages:
        fns = schedules(cfg)
        labels += [k for k in fns if k not in labels]
        max_steps = int(cfg.trainer.max_steps)
        stride = max(1, max_steps // 2000)
        xs = list(range(0, max_steps + 1, stride))
        if xs[-1] != max_steps:
            xs.append(max_steps)
        segments.append((name, offset, xs, fns))
        offset += max_steps
    fig, axes = plt.subplots(len(labels), 1, figsize=(7, 1.8 * len(labels) + 0.6), sharex=True, squeeze=False)
    for ax, label in zip(axes[:, 0], labels):
        for name, off, xs, fns in segments:
            if label in fns:
                ax.plot([off + x for x in xs], [fns[label](x) for x in xs], lw=1.5, label=name or None)
            if off:
                ax.axvline(off, color="grey", ls="--", lw=0.8)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("optimizer step")
    algo = stages[0][1].algo.name if len(stages) == 1 else " -> ".join(n for n, _ in stages)
    axes[0, 0].set_title(f"schedules of {algo} ({offset} steps)")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=100)
    except OSError as e:
        raise ConfigError(f"could not write the plot to '{path}': {e.strerror or e}") from None
    finally:
        plt.close(fig)
    return str(path)


__all__ = [
    "check_objective",
    "explain_lines",
    "explain_text",
    "objective_equation",
    "plot_schedules",
    "require_matplotlib",
    "schedule_knots",
    "schedule_rows",
    "schedules",
    "table_steps",
]
