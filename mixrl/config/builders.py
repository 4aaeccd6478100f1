"""Build the pieces of the objective from a config: ``cfg.algo`` / ``cfg.offpolicy`` /
``cfg.teacher`` sections to the :class:`~mixrl.core.objective.Objective`, the source, the
teacher, the injection and the controller a run trains with.

Pure construction, no checks beyond the components' own constructors: the checks are in
:mod:`mixrl.config.objective`, the batch geometry (which needs the injection) in
:mod:`mixrl.config.geometry`. The trainer (:mod:`mixrl.trainer.build`) builds a run with
these same functions, so what is checked is what is trained.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from mixrl.core import CONTROLLERS, TERMS
from mixrl.core.engine_mismatch import EngineCorrection
from mixrl.core.objective import Objective, TermSpec
from mixrl.core.schedules import resolve_schedule
from mixrl.sources import INJECTIONS, SOURCES

#: how far schedules are checked when trainer.max_steps is huge
CHECK_LIMIT = 200_000


def plain(node: Any) -> Any:
    """A config node as plain Python (dicts, lists, scalars), interpolations resolved."""
    if isinstance(node, DictConfig) or OmegaConf.is_list(node):
        return OmegaConf.to_container(node, resolve=True)
    return node


def component(node: Any) -> tuple[str | None, dict]:
    """``(name, params)`` of a component section (``{name: ..., <params>}``) or ``(None, {})``."""
    d = dict(plain(node) or {})
    return d.pop("name", None), d


# --------------------------------------------------------------------------- building
def build_objective(cfg: DictConfig) -> Objective:
    """The :class:`Objective` of ``cfg.algo``: its terms, then KL on rollout tokens and entropy on ``algo.entropy_tokens``."""
    a = cfg.algo
    agg_name, agg_params = _aggregation(cfg, a.aggregation)
    coefs = dict(plain(a.get("coefs")) or {})
    terms: list[TermSpec] = []
    for label, node in (plain(a.get("terms")) or {}).items():
        d = dict(node)
        kind = d.pop("name")
        tokens = tuple(d.pop("tokens", None) or ("on_policy",))
        norm = d.pop("normalise_over", None)
        weight = d.pop("weight", 1.0)
        t_agg, t_agg_params = _aggregation(cfg, d.pop("aggregation", None)) if d.get("aggregation") else (agg_name, agg_params)
        if _row_loss(kind) and not node.get("aggregation"):
            t_agg, t_agg_params = ROW_LOSS_AGGREGATION, {}  # a per-pair loss: the mean over pairs
        if kind == "policy" and not d.get("loss"):
            d["loss"] = plain(a.loss)
        d = {k: v for k, v in d.items() if v is not None}
        terms.append(TermSpec(label, kind, tokens, tuple(norm) if norm else None, weight, t_agg, t_agg_params, d))
    kl_coef = float(a.kl.coef)
    if kl_coef:
        terms.append(TermSpec("kl", "kl", ("on_policy",), None, kl_coef, agg_name, agg_params,
                              {"estimator": str(a.kl.estimator)}))
    if _entropy_term_needed(cfg):
        coefs["entropy_coef"] = plain(a.entropy_coef)
        tokens = tuple(plain(a.get("entropy_tokens")) or ("on_policy",))
        terms.append(TermSpec("entropy_bonus", "entropy", tokens, None, "-entropy_coef", "token-mean", {}, {}))
    return Objective(terms, coefs, engine_correction=build_engine_correction(cfg))


#: aggregations whose ``max_len`` defaults to ``trainer.max_completion_length`` when not set
FIXED_LENGTH_AGGREGATIONS = ("seq-mean-token-sum-norm",)


def _aggregation(cfg: DictConfig, node: Any) -> tuple[str | None, dict]:
    """``(name, params)`` of an aggregation section. ``seq-mean-token-sum-norm`` without
    ``max_len`` divides by ``trainer.max_completion_length``: verl's default (its ``agg_loss``
    divides by ``loss_scale_factor``, None = the response tensor's width, which verl pads to
    the maximum response length), constant over the run."""
    name, params = component(node)
    if name in FIXED_LENGTH_AGGREGATIONS and params.get("max_len") is None:
        params["max_len"] = int(cfg.trainer.max_completion_length)
    return name, params


#: the aggregation of terms that declare ``row_loss`` (a per-row / per-pair loss spread over the row's tokens)
ROW_LOSS_AGGREGATION = "seq-mean-token-sum"


def _row_loss(kind: str) -> bool:
    return kind in TERMS and bool(getattr(TERMS.get(kind), "row_loss", False))


def build_engine_correction(cfg: DictConfig):
    """The engine-mismatch correction of ``algo.engine_correction`` when vLLM generates
    (``hardware.use_vllm``) and it is enabled; None otherwise. ``ValueError`` for bad bounds."""
    node = cfg.algo.get("engine_correction")
    if node is None or not bool(node.enabled) or not bool(cfg.hardware.use_vllm):
        return None
    return EngineCorrection(
        mode=str(node.mode),
        c_min=None if node.c_min is None else float(node.c_min),
        c_max=None if node.c_max is None else float(node.c_max),
    )


def _entropy_term_needed(cfg: DictConfig) -> bool:
    name, _ = component(cfg.algo.get("controller"))
    if name is not None and "entropy_coef" in controller_class(name).knob_names:
        return True
    fn = resolve_schedule(plain(cfg.algo.entropy_coef))
    return any(fn(s) != 0.0 for s in check_steps(cfg))


def controller_class(name: str):
    """The registered controller class ``name``."""
    return CONTROLLERS.get(name)


def check_steps(cfg: DictConfig) -> range:
    """The optimizer steps at which schedules are evaluated by the checks (0..max_steps, capped)."""
    return range(0, min(int(cfg.trainer.max_steps), CHECK_LIMIT) + 1)


def build_source(cfg: DictConfig):
    """The configured off-policy source (``offpolicy.source``)."""
    name, params = component(cfg.offpolicy.source)
    return SOURCES.get(name)(**params)


def build_teacher(cfg: DictConfig):
    """The configured teacher source (``teacher.source``), or None (``teacher=none``)."""
    node = cfg.get("teacher")
    name, params = component(node.source) if node is not None else (None, {})
    if name in (None, "none"):
        return None
    return SOURCES.get(name)(**params)


def build_injection(cfg: DictConfig, *, source=None, geometry=None):
    """The configured injection (``algo.inject``), holding its source."""
    name, params = component(cfg.algo.inject)
    return INJECTIONS.get(name)(source=source, geometry=geometry, seed=int(cfg.seed), **params)


def build_controller(cfg: DictConfig):
    """The configured controller instance (``algo.controller``), or None."""
    name, params = component(cfg.algo.get("controller"))
    return None if name is None else controller_class(name)(**params)
