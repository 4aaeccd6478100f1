"""Check component sections of the config against the registered functions.

A component section is a mapping with a ``name`` that selects a function from a registry
in ``mixrl.core``; its other keys must be keyword-only parameters of that function, with
values of the annotated type. Missing parameters are filled with the function's defaults,
so the resolved config (``mixrl config show``) lists every value a run uses.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mixrl.errors import ConfigError, did_you_mean

# config path -> (registry attribute in mixrl.core, human kind)
_SECTION_REGISTRY = {
    "algo.loss": ("POLICY_LOSSES", "policy loss"),
    "algo.aggregation": ("AGGREGATIONS", "aggregation"),
    "algo.advantage": ("ADVANTAGES", "advantage"),
    "algo.mix.token_weight": ("TOKEN_WEIGHTS", "token weight"),
    "algo.mix.mu": ("SCHEDULES", "schedule"),
    "algo.entropy_coef": ("SCHEDULES", "schedule"),
    "algo.controller": ("CONTROLLERS", "controller"),
}
COMPONENT_SECTIONS = {k: v[1] for k, v in _SECTION_REGISTRY.items()}
# keyword-only arguments that the trainer passes at run time; not config parameters
RUNTIME_ARGS = frozenset({"num_items", "include"})


def registry_for(section: str):
    import mixrl.core as core

    return getattr(core, _SECTION_REGISTRY[section][0])


def _params(section: str, name: str | None) -> dict[str, inspect.Parameter] | None:
    if name is None:
        return None
    reg = registry_for(section)
    if name not in reg:
        return None
    return {k: p for k, p in reg.params(name).items() if k not in RUNTIME_ARGS}


def component_param_names(section: str, name: str | None) -> set[str] | None:
    params = _params(section, name)
    return None if params is None else set(params)


def _type_ok(value: Any, annotation: Any) -> tuple[bool, str]:
    """Loose check of a config value against a simple annotation (given as text or type)."""
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
    }
    known = [t for t in allowed if t in checks]
    if not known:  # an annotation we do not check (e.g. a Tensor)
        return (True, text)
    return (any(checks[t](value) for t in known), text)


def _validate_section(cfg: DictConfig, section: str) -> None:
    node = OmegaConf.select(cfg, section)
    if node is None:
        return
    kind = COMPONENT_SECTIONS[section]
    if not isinstance(node, DictConfig):
        if section in ("algo.entropy_coef", "algo.mix.mu") and isinstance(node, (int, float)):
            return  # a plain number is a constant schedule
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
    for key in list(node.keys()):
        if key == "name":
            continue
        if key not in params:
            raise ConfigError(
                f"unknown key '{section}.{key}': {kind} '{name}' has no parameter '{key}'"
                f"{did_you_mean(str(key), params)}; its parameters: {', '.join(params) or 'none'}"
            )
        value = node[key]
        ok, expected = _type_ok(value, params[key].annotation)
        if not ok:
            raise ConfigError(f"wrong type for '{section}.{key}': got {value!r}, expected {expected}")
    with _open(node):
        for key, p in params.items():
            if key not in node and p.default is not inspect.Parameter.empty:
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


def validate_components(cfg: DictConfig) -> None:
    for section in _SECTION_REGISTRY:
        _validate_section(cfg, section)
    kl = cfg.algo.kl
    unknown = set(kl.keys()) - {"coef", "estimator"}
    if unknown:
        key = sorted(unknown)[0]
        raise ConfigError(f"unknown key 'algo.kl.{key}'{did_you_mean(key, ['coef', 'estimator'])}")
    import mixrl.core as core

    est = kl.get("estimator", "k3")
    if est not in core.KL_ESTIMATORS:
        names = core.KL_ESTIMATORS.names()
        raise ConfigError(f"unknown KL estimator '{est}' for algo.kl.estimator{did_you_mean(est, names)}; choices: {', '.join(names)}")


def resolve_type_hints(fn) -> dict[str, Any]:  # pragma: no cover - debugging aid
    return typing.get_type_hints(fn)
