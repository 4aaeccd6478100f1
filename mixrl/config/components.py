"""Check component sections of the config against the registered components.

A component section is a mapping with a ``name`` that selects an entry of a registry
(``mixrl.core`` for tensor math, ``mixrl.sources`` for sources and injections); its other
keys must be keyword-only parameters of that entry, with values of the annotated type.
Missing parameters are filled with the entry's defaults, so the resolved config
(``mixrl config show``) lists every value a run uses.

Sections are fixed paths (``algo.loss``) or patterns (``algo.terms.*`` for every term,
``algo.coefs.*`` for every coefficient); a term section also has the keys every term
shares (:data:`TERM_KEYS`) and may hold components of its own (``token_weight``, ``loss``,
``aggregation``).
"""

from __future__ import annotations

import fnmatch
import importlib
import inspect
import math
from typing import Any

from omegaconf import DictConfig, OmegaConf

import mixrl.core as core
from mixrl.core.advantages import GRPO_SCALES
from mixrl.core.turn_advantages import MT_GRPO_OUTCOMES
from mixrl.core.uis1 import UIS1_MODES
from mixrl.errors import ConfigError, did_you_mean

# config path pattern -> (module, registry attribute, human kind)
_SECTION_REGISTRY = {
    "algo.loss": ("mixrl.core", "POLICY_LOSSES", "policy loss"),
    "algo.aggregation": ("mixrl.core", "AGGREGATIONS", "aggregation"),
    "algo.advantage": ("mixrl.core", "ADVANTAGES", "advantage"),
    "algo.entropy_coef": ("mixrl.core", "SCHEDULES", "schedule"),
    "algo.controller": ("mixrl.core", "CONTROLLERS", "controller"),
    "algo.shaping": ("mixrl.core", "SHAPINGS", "advantage shaping"),
    "algo.inject": ("mixrl.sources", "INJECTIONS", "injection"),
    "offpolicy.source": ("mixrl.sources", "SOURCES", "off-policy source"),
    "teacher.source": ("mixrl.sources", "SOURCES", "teacher source"),
    "sampler.pick": ("mixrl.sampler", "PICKERS", "prompt picker"),
    "sampler.keep": ("mixrl.sampler", "GROUP_FILTERS", "group filter"),
    "sampler.rows.*": ("mixrl.sampler", "ROW_FILTERS", "row filter"),
    "sampler.length": ("mixrl.core", "SCHEDULES", "schedule"),
    "algo.coefs.*": ("mixrl.core", "SCHEDULES", "schedule"),
    "algo.terms.*": ("mixrl.core", "TERMS", "term"),
    "algo.terms.*.token_weight": ("mixrl.core", "TOKEN_WEIGHTS", "token weight"),
    "algo.terms.*.loss": ("mixrl.core", "POLICY_LOSSES", "policy loss"),
    "algo.terms.*.aggregation": ("mixrl.core", "AGGREGATIONS", "aggregation"),
    "algo.terms.*.weight": ("mixrl.core", "SCHEDULES", "schedule"),
}
#: sections that may also be a plain number (a constant schedule) or a string (a term weight)
_SCALAR_OK = ("algo.entropy_coef", "algo.coefs.*", "algo.terms.*.weight", "sampler.length")
#: sections that may be null (the term inherits the algo-level component)
_NULL_OK = ("algo.terms.*.token_weight", "algo.terms.*.loss", "algo.terms.*.aggregation", "algo.controller", "algo.shaping", "sampler.length")
#: keys every term has besides its own parameters
TERM_KEYS = ("tokens", "normalise_over", "weight", "aggregation")
#: keys every advantage shaping has besides its own parameters (mixrl.config.shaping.SHAPING_KEYS)
SHAPING_KEYS = ("offpolicy",)
# keyword-only arguments that the trainer passes at run time; not config parameters
RUNTIME_ARGS = frozenset({"num_items", "include"})


def _pattern(section: str) -> str | None:
    parts = section.split(".")
    for pattern in _SECTION_REGISTRY:
        p = pattern.split(".")
        if len(p) == len(parts) and fnmatch.fnmatchcase(section, pattern):
            return pattern
    return None


def component_kind(section: str) -> str | None:
    """The human kind of a component section (``policy loss``), or None if it is not one."""
    pattern = _pattern(section)
    return _SECTION_REGISTRY[pattern][2] if pattern else None


def registry_for(section: str):
    """The registry a component section selects from (by module and attribute name)."""
    module, attr, _ = _SECTION_REGISTRY[_pattern(section)]
    return getattr(importlib.import_module(module), attr)


def _params(section: str, name: str | None) -> dict[str, inspect.Parameter] | None:
    if name is None:
        return None
    reg = registry_for(section)
    if name not in reg:
        return None
    return {k: p for k, p in reg.params(name).items() if k not in RUNTIME_ARGS}


def component_param_names(section: str, name: str | None) -> set[str] | None:
    params = _params(section, name)
    if params is None:
        return None
    if _pattern(section) == "algo.terms.*":
        return set(params) | set(TERM_KEYS)
    return set(params)


def _type_ok(value: Any, annotation: Any) -> tuple[bool, str]:
    """Loose check of a config value against a simple annotation (given as text or type).
    A parameter without an annotation takes any value (it checks its own)."""
    if annotation is inspect.Parameter.empty:
        return (True, "any")
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    text = text.replace("typing.", "").replace("Optional[", "").replace("]", " | None")
    allowed = {t.strip() for t in text.split("|")}
    if value is None:
        return ("None" in allowed, text)
    checks = {
        "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "bool": lambda v: isinstance(v, bool),
        "str": lambda v: isinstance(v, str),
        "dict": lambda v: isinstance(v, DictConfig),
        "list": lambda v: OmegaConf.is_list(v) or isinstance(v, (list, tuple)),
    }
    known = [t for t in allowed if t in checks]
    if not known:  # an annotation we do not check (e.g. a Tensor)
        return (True, text)
    return (any(checks[t](value) for t in known), text)


def _validate_section(cfg: DictConfig, section: str) -> None:
    node = OmegaConf.select(cfg, section)
    pattern = _pattern(section)
    if node is None:
        if pattern in _NULL_OK:
            return
        if pattern in ("algo.terms.*.weight",):
            return
        return
    kind = _SECTION_REGISTRY[pattern][2]
    if not isinstance(node, DictConfig):
        if pattern in _SCALAR_OK and isinstance(node, (int, float, str)) and not isinstance(node, bool):
            return  # a plain number is a constant schedule; a string a coefficient reference
        raise ConfigError(f"'{section}' must be a mapping with a 'name' (a {kind}), got {node!r}")
    reg = registry_for(section)
    name = node.get("name")
    if name is None:
        raise ConfigError(f"'{section}' needs a 'name': one of {', '.join(reg.names())}")
    if name not in reg:
        raise ConfigError(
            f"unknown {kind} '{name}' for {section}.name{did_you_mean(str(name), reg.names())}; "
            f"choices: {', '.join(reg.names())}"
        )
    params = _params(section, name)
    shared = TERM_KEYS if pattern == "algo.terms.*" else SHAPING_KEYS if pattern == "algo.shaping" else ()
    for key in list(node.keys()):
        if key == "name" or key in shared:
            continue
        if key not in params:
            raise ConfigError(
                f"unknown key '{section}.{key}': {kind} '{name}' has no parameter '{key}'"
                f"{did_you_mean(str(key), [*params, *shared])}; its parameters: {', '.join([*params, *shared]) or 'none'}"
            )
        value = node[key]
        ok, expected = _type_ok(value, params[key].annotation)
        if not ok and not (value is None and params[key].default is None):  # null: the parameter's own default
            raise ConfigError(f"wrong type for '{section}.{key}': got {value!r}, expected {expected}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{section}.{key}={value} is not a finite number; set a finite {expected}")
    reg.check_ranges(name, {k: node[k] for k in node.keys() if k != "name" and k not in shared}, where=section)
    with _open(node):
        for key, p in params.items():
            if key not in node and p.default is not inspect.Parameter.empty and _pattern(f"{section}.{key}") is None:
                node[key] = p.default


class _open:
    """Temporarily lift struct/readonly flags of a node so defaults can be filled in."""

    def __init__(self, node: DictConfig):
        self.node = node

    def __enter__(self):
        self.struct = OmegaConf.is_struct(self.node)
        OmegaConf.set_struct(self.node, False)

    def __exit__(self, *exc):
        OmegaConf.set_struct(self.node, self.struct)


def sections(cfg: DictConfig) -> list[str]:
    """Every component section path present in ``cfg`` (patterns expanded)."""
    out = []
    for pattern in _SECTION_REGISTRY:
        if "*" not in pattern:
            out.append(pattern)
            continue
        head, _, tail = pattern.partition(".*")
        parent = OmegaConf.select(cfg, head)
        if not isinstance(parent, DictConfig):
            continue
        for key in parent.keys():
            path = f"{head}.{key}{tail}"
            if tail and not isinstance(OmegaConf.select(cfg, f"{head}.{key}"), DictConfig):
                continue
            out.append(path)
    return out


def validate_components(cfg: DictConfig) -> None:
    for section in sections(cfg):
        _validate_section(cfg, section)
    kl = cfg.algo.kl
    unknown = set(kl.keys()) - {"coef", "estimator", "reset_every"}
    if unknown:
        key = sorted(unknown)[0]
        raise ConfigError(f"unknown key 'algo.kl.{key}'{did_you_mean(key, ['coef', 'estimator', 'reset_every'])}")
    adv = cfg.algo.get("advantage")
    if adv is not None and adv.get("name") == "grpo" and adv.get("scale", "group") not in GRPO_SCALES:
        raise ConfigError(f"algo.advantage.scale={adv.get('scale')!r} is not one of {', '.join(GRPO_SCALES)} (TRL's scale_rewards)")
    if adv is not None and adv.get("name") == "mt_grpo" and adv.get("outcome", "last") not in MT_GRPO_OUTCOMES:
        raise ConfigError(f"algo.advantage.outcome={adv.get('outcome')!r} is not one of {', '.join(MT_GRPO_OUTCOMES)}; "
                          "fix algo.advantage.outcome (last: the authors' MT-GRPO, return: every row's advantage from the return)")
    if adv is not None and adv.get("name") == "uis1" and adv.get("mode", "mean_std_norm") not in UIS1_MODES:
        raise ConfigError(f"algo.advantage.mode={adv.get('mode')!r} is not one of {', '.join(UIS1_MODES)}; fix algo.advantage.mode")
    est = kl.get("estimator", "k3")
    if est not in core.KL_ESTIMATORS:
        names = core.KL_ESTIMATORS.names()
        raise ConfigError(f"unknown KL estimator '{est}' for algo.kl.estimator{did_you_mean(est, names)}; choices: {', '.join(names)}")
