"""Key=value overrides checked against the composed base before Hydra applies them
(:func:`mixrl.config.compose.compose_config`): a group named as a key, a list index out of range, a
reward's or a scorer's parameter, each refused in one line naming the fix."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from mixrl.config import validate as validation
from mixrl.config.components import component_kind, component_param_names
from mixrl.config.recipe_index import RECIPE_GROUP, conf_dir, group_options
from mixrl.config.validate import flat_keys
from mixrl.errors import ConfigError, did_you_mean
from mixrl.rewards import REWARDS, reward_params
from mixrl.rewards.process import SCORERS, scorer_param_names


DROP = "\0drop:"  # marks a leftover component key to remove after composition (its value is null)


def _override_key(text: str) -> str:
    return text.lstrip("+~").split("=", 1)[0]


def _names_a_hydra_group(key: str) -> bool:
    """Whether Hydra would read an override of ``key`` as a config group's (a folder of conf/,
    Hydra's own groups, a recipe path)."""
    return key == "hydra" or "/" in key or "@" in key or (conf_dir() / key).is_dir()


def _check_group_override(group: str, value: str) -> None:
    options = group_options(group)
    if value not in options and value not in ("null", "None"):
        what = "recipe" if group == RECIPE_GROUP else f"{group} option"
        raise ConfigError(
            f"unknown {what} '{value}' for {group}={value}{did_you_mean(value, options)}; "
            f"choices: {', '.join(options)}"
        )


def _dropped_keys(base: DictConfig, value_overrides: list, new_names: dict[str, str]) -> list[str]:
    """The overrides that drop what a switched component or scorer no longer takes."""
    out: list[str] = []
    # switching a component (algo.loss.name=sft) drops the parameters the group file set
    # for the previous one that the new one does not have
    for parent, name in new_names.items():
        if component_kind(parent) is None:
            continue
        params = component_param_names(parent, name)
        node = OmegaConf.select(base, parent)
        if params is None or not isinstance(node, DictConfig):
            continue
        set_here = {ov.key_or_group.rpartition(".")[2] for ov in value_overrides if ov.key_or_group.rpartition(".")[0] == parent}
        for key in node.keys():
            if key != "name" and key not in params and key not in set_here:
                # Hydra cannot delete a key whose value is null: those are dropped after composition
                out.append(f"~{parent}.{key}" if node[key] is not None else f"{DROP}{parent}.{key}")
    # switching a reward's scorer (reward.params.scorer=model) drops the scorer_params the old scorer took
    for ov in value_overrides:
        reward_path, _, leaf = ov.key_or_group.rpartition(".params.")
        if leaf != "scorer" or not _is_reward_path(reward_path):
            continue
        node = OmegaConf.select(base, f"{reward_path}.params.scorer_params")
        params = _scorer_param_names(ov.get_value_element_as_str())
        if not isinstance(node, DictConfig) or params is None:
            continue
        set_here = {o.key_or_group.rpartition(".")[2] for o in value_overrides
                    if o.key_or_group.rpartition(".")[0] == f"{reward_path}.params.scorer_params"}
        for key in node.keys():
            if key not in params and key not in set_here:
                out.append(f"~{reward_path}.params.scorer_params.{key}" if node[key] is not None
                           else f"{DROP}{reward_path}.params.scorer_params.{key}")
    return out


def _prepare_value_overrides(base: DictConfig, value_overrides: list) -> list[str]:
    """Check each key exists; add '+' for parameters of a component not yet listed."""
    if not value_overrides:
        return []
    known = set(flat_keys(base, lists=True))  # list elements by index too (algo.stages.1.overrides), as Hydra sets them
    try:
        schema_keys = set(flat_keys(OmegaConf.merge(validation.typed_schema(), base)))
    except OmegaConfBaseException:
        schema_keys = known  # a type error in a group file; validate() reports it
    # a component's name may itself be overridden in the same command
    new_names = {ov.key_or_group.rsplit(".", 1)[0]: ov.get_value_element_as_str()
                 for ov in value_overrides if ov.key_or_group.endswith(".name")}
    out = _dropped_keys(base, value_overrides, new_names)
    for ov in value_overrides:
        key, line = ov.key_or_group, ov.input_line
        if ov.is_add() or ov.is_force_add() or ov.is_delete():
            out.append(line)
            continue
        if key in known:
            out.append(line)
            continue
        scorer_key = _scorer_param_key(base, key, value_overrides)
        if scorer_key is not None:
            out.append("+" + line)
            continue
        if key in schema_keys:  # a schema key the group files leave at its default
            out.append("+" + line)
            continue
        parent, _, leaf = key.rpartition(".")
        if parent == "reward.params" or (parent.startswith("reward.extra.") and parent.endswith(".params")):
            name = OmegaConf.select(base, parent.rsplit(".", 1)[0] + ".name")
            params = _reward_param_names(name)
            if params is not None and leaf in params:
                out.append("+" + line)
                continue
            if params is not None:
                raise ConfigError(
                    f"unknown key '{key}': reward '{name}' has no parameter '{leaf}'"
                    f"{did_you_mean(leaf, params)}; its parameters: {', '.join(sorted(params)) or 'none'}"
                )
        if component_kind(parent) is not None:
            name = new_names.get(parent) or OmegaConf.select(base, f"{parent}.name")
            params = component_param_names(parent, name)
            if leaf == "name" or (params is not None and leaf in params):
                out.append("+" + line)
                continue
            if params is not None:
                raise ConfigError(
                    f"unknown key '{key}': {component_kind(parent)} '{name}' has no parameter '{leaf}'"
                    f"{did_you_mean(leaf, params)}; its parameters: {', '.join(sorted(params)) or 'none'}"
                )
        listed = _list_index_problem(base, key)
        if listed:
            raise ConfigError(f"unknown key '{key}': {listed}")
        siblings = [k for k in schema_keys | known if k.rpartition(".")[0] == parent]
        hint = did_you_mean(key, siblings) or did_you_mean(key, schema_keys)
        raise ConfigError(f"unknown key '{key}'{hint}; `mixrl config show` lists every key")
    return out


def _list_index_problem(base: DictConfig, key: str) -> str | None:
    """When ``key`` steps into a list of ``base`` by an index it does not have (or not by an
    index), what the list holds, in words; else None."""
    parts = key.split(".")
    for i in range(1, len(parts)):
        node = OmegaConf.select(base, ".".join(parts[:i]), throw_on_missing=False)
        if not OmegaConf.is_list(node):
            continue
        where, index = ".".join(parts[:i]), parts[i]
        if not index.isdigit() or int(index) >= len(node):
            return (f"{where} is a list of {len(node)} entries, indexed 0..{len(node) - 1} ({where}.0...); "
                    f"set an entry by its index or the whole list ({where}=[...])")
        return None
    return None


def _is_reward_path(path: str) -> bool:
    """``reward`` or ``reward.extra.<i>``: a node with a reward's ``name`` and ``params``."""
    return path == "reward" or (path.startswith("reward.extra.") and path.count(".") == 2)


def _scorer_param_names(scorer: str) -> set[str] | None:
    """The parameters a scorer (``reward=process``'s ``scorer``: judge, model or genprm) takes."""
    return scorer_param_names(scorer) if scorer in SCORERS else _reward_param_names(scorer)


def _scorer_param_key(base: DictConfig, key: str, value_overrides: list) -> bool | None:
    """True when ``key`` is ``<reward>.params.scorer_params.<leaf>`` and the reward's scorer (as
    overridden in the same command, else as composed) takes ``leaf``; ConfigError naming the
    scorer's parameters when it does not; None for any other key."""
    head, sep, leaf = key.rpartition(".params.scorer_params.")
    if not sep or "." in leaf or not _is_reward_path(head):
        return None
    scorer = next((ov.get_value_element_as_str() for ov in value_overrides if ov.key_or_group == f"{head}.params.scorer"),
                  OmegaConf.select(base, f"{head}.params.scorer"))
    params = _scorer_param_names(scorer) if isinstance(scorer, str) else None
    if params is None:
        return None
    if leaf not in params:
        raise ConfigError(f"unknown key '{key}': the {scorer} scorer has no parameter '{leaf}'{did_you_mean(leaf, params)}; "
                          f"its parameters: {', '.join(sorted(params))}")
    return True


def _reward_param_names(name) -> set[str] | None:
    """Parameters of a registered reward factory (None for a dotted path or unknown name)."""
    return set(reward_params(REWARDS[name])) if isinstance(name, str) and name in REWARDS else None
