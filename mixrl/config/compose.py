"""Compose a run configuration from the Hydra config groups, recipes and overrides.

``compose_config(overrides)`` is the only entry point the CLI needs. It checks every
override before Hydra sees it, so that a mistake produces one line that names the bad
key or option and the closest valid choices (``ConfigError``), then merges the result onto
the typed schema and validates components and cross-field rules.
"""

from __future__ import annotations

import copy

import importlib
import itertools
from functools import lru_cache

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.errors import OverrideParseException
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from mixrl.config import validate as validation
from mixrl.config.recipe_index import RECIPE_GROUP, conf_dir, group_options, list_recipe_names, recipes_dir
from mixrl.config.schema import GROUPS
from mixrl.config.value_overrides import (  # noqa: F401  (_prepare_value_overrides: re-exported, tests import it here)
    DROP,
    _check_group_override,
    _names_a_hydra_group,
    _override_key,
    _prepare_value_overrides,
)
from mixrl.errors import ConfigError, did_you_mean


#: short keys for the knobs users turn most: `algo.gamma=0.2`, `algo.mu.peak=0.3`
#: (the labels are those of the shipped algos: CHORD's `sft` term, LUFFY's `offpolicy` term)
ALIASES = {
    "algo.mu": "algo.coefs.mu",
    "algo.gamma": "algo.terms.offpolicy.gamma",
    "algo.token_weight": "algo.terms.sft.token_weight",
    "algo.beta": "algo.coefs.beta",  # KDRL's teacher-KL coefficient
}


def expand_aliases(overrides: list[str]) -> list[str]:
    """Rewrite short keys (``ALIASES``) in ``key=value`` overrides to their full path."""
    out = []
    for text in overrides:
        prefix = text[: len(text) - len(text.lstrip("+~"))]
        body = text[len(prefix):]
        key, sep, value = body.partition("=")
        for short, full in ALIASES.items():
            if key == short or key.startswith(short + "."):
                key = full + key[len(short):]
                break
        out.append(prefix + key + sep + value)
    return out


# --------------------------------------------------------------------------- locations
# conf_dir, recipes_dir, group_options and list_recipe_names live in mixrl.config.recipe_index (no torch on that path)


def load_recipe(name: str) -> DictConfig:
    path = recipes_dir() / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(
            f"unknown recipe '{name}'{did_you_mean(name, list_recipe_names())}; `mixrl recipes list` shows them all"
        )
    return OmegaConf.load(path)


@lru_cache(maxsize=1)
def _register_recipes() -> None:
    """Recipes live in ``recipes/`` beside the groups; expose them as the ``recipe`` group."""
    cs = ConfigStore.instance()
    for name in list_recipe_names():
        node = load_recipe(name)
        group, _, leaf = f"{RECIPE_GROUP}/{name}".rpartition("/")
        cs.store(group=group, name=leaf, node=node, package="_global_")


# --------------------------------------------------------------------------- overrides
def parse_overrides(overrides: list[str]):
    """Hydra's parse of each override; ConfigError (one line) for one that does not parse."""
    parser = OverridesParser.create()
    parsed = []
    for text in overrides:
        try:
            parsed.extend(parser.parse_overrides([text]))
        except OverrideParseException as e:
            first = str(e).strip().splitlines()[0]
            raise ConfigError(f"could not parse override '{text}': {first}; {_quoting_hint(text)}") from None
    return parsed


def _quoting_hint(text: str) -> str:
    """How to write ``text`` so Hydra parses it: a value holding braces, '=', a colon, quotes or
    spaces is quoted (single quotes inside, the whole argument in the shell's double quotes)."""
    key, eq, value = text.partition("=")
    if not eq or not key.strip():
        return "use key=value (Hydra syntax)"
    if value.startswith("[") and "=" in value:  # a list of overrides: each element quoted
        items = [v.strip().strip("'\"") for v in value.strip("[]").split(",") if v.strip()]
        quoted = ", ".join(f"'{v}'" for v in items)
        return (f"quote each element that holds '=' (Hydra syntax): \"{key}=[{quoted}]\" "
                "(the double quotes keep your shell from splitting it)")
    if any(c in value for c in "{}=:,()[] '\"\\$") and not (value[:1] in "'\"" and value[-1:] == value[:1] and len(value) > 1):
        inner = value.replace("'", "\\'")
        return (f"a value with braces, '=', ':', ',', brackets, quotes or spaces must be quoted (Hydra syntax): "
                f"\"{key}='{inner}'\" (the double quotes keep your shell from splitting it)")
    return "use key=value (Hydra syntax)"


def expand_sweeps(overrides: list[str]) -> list[list[str]]:
    """Cartesian product of sweep overrides (``seed=1,2,3``, ``x=range(1,4)``) -> one list per job."""
    choices: list[list[str]] = []
    for ov in parse_overrides(expand_aliases(list(overrides))):
        key = ov.input_line.split("=", 1)[0]
        if ov.is_sweep_override():
            choices.append([f"{key}={v}" for v in ov.sweep_string_iterator()])
        else:
            choices.append([ov.input_line])
    return [list(job) for job in itertools.product(*choices)] if choices else [[]]


def _config_files_stamp() -> tuple:
    """What the Hydra composition reads: every file under conf/ and recipes/ (path, size, mtime)."""
    stamp = []
    for root in (conf_dir(), recipes_dir()):
        for path in sorted(root.rglob("*.yaml")):
            st = path.stat()
            stamp.append((str(path), st.st_size, st.st_mtime_ns))
    return tuple(stamp)


#: (group overrides, the config files' stamp) -> the composed config (before validation);
#: Hydra's compose costs ~0.2 s and a command, a test or the methods page composes the same configs
#: again and again. A hit returns a copy; a changed or added config file changes the stamp.
_RAW_CACHE: dict[tuple, DictConfig] = {}
_RAW_CACHE_MAX = 256


class _SharedStore:
    """Hydra's ConfigStore (where the recipes are registered), seen through an object that a
    deep copy returns as is. Each Hydra compose deep-copies its config repository, and with it
    the store its structured-config source holds: every recipe and Hydra's own schema, half of
    the compose's time. The store needs no copy: ``ConfigStore.load`` returns a copy of the node
    it loads, and a repository whose sources Hydra re-initialises holds the store itself."""

    def __init__(self, store: ConfigStore):
        self._store = store

    def __getattr__(self, name):
        return getattr(self._store, name)

    def __deepcopy__(self, memo):
        return self


def _share_config_store() -> None:
    """Give the structured-config source of the Hydra just initialised a :class:`_SharedStore`
    (nothing else changes; a Hydra without that source is left as it is)."""
    loader = getattr(GlobalHydra.instance().hydra, "config_loader", None)
    for source in getattr(getattr(loader, "repository", None), "sources", []):
        if isinstance(getattr(source, "store", None), ConfigStore):
            source.store = _SharedStore(source.store)


def _hydra_compose(overrides: list[str]) -> DictConfig:
    _register_recipes()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        _share_config_store()
        return hydra_compose(config_name="config", overrides=overrides)


def _compose_raw(overrides: list[str]) -> DictConfig:
    """Hydra's composition of ``overrides`` (a copy, the caller's own). Group overrides are
    composed by Hydra, once per distinct list (``_RAW_CACHE``); value overrides are then applied
    to a copy by Hydra's own override step (``ConfigLoaderImpl._apply_overrides_to_config``, what
    Hydra's compose runs after the defaults list, on the same struct-mode config), unless one
    names a config group Hydra would treat as a group (``benchmarks=...``): those compose in full.
    The result equals Hydra's compose of all of ``overrides`` (checked on every recipe, group
    option and the tests' override lists when this was written)."""
    groups = [o for o in overrides if _override_key(o).split("@", 1)[0] in (*GROUPS, RECIPE_GROUP)]
    values = [o for o in overrides if o not in groups]
    if groups + values != list(overrides) or any(_names_a_hydra_group(_override_key(o)) for o in values):
        return _hydra_compose(list(overrides))  # an order Hydra might read differently, or a group: in full
    key = (tuple(groups), _config_files_stamp())
    hit = _RAW_CACHE.get(key)
    if hit is None:
        hit = _hydra_compose(groups)
        if len(_RAW_CACHE) >= _RAW_CACHE_MAX:
            _RAW_CACHE.pop(next(iter(_RAW_CACHE)))
        _RAW_CACHE[key] = hit
    cfg = copy.deepcopy(hit)
    if values:
        OmegaConf.set_struct(cfg, True)
        ConfigLoaderImpl._apply_overrides_to_config(OverridesParser.create().parse_overrides(values), cfg)
    return cfg


def compose_config(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """Compose, check and validate a run config. Raises ConfigError with one line."""
    overrides = expand_aliases(list(overrides))
    parsed = parse_overrides(overrides)
    group_ovs, value_ovs = [], []
    for ov in parsed:
        if ov.is_sweep_override():
            raise ConfigError(f"'{ov.input_line}' is a sweep; add -m (multirun) to run one job per value")
        key = ov.key_or_group
        if key in GROUPS or key == RECIPE_GROUP:
            _check_group_override(key, ov.get_value_element_as_str())
            group_ovs.append(ov.input_line)
        else:
            value_ovs.append(ov)

    try:
        base = _compose_raw(group_ovs)
    except ConfigError:
        raise
    except Exception as e:  # a broken recipe or group file
        raise ConfigError(f"could not compose the config: {str(e).strip().splitlines()[0]}") from None
    import_plugins(list(base.get("plugins") or []) + [p for ov in value_ovs if ov.key_or_group == "plugins"
                                                      for p in (ov.value() or [])])

    last = {ov.key_or_group: i for i, ov in enumerate(value_ovs) if not ov.is_delete()}
    value_ovs = [ov for i, ov in enumerate(value_ovs) if ov.is_delete() or last[ov.key_or_group] == i]  # last wins
    prepared = _prepare_value_overrides(base, value_ovs)
    drops = [o[len(DROP):] for o in prepared if o.startswith(DROP)]
    final_ovs = group_ovs + [o for o in prepared if not o.startswith(DROP)]
    try:
        raw = base if final_ovs == group_ovs else _compose_raw(final_ovs)  # nothing to apply: no second compose
    except Exception as e:
        raise ConfigError(f"could not apply overrides: {str(e).strip().splitlines()[0]}") from None
    for key in drops:
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(raw, parent)
        if isinstance(node, DictConfig) and leaf in node:
            with open_dict(node):
                del node[leaf]
    return validate(raw)


def import_plugins(modules: list) -> None:
    """Import the ``plugins`` modules (a user's own sources, injections, terms, losses...):
    importing them registers their components before the config is checked."""
    for name in modules:
        try:
            importlib.import_module(str(name))
        except Exception as e:  # ImportError, or the plugin's own error
            raise ConfigError(
                f"plugins: could not import '{name}' ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                "put its folder on PYTHONPATH or fix the module"
            ) from None


def compose_stages(cfg: DictConfig, overrides: list[str]) -> list[tuple[str, DictConfig]]:
    """The configs of a staged algo (``algo.stages``, e.g. sft_then_rl), each composed as
    ``algo=<stage.algo>`` + the command line's non-``algo`` overrides + the stage's overrides
    (+ ``trainer.max_steps=<stage.max_steps>`` when set). A plain algo is one stage."""
    stages = cfg.algo.get("stages") or []
    if not stages:
        return [("main", cfg)]
    keep = []
    for ov in parse_overrides(list(overrides)):
        key = ov.key_or_group
        if key == "algo" or key.startswith("algo."):
            continue  # algo settings of a stage come from its own algo and overrides
        keep.append(ov.input_line)
    out = []
    for i, st in enumerate(stages):
        if "algo" not in st or "name" not in st:
            raise ConfigError(f"algo.stages[{i}] needs a name and an algo (e.g. {{name: sft, algo: sft}})")
        if st.algo in ("sft_then_rl",) or st.algo == cfg.algo.name:
            raise ConfigError(f"algo.stages[{i}].algo={st.algo} would nest stages; name a single-stage algo")
        _check_group_override("algo", st.algo)
        ovs = [f"algo={st.algo}", *keep, *list(st.get("overrides") or [])]
        if st.get("max_steps") is not None:
            ovs.append(f"trainer.max_steps={int(st.max_steps)}")
        try:
            stage_cfg = compose_config(ovs)
        except ConfigError as e:
            raise ConfigError(f"stage '{st.name}' (algo.stages[{i}]): {e}") from None
        if stage_cfg.algo.get("stages"):
            raise ConfigError(f"algo.stages[{i}].algo={st.algo} has stages itself; stages cannot nest")
        out.append((str(st.name), stage_cfg))
    return out


_parse = parse_overrides  # the name trainer.state.resume and mixrl eval import


# --------------------------------------------------------------------------- validation
def validate(raw: DictConfig) -> DictConfig:
    """:func:`mixrl.config.validate.validate_config`, under the name ``mixrl eval`` and
    ``resume=`` import (looked up at each call, so the one validation is the one that runs)."""
    return validation.validate_config(raw)


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)


__all__ = [
    "compose_config",
    "expand_sweeps",
    "group_options",
    "list_recipe_names",
    "load_recipe",
    "conf_dir",
    "recipes_dir",
    "to_yaml",
    "ListConfig",
]
