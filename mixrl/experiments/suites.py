"""Suites: a grid of recipes x seeds declared in ``conf/suites/NAME.yaml``, not in code.

A suite file holds::

    name: hard
    title: one line for the README
    seeds: 5                 # seeds 0..N-1 (mixrl reproduce --seeds overrides)
    jobs: 2                  # training processes at a time
    methods: {label: recipe, ...}
    overrides: [key=value, ...]   # applied to every run
    compare: {metric: accuracy, target: 0.3}
    claims: [...]            # see mixrl.experiments.claims; method / baseline are labels of `methods`
    notes: free text for the README (optional)

:func:`load_suite` reads and checks one (one-line :class:`ConfigError` on a mistake);
:func:`suite_names` lists the shipped ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from mixrl.config.compose import conf_dir, list_recipe_names
from mixrl.errors import ConfigError, did_you_mean
from mixrl.experiments.claims import Claim, parse_claim
from mixrl.options import read_user_text

_KEYS = {"name", "title", "seeds", "jobs", "methods", "overrides", "compare", "claims", "notes"}


@dataclass
class Suite:
    name: str
    title: str
    seeds: int
    jobs: int
    methods: dict[str, str]  # label -> recipe
    overrides: list[str] = field(default_factory=list)
    metric: str = "accuracy"
    target: float = 0.6
    claims: list[Claim] = field(default_factory=list)
    notes: str = ""
    path: Path | None = None

    @property
    def recipes(self) -> list[str]:
        return list(self.methods.values())

    def label(self, recipe: str) -> str:
        return next((k for k, v in self.methods.items() if v == recipe), recipe)


def suites_dir() -> Path:
    return conf_dir() / "suites"


def suite_names() -> list[str]:
    d = suites_dir()
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def load_suite(name_or_path: str | Path) -> Suite:
    """A shipped suite by name (``toy``, ``hard``) or a suite file path."""
    p = Path(name_or_path)
    if not (p.suffix in (".yaml", ".yml") and p.is_file()):
        p = suites_dir() / f"{name_or_path}.yaml"
        if not p.is_file():
            names = suite_names()
            raise ConfigError(f"unknown suite '{name_or_path}'{did_you_mean(str(name_or_path), names)}; "
                              f"suites: {', '.join(names) or 'none'} (or a path to a suite .yaml)")
    try:
        raw = yaml.safe_load(read_user_text(p, "suite")) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"suite {p}: not valid YAML ({str(e).splitlines()[0]})") from None
    where = f"suite {p.name}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping with methods, seeds, overrides, claims")
    unknown = set(raw) - _KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; a suite takes {', '.join(sorted(_KEYS))}")
    methods = raw.get("methods")
    if not isinstance(methods, dict) or not methods:
        raise ConfigError(f"{where}: 'methods' must map labels to recipe names (grpo: grpo/arith-tiny)")
    known = list_recipe_names()
    for label, recipe in methods.items():
        if recipe not in known:
            raise ConfigError(f"{where}: method '{label}' names unknown recipe '{recipe}'{did_you_mean(str(recipe), known)}")
    if len(set(methods.values())) != len(methods):
        raise ConfigError(f"{where}: two methods name the same recipe; each recipe once")
    seeds, jobs = raw.get("seeds", 3), raw.get("jobs", 2)
    for key, v in (("seeds", seeds), ("jobs", jobs)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"{where}: {key} must be an integer >= 1, got {v!r}")
    overrides = raw.get("overrides") or []
    if not isinstance(overrides, list) or not all(isinstance(o, str) and "=" in o for o in overrides):
        raise ConfigError(f"{where}: overrides must be a list of key=value strings")
    cmp = raw.get("compare") or {}
    if not isinstance(cmp, dict) or set(cmp) - {"metric", "target"}:
        raise ConfigError(f"{where}: compare takes metric and target")
    claims_raw = raw.get("claims") or []
    if not isinstance(claims_raw, list):
        raise ConfigError(f"{where}: claims must be a list")
    claims = [parse_claim(c, f"{where}, claim {i + 1}", aliases=methods) for i, c in enumerate(claims_raw)]
    return Suite(
        name=str(raw.get("name") or p.stem), title=str(raw.get("title") or p.stem), seeds=seeds, jobs=jobs,
        methods={str(k): str(v) for k, v in methods.items()}, overrides=list(overrides),
        metric=str(cmp.get("metric", "accuracy")), target=float(cmp.get("target", 0.6)), claims=claims,
        notes=str(raw.get("notes") or "").strip(), path=p,
    )
