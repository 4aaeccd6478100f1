"""The one validation of a run config: :func:`validate_config`.

Every command reaches it through the same call: ``mixrl train``, ``explain``, ``plan``,
``config show`` and ``eval`` compose their config with
:func:`mixrl.config.compose.compose_config`, which ends with it; ``train resume=RUN_DIR`` and
``mixrl eval RUN_DIR`` validate the run's saved ``config.yaml`` with it
(:func:`mixrl.config.compose.validate`). It runs once per composed config, before anything is
loaded or created, and checks only the config:

1. structure and types (the typed schema, :mod:`mixrl.config.schema`);
2. ranges: the run's settings (:data:`mixrl.config.checks.SETTING_BOUNDS`), no NaN or
   infinite number, and every component section (loss, term, token weight, aggregation,
   advantage, schedule, controller, injection, source) against its registration, whose
   ``bounds=`` sit next to its formula (:mod:`mixrl.config.components`);
3. cross-field rules and the objective (:mod:`mixrl.config.rules`, :mod:`mixrl.config.objective`);
4. the hardware group (:mod:`mixrl.config.hardware`) and values no run can use;
5. the reward functions, built without a model;
6. the process count against a launcher's ``WORLD_SIZE``.

Two kinds of checks stay outside, each where its input first exists, still before anything
is created: what this machine lacks (CUDA, packages, a writable ``run_dir``:
:func:`mixrl.config.checks.check_environment`, ``mixrl train`` only, so that a GPU recipe can be
explained and planned anywhere), and the data checks that need the tokenizer (characters,
prompt lengths, chat template, rewards on the first rows:
:func:`mixrl.config.checks.check_training_data`, run where the data is loaded, before the model).
"""

from __future__ import annotations

import dataclasses
import re
from functools import lru_cache
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from mixrl.config.checks import check_settings, validate_run
from mixrl.config.components import validate_components
from mixrl.config.critic import check_critic
from mixrl.config.ref_reset import check_ref_reset
from mixrl.sources.nash_md import check_nash_md
from mixrl.sources.seppo import check_seppo
from mixrl.config.hardware import check_world_size, validate_hardware
from mixrl.config.rules import validate_rules
from mixrl.config.schema import RunConfig
from mixrl.errors import ConfigError, did_you_mean
from mixrl.rewards import build_reward


def validate_config(raw: DictConfig) -> DictConfig:
    """THE validation of a config (see the module docstring): merge ``raw`` onto the typed
    schema, then check, in order, the run's settings, every component section (names,
    parameters, types, declared ranges), the cross-field rules and the objective, the
    hardware group, the values no run can use, the reward functions and the world size.
    Returns the typed config; raises ConfigError (one line) at the first problem."""
    schema = typed_schema()
    try:
        cfg = OmegaConf.merge(schema, raw)
        OmegaConf.resolve(cfg)  # surface interpolation errors here, with their key
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or _section_of(str(e)) or "?"
        msg = str(e).strip().splitlines()[0]
        if "nterpolation" in type(e).__name__ or "nterpolation" in msg:
            raise ConfigError(f"bad interpolation in '{_bad_interpolation_key(raw) or key}': {msg}") from None
        if "not in struct" in msg or "Key '" in msg and "not in" in msg:
            parent, _, leaf = key.rpartition(".")
            siblings = flat_keys(OmegaConf.select(schema, parent) if parent else schema)
            raise ConfigError(f"unknown key '{key}'{did_you_mean(leaf, siblings)}") from None
        raise ConfigError(f"wrong type for '{key}': {msg}") from None
    try:
        check_settings(cfg)
        validate_components(cfg)
        validate_rules(cfg)
        check_critic(cfg)
        check_ref_reset(cfg)
        check_nash_md(cfg)
        check_seppo(cfg)
        validate_hardware(cfg)
        validate_run(cfg)
        _validate_env(cfg)
        _validate_token_credit(cfg)
        _validate_rewards(cfg)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        raise ConfigError(f"invalid value for '{key}': {str(e).strip().splitlines()[0]}") from None
    check_world_size(cfg)
    OmegaConf.set_readonly(cfg, False)
    return cfg


@lru_cache(maxsize=1)
def typed_schema() -> DictConfig:
    """``OmegaConf.structured(RunConfig)``, built once (~40 ms each time) and shared: read it or
    merge onto it (``OmegaConf.merge`` merges onto a copy of its first argument), never change it."""
    return OmegaConf.structured(RunConfig)


def _bad_interpolation_key(cfg: DictConfig) -> str | None:
    """The first key whose interpolation does not resolve."""
    for key in flat_keys(cfg):
        try:
            OmegaConf.select(cfg, key, throw_on_resolution_failure=True)
        except OmegaConfBaseException:
            node = OmegaConf.select(cfg, key, throw_on_resolution_failure=False)
            if not isinstance(node, DictConfig):
                return key
    return None


def _section_of(message: str) -> str | None:
    """Name the config section whose dataclass appears in an OmegaConf message."""
    m = re.search(r"(\w+Config)\b", message)
    if not m:
        return None
    for f in dataclasses.fields(RunConfig):
        if getattr(f.type, "__name__", str(f.type)) == m.group(1) or str(f.type) == m.group(1):
            return f.name
    return None


#: Injections that work with env=tools: appended expert rows (CHORD's), expert rows in the groups
#: (LUFFY's, SFT's; kept out of TRL's tool loop, mixrl.trainer.tool_rows), their tool turns
#: marked provenance ``environment`` from the chat template's turn marks.
TOOL_INJECTIONS = ("append_rows", "group_replace", "replace_all")


def _validate_token_credit(cfg: DictConfig) -> None:
    """``algo.advantage.name=capo`` (per-token advantages from dense rewards): no row filter and no
    injection that adds rows after the advantages (both read or write one advantage per row)."""
    if cfg.algo.advantage.name != "capo":
        return
    from mixrl.config.sampler import sampler_active  # deferred: read only for algo.advantage.name=capo (the sampler config imports torch)
    from mixrl.sources import INJECTIONS  # deferred: read only for algo.advantage.name=capo (the sources import torch)

    if sampler_active(cfg):
        raise ConfigError("algo.advantage.name=capo with a sampler: its row filters read one advantage per row, capo gives one "
                          "per token; use sampler=none or algo.advantage.name=grpo")
    inject = cfg.algo.inject.get("name", "none")
    if INJECTIONS.get(inject).appends_rows_after_advantages:
        raise ConfigError(f"algo.advantage.name=capo with algo.inject.name={inject}: that injection adds rows after the "
                          "advantages, with one advantage per row; use an injection that writes rows before scoring (group_replace)")


def _validate_env(cfg: DictConfig) -> None:
    """``env``: a known environment, and for ``tools`` known tool names and a positive round limit;
    a turn-level advantage only with an environment that gives turn rewards."""
    env = cfg.env
    turn_level = cfg.algo.advantage.name if cfg.algo.advantage.name in ("mt_grpo", "uis1") else None
    if turn_level and env.name in ("single", "tools"):
        raise ConfigError(f"algo.advantage.name={turn_level} with env={env.name}: it needs each turn's reward; "
                          "use a stateful environment (env=arith_retry, env=arith_steps) or another advantage (algo.advantage.name=grpo)")
    if turn_level and cfg.get("sampler") is not None and cfg.sampler.get("rows"):
        raise ConfigError(f"algo.advantage.name={turn_level} with sampler.rows: the row filters read one advantage per row, "
                          f"{turn_level} gives one per token; drop sampler.rows or use algo.advantage.name=grpo")
    if env.name not in ("single", "tools"):
        _validate_episodes(cfg)
        return
    if (cfg.algo.get("episode") or {}).get("name", "none") != "none":  # an episode injection without an environment
        from mixrl.envs.patching import validate_episode_injection  # deferred: the environments load only when asked

        validate_episode_injection(cfg, str(env.name), None)
    if env.name != "tools":
        return
    if not env.tools:
        raise ConfigError("env=tools with env.tools=[]: name at least one tool, e.g. env.tools=[calculator]")
    if env.max_tool_calls is not None and int(env.max_tool_calls) < 1:
        raise ConfigError(f"env.max_tool_calls={env.max_tool_calls} must be >= 1 (or null: until the completion budget)")
    from mixrl.tools.builtin import resolve_tools  # deferred: the tools' module (and its sandbox) loads only for env=tools

    resolve_tools(list(env.tools))  # an unknown name: one line naming the tools
    inject = cfg.algo.get("inject")
    name = None if inject is None else inject.get("name")
    if name not in (None, "none", *TOOL_INJECTIONS):
        # the others write rows TRL's tool loop would go on from (prefixes, hints, refills, replays) or pair
        # rows whose turns are not marked; appended expert rows get their tool turns masked (mixrl.sources.inject)
        raise ConfigError(f"env=tools with algo.inject={name} is not supported; with tools an expert trajectory enters "
                          f"in the groups or appended ({', '.join(TOOL_INJECTIONS)}: algo=luffy, sft, chord), or use env=single")


def _validate_episodes(cfg: DictConfig) -> None:
    """A stateful environment (``mixrl.envs``): a registered name, ``env.max_turns >= 1``, no tools,
    no expert rows in the batch (their observations would not be marked)."""
    from mixrl.envs import resolve_env  # deferred: the environments load only for an episodic env
    from mixrl.envs.patching import validate_episode_injection  # deferred: as the environments

    env = cfg.env
    factory = resolve_env(str(env.name))  # an unknown name: one line naming the environments
    validate_episode_injection(cfg, str(env.name), factory)  # one the environment cannot take: one line
    if env.get("max_turns") is None or int(env.max_turns) < 1:
        raise ConfigError(f"env={env.name} with env.max_turns={env.get('max_turns')}: set env.max_turns >= 1 (actions per episode)")
    if env.tools:
        raise ConfigError(f"env={env.name} with env.tools={list(env.tools)}: an environment's episodes take no tools; use env=tools for tool calls")
    inject = cfg.algo.get("inject")
    if inject is not None and inject.get("name") not in (None, "none"):
        raise ConfigError(f"env={env.name} with algo.inject={inject.get('name')} (expert rows in the batch) is not supported "
                          "yet; use algo=grpo (or another on-policy method) with an environment")
    if cfg.hardware.get("vllm_async", False):
        raise ConfigError(f"env={env.name} with hardware.vllm_async=true is not supported yet; set hardware.vllm_async=false")


def _validate_rewards(cfg: DictConfig) -> None:
    """Build each reward function now (cheap, no model), so a bad name, path or
    parameter fails before anything is loaded."""
    specs = [(cfg.reward.name, cfg.reward.params)] + [(x.get("name"), x.get("params") or {}) for x in cfg.reward.extra]
    for name, params in specs:
        build_reward(str(name), **(OmegaConf.to_container(params) if isinstance(params, DictConfig) else dict(params)))


def flat_keys(node: Any, prefix: str = "", *, lists: bool = False) -> list[str]:
    """Every key path of ``node`` (``trainer``, ``trainer.max_steps``, ...), depth first.
    ``lists``: also the elements of lists and what they hold, by index (``algo.stages.1``,
    ``algo.stages.1.overrides``), the keys an override may set as Hydra and OmegaConf do."""
    keys = []
    if isinstance(node, DictConfig):
        for k in node.keys():
            full = f"{prefix}{k}"
            keys.append(full)
            keys.extend(flat_keys(node._get_node(k), full + ".", lists=lists))
    elif lists and isinstance(node, ListConfig):
        for i in range(len(node)):
            full = f"{prefix}{i}"
            keys.append(full)
            keys.extend(flat_keys(node._get_node(i), full + ".", lists=True))
    return keys
