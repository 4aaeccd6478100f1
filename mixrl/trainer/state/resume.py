"""Resuming a run from its last checkpoint (``mixrl train resume=RUN_DIR``).

A run directory holds Hugging Face Trainer checkpoints under ``trainer/checkpoint-<step>``
(model, optimizer, scheduler, RNG states, trainer state and mixrl's controller state). A
resumed run:

* uses the run directory's own ``config.yaml``; command-line overrides may only change
  keys that cannot change what is trained (:data:`RESUME_SAFE`), e.g. ``trainer.max_steps``
  to extend a run or ``logger.progress``;
* continues from the newest checkpoint with Hugging Face's ``resume_from_checkpoint``
  (same data order, optimizer, scheduler and RNG state, step numbering);
* drops rows of ``metrics.jsonl`` / ``eval.jsonl`` logged after that checkpoint (they are
  re-run), so both files continue instead of restarting or repeating steps.

This module decides whether a resume may go on (the run's config against the command line)
and reads mixrl's counters back from a checkpoint; finding the checkpoint, checking it is readable
and trimming the logs are run-directory bookkeeping (:mod:`mixrl.trainer.state.rundir`).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from mixrl.errors import ConfigError
from mixrl.config.compose import _parse, compose_config, expand_aliases, import_plugins, validate
from mixrl.config.schema import GROUPS
from mixrl.config.trust import require_trust

#: keys a resumed run may override (prefix match): none of them changes the trajectory
RESUME_SAFE = (
    "trainer.max_steps",
    "trainer.save_steps",
    "trainer.save_total_limit",
    "trainer.eval_every",
    "trainer.eval_batch_size",
    "logger.",
    "hardware.torch_threads",
    "reward.timeout_s",
    "trainer.max_abs_advantage",  # raised to continue a run the magnitude guard stopped
    "trainer.max_abs_loss",
    # where the machines of a multi-node run meet, and which one this is: a requeued job lands on other nodes
    "hardware.machine_rank",
    "hardware.main_process_ip",
    "hardware.main_process_port",
    "hardware.vllm_server_host",
    "resume",
)

#: keys of a run's config that say where it is, not what it trains
_LOCATION_KEYS = ("run_dir", "resume")


def _is_safe(key: str) -> bool:
    return any(key == s.rstrip(".") or key.startswith(s) for s in RESUME_SAFE)


def same_value(a, b) -> bool:
    """Equality of two config values as a resume compares them: numbers by value (``64``,
    ``64.0`` and ``6.4e1`` are equal; ``1e-6`` equals ``0.000001``), booleans only with
    booleans (``true`` is not ``1``), null only with null, strings exactly, lists and
    mappings element by element."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b) or (a != a and b != b)  # NaN equals NaN here
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def first_difference(new, old, prefix: str = "") -> tuple[str, object, object] | None:
    """The first key (dotted, below ``prefix``) whose value differs between two plain
    configs, as ``(key, new value, old value)``, skipping the keys a resume may change
    (:data:`RESUME_SAFE`) and the run's location; None when every compared value is
    :func:`same_value`."""
    if isinstance(new, dict) and isinstance(old, dict):
        for k in list(new) + [k for k in old if k not in new]:
            key = f"{prefix}.{k}" if prefix else str(k)
            if _is_safe(key) or key in _LOCATION_KEYS:
                continue
            if k not in new or k not in old:
                return key, new.get(k), old.get(k)
            found = first_difference(new[k], old[k], key)
            if found:
                return found
        return None
    return None if same_value(new, old) else (prefix, new, old)


def _plain(cfg: DictConfig, key: str):
    """The plain (resolved) value of ``key`` in ``cfg`` (the whole config for ``""``)."""
    node = OmegaConf.select(cfg, key) if key else cfg
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, (DictConfig, ListConfig)) else node


def _value_difference(saved: DictConfig, ov, theirs) -> tuple[str, object, object] | None:
    """Apply one ``key=value`` override to a copy of the run's saved config, validate it (as
    composition would) and compare under its key; a value that does not validate on that run
    is a change."""
    key = ov.key_or_group
    trial = copy.deepcopy(saved)
    try:
        OmegaConf.update(trial, key, ov.value(), merge=False, force_add=True)
        mine = _plain(validate(trial), key)
    except ConfigError:
        return key, ov.value(), theirs
    return first_difference(mine, theirs, key)


def _short(value) -> str:
    text = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def resume_config(run_dir: str, overrides: list[str], composed: DictConfig | None = None, *,
                  trust_run_code: bool = False) -> DictConfig:
    """The config to resume ``run_dir`` with: its ``config.yaml`` plus the overrides that may change.

    An override of a key in :data:`RESUME_SAFE` is applied. Any other override is accepted
    (and changes nothing) only when it gives the run's own value, compared after composition
    by :func:`same_value`: a ``key=value`` override is applied to the run's config and
    validated, then compared under its key; ``group=option`` and ``recipe=NAME`` are composed
    with the whole command line as for a new run (``composed``, composed here when not given)
    and compared over that section (a recipe: the whole config). The last override of a key
    wins, as in composition. Reads only: a refused resume changes nothing (the CLI then checks
    :func:`mixrl.trainer.state.rundir.resume_checkpoint`, still before anything is written).

    Raises ``ConfigError`` (one line) when the directory is not a run, its config does not
    load back, an override would change the objective, data or model of the run, or the run's
    config names code (plugins, a reward file or module, remote model code) and
    ``trust_run_code`` is not set (:mod:`mixrl.config.trust`): nothing of it is imported before
    that check.
    """
    path = Path(run_dir)
    cfg_file = path / "config.yaml"
    if not cfg_file.is_file():
        raise ConfigError(f"resume={run_dir}: no config.yaml there, so it is not a mixrl run directory; "
                          "give the run directory printed by `mixrl train`")
    try:
        saved = OmegaConf.load(cfg_file)
    except Exception as e:  # not YAML
        raise ConfigError(f"resume={run_dir}: its config.yaml cannot be read ({type(e).__name__}); "
                          "it is not a config written by mixrl") from None
    if not isinstance(saved, DictConfig):
        raise ConfigError(f"resume={run_dir}: its config.yaml is not a mapping; it is not a config written by mixrl")
    saved.resume = str(path)
    saved.run_dir = str(path)
    require_trust(saved, path, trusted=trust_run_code, what=f"resume={run_dir}")
    import_plugins(list(saved.get("plugins") or []))  # the run's own components, before validation
    try:
        run_cfg = validate(saved)
    except ConfigError as e:
        raise ConfigError(f"resume={run_dir}: its config.yaml does not validate: {e}") from None
    parsed = {}  # key -> (the user's text, the parsed override); the last one of a key wins, as in composition
    for text in overrides:
        for ov in _parse(expand_aliases([text])):
            if ov.key_or_group != "resume":
                parsed.pop(ov.key_or_group, None)
                parsed[ov.key_or_group] = (text, ov)
    parsed = list(parsed.values())
    # the most specific first, so a refusal names the override that changes the value
    changing = sorted(((t, ov) for t, ov in parsed if not _is_safe(ov.key_or_group)),
                      key=lambda x: (x[1].key_or_group == "recipe", x[1].key_or_group in GROUPS))
    for text, ov in changing:
        key = ov.key_or_group
        theirs = _plain(run_cfg, "" if key == "recipe" else key)
        if key in GROUPS or key == "recipe":  # an option's (or a recipe's) values, composed as for a new run
            if composed is None:
                composed = compose_config([t for t, _ in parsed])
            scope = "" if key == "recipe" else key  # a recipe may set any key: compare everything
            found = first_difference(_plain(composed, scope), theirs, scope)
        elif ov.is_delete():
            found = (key, "(deleted)", theirs)
        else:  # a value: applied to the run's own config
            found = _value_difference(saved, ov, theirs)
        if found:
            where, mine, theirs = found
            what = "group" if key in GROUPS else "recipe" if key == "recipe" else "value"
            raise ConfigError(
                f"resume={run_dir} uses that run's config.yaml; '{text}' would change what is trained "
                f"({where or key} is {_short(theirs)} in that run, {_short(mine)} with this {what}); start a new run "
                f"instead (with resume only these may change: {', '.join(s.rstrip('.') for s in RESUME_SAFE if s != 'resume')})"
            )
    safe = [ov for _, ov in parsed if _is_safe(ov.key_or_group)]
    for ov in safe:
        OmegaConf.update(saved, ov.key_or_group, ov.value(), merge=False, force_add=True)
    cfg = validate(saved) if safe else run_cfg
    if cfg.algo.get("stages"):
        raise ConfigError(f"resume={run_dir}: staged algos ({cfg.algo.name}) cannot be resumed yet; start a new run")
    return cfg


#: mixrl's own counters in a checkpoint (rollouts, generated tokens, TRL's micro-batch counter),
#: written by the trainer's ``progress`` state (mixrl.trainer.state.checkpoint_state)
RUN_STATE_FILE = "mixrl_run_state.json"


def trained_config(checkpoint: str | Path) -> dict | None:
    """The config ``checkpoint`` was trained under, as the trainer's ``progress`` state recorded
    it (:class:`mixrl.trainer.grpo.MixrlGRPOTrainer`; None for a checkpoint written before it was recorded)."""
    path = Path(checkpoint) / RUN_STATE_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text()).get("config")
    except ValueError:  # unreadable: rundir.unreadable_checkpoint_file names it
        return None


def _difference_in_common(new, old, prefix: str = "") -> tuple[str, object, object] | None:
    """:func:`first_difference` over the keys both configs have (a key that only one has comes
    from another mixrl version's schema, not from an edit)."""
    if isinstance(new, dict) and isinstance(old, dict):
        for k in new:
            key = f"{prefix}.{k}" if prefix else str(k)
            if k not in old or _is_safe(key) or key in _LOCATION_KEYS:
                continue
            found = _difference_in_common(new[k], old[k], key)
            if found:
                return found
        return None
    return None if same_value(new, old) else (prefix, new, old)


def check_trained_config(cfg: DictConfig, checkpoint: str | Path) -> None:
    """Refuse to resume ``checkpoint`` under a config that trains something else than what it
    was trained under (its ``config.yaml`` edited since, e.g. another algo): the same rule as
    an override on the command line (only :data:`RESUME_SAFE` keys may change). ConfigError, one line."""
    recorded = trained_config(checkpoint)
    if recorded is None:
        return
    found = _difference_in_common(OmegaConf.to_container(cfg, resolve=True), recorded)
    if found:
        where, mine, theirs = found
        run_dir = cfg.get("resume") or Path(checkpoint).parents[1]
        raise ConfigError(
            f"resume={run_dir}: its config.yaml no longer matches what {Path(checkpoint).name} was trained under "
            f"({where} is {_short(theirs)} there, {_short(mine)} in config.yaml, edited since); restore {where}={_short(theirs)} "
            f"in config.yaml or start a new run (with resume only these may change: "
            f"{', '.join(s.rstrip('.') for s in RESUME_SAFE if s != 'resume')})"
        )


def read_run_state(checkpoint: str | Path) -> dict | None:
    """The counters of :data:`RUN_STATE_FILE` (None: a checkpoint without it; the trainer keeps its own)."""
    path = Path(checkpoint) / RUN_STATE_FILE
    return json.loads(path.read_text()) if path.is_file() else None
