"""Where the config groups and recipes are, and the table of `mixrl recipes list`, read from
the YAML files alone: no Hydra composition, no validation, no torch (the command must answer
in well under two seconds; composing every recipe took ~10 s).

:func:`recipe_summary` follows the one composition rule the table needs: a field is the
recipe's own value if it sets one, else that of the group option it selects
(``defaults: [override /model: tiny]``), else that of the option ``conf/config.yaml`` selects.
``tests/test_recipes_list.py`` checks the result against the fully composed configs.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from omegaconf import OmegaConf

from mixrl.errors import ConfigError


RECIPE_GROUP = "recipe"


def _package_root() -> Path:
    return Path(__file__).resolve().parent.parent


def conf_dir() -> Path:
    """The config groups: ``mixrl/_conf`` in an installed wheel, else the repo's ``conf/``."""
    for cand in (_package_root() / "_conf", _package_root().parent / "conf"):
        if (cand / "config.yaml").is_file():
            return cand
    raise ConfigError("mixrl's config groups were not found; reinstall mixrl (pip install -e .)")


def recipes_dir() -> Path:
    for cand in (_package_root() / "_recipes", _package_root().parent / "recipes"):
        if cand.is_dir():
            return cand
    raise ConfigError("mixrl's recipes were not found; reinstall mixrl (pip install -e .)")


def list_recipe_names() -> list[str]:
    base = recipes_dir()
    return sorted(p.relative_to(base).with_suffix("").as_posix() for p in base.rglob("*.yaml"))


def group_options(group: str) -> list[str]:
    """Options of a config group (file names without .yaml), sorted."""
    if group == RECIPE_GROUP:
        return list_recipe_names()
    base = conf_dir() / group
    return sorted(p.relative_to(base).with_suffix("").as_posix() for p in base.rglob("*.yaml"))


def _selected(defaults, override: bool) -> dict[str, str]:
    """``{group: option}`` of a defaults list (``override /group: x`` entries when ``override``)."""
    out = {}
    for entry in defaults or []:
        if not isinstance(entry, dict) and not OmegaConf.is_dict(entry):
            continue
        for key, value in dict(entry).items():
            key = str(key)
            if override:
                if key.startswith("override /") and "@" not in key:
                    out[key[len("override /"):]] = str(value)
            elif not key.startswith(("override ", "optional ")) and "@" not in key and value is not None:
                out[key] = str(value)
    return out


@lru_cache(maxsize=None)
def _load(path: Path):
    return OmegaConf.load(path)


def _field(recipe, options: dict[str, str], group: str, key: str):
    """``group.key`` of the recipe, else of its selected group option."""
    own = OmegaConf.select(recipe, f"{group}.{key}", default=None)
    if own is not None:
        return own
    path = conf_dir() / group / f"{options[group]}.yaml"
    return OmegaConf.select(_load(path), key, default=None) if path.is_file() else None


def recipe_summary(name: str) -> dict:
    """name, paper, algo, model, data, hardware, description and fidelity ledger (``ledger``: 'N/M differ',
    or '-' without one; :mod:`mixrl.config.ledger`) of a shipped recipe, from its file."""
    path = recipes_dir() / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown recipe '{name}'; `mixrl recipes list` shows them all")
    recipe = OmegaConf.load(path)
    options = _selected(_load(conf_dir() / "config.yaml").get("defaults"), override=False)
    options.update(_selected(recipe.get("defaults"), override=True))
    info = recipe.get("recipe_info") or {}
    return {
        "name": name,
        "paper": info.get("paper") or "-",
        "algo": _field(recipe, options, "algo", "name"),
        "model": _field(recipe, options, "model", "path"),
        "data": _field(recipe, options, "data", "source"),
        "hardware": info.get("hardware") or _field(recipe, options, "hardware", "name"),
        "description": info.get("description") or "",
        "ledger": _ledger_cell(info, name),
    }


def _ledger_cell(info, name: str) -> str:
    """'D/N differ' for a recipe whose ledger has N rows of which D differ from the authors' run; '-' without one."""
    from mixrl.config.ledger import ledger_of  # deferred: only recipes that carry a ledger pay for it

    ledger = ledger_of(info, f"recipe {name}: recipe_info.ledger") if info.get("ledger") is not None else None
    if ledger is None:
        return "-"
    c = ledger.counts()
    return f"{c['differs']}/{c['rows']} differ"
