"""Code a run directory names, and the rule that gates it (``--trust-run-code``).

``mixrl eval RUN_DIR`` and ``mixrl train resume=RUN_DIR`` load the run's ``config.yaml``, a
file written by whoever made the run. Three of its values make mixrl execute Python code:

* ``plugins``: modules imported to register components;
* ``reward.name`` and ``reward.extra[*].name`` when they are not a built-in reward: a file
  ``path/to/rewards.py:fn`` is executed, a dotted ``pkg.module:fn`` is imported (the working
  directory is searched too, so a relative name resolves wherever the command runs);
* ``model.trust_remote_code: true``: transformers runs the Python files that a model folder's
  ``auto_map`` names (the run's ``model/``, its checkpoints, ``model.path``).

Loading a run's config executes none of them unless the user asks with ``--trust-run-code``
(:func:`require_trust` raises a one-line :class:`~mixrl.errors.ConfigError` before anything is
imported or loaded). A value the user sets on the command line (``mixrl eval RUN_DIR
reward=exact``) is the user's own and needs no flag; ``mixrl train`` without ``resume`` runs
only what its command line names.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from mixrl.errors import ConfigError
from mixrl.rewards import REWARDS

TRUST_FLAG = "--trust-run-code"
_TRUE = {"true", "yes", "y", "on", "1"}


def _get(cfg: DictConfig, key: str, default=None):
    """``cfg.key`` or ``default``; an interpolation that does not resolve is left to validation."""
    value = OmegaConf.select(cfg, key, default=default, throw_on_resolution_failure=False)
    return default if value is None else value


def _set_by_user(key: str, user_keys: Iterable[str]) -> bool:
    """Whether the command line set ``key`` (itself, or a section above it such as ``reward``)."""
    return any(key == u or key.startswith(u + ".") for u in user_keys)


def _auto_map_files(folders: Iterable[Path]) -> list[str]:
    """The Python files the ``auto_map`` of these model folders would run (``modeling_x.py``)."""
    files: list[str] = []
    for folder in folders:
        for name in ("config.json", "tokenizer_config.json"):
            try:
                auto_map = json.loads((folder / name).read_text()).get("auto_map") or {}
            except (OSError, ValueError, AttributeError):
                continue
            refs = auto_map.values() if isinstance(auto_map, dict) else auto_map
            for ref in refs:
                for r in ref if isinstance(ref, (list, tuple)) else [ref]:
                    if isinstance(r, str) and "." in r:
                        f = str(folder / (r.split("--")[-1].rsplit(".", 1)[0] + ".py"))
                        if f not in files:
                            files.append(f)
    return files


def run_code(saved: DictConfig, run_dir: str | Path, user_keys: Iterable[str] = ()) -> list[str]:
    """What loading ``saved`` (a run's config) would execute, one phrase per item; values
    the user set on the command line (``user_keys``) are left out."""
    user_keys = list(user_keys)
    items: list[str] = []
    plugins = list(_get(saved, "plugins") or [])
    if plugins and not _set_by_user("plugins", user_keys):
        items.append(f"plugins={plugins} (imported)")
    rewards = [("reward.name", _get(saved, "reward.name"))]
    extra = _get(saved, "reward.extra") or []
    rewards += [(f"reward.extra[{i}].name", x.get("name") if isinstance(x, (dict, DictConfig)) else None) for i, x in enumerate(extra)]
    for key, name in rewards:
        if name is None or str(name) in REWARDS or _set_by_user(key.split("[")[0], user_keys):
            continue
        spec = str(name)
        module = spec.rpartition(":")[0] if ":" in spec else spec
        if module.endswith(".py") or "/" in module:
            path = Path(module).expanduser()
            items.append(f"{key}={spec} (executes that file)" if path.is_absolute()
                         else f"{key}={spec} (executes {Path.cwd() / path}: relative to the working directory)")
        else:
            items.append(f"{key}={spec} (imports module {module!r})")
    remote = str(_get(saved, "model.trust_remote_code", False)).strip().lower() in _TRUE  # as OmegaConf reads a bool
    if remote and not _set_by_user("model.trust_remote_code", user_keys):
        run = Path(run_dir)
        folders = [run / "model", *sorted((run / "trainer").glob("checkpoint-*"))]
        model_path = _get(saved, "model.path")
        if model_path and Path(str(model_path)).is_dir():
            folders.append(Path(str(model_path)))
        files = _auto_map_files(folders)
        items.append("model.trust_remote_code=true (transformers runs the model folder's own Python files"
                     + (f": {', '.join(files)}" if files else "") + ")")
    return items


def require_trust(saved: DictConfig, run_dir: str | Path, *, trusted: bool, what: str, user_keys: Iterable[str] = (),
                  alternative: str = "") -> None:
    """Raise ConfigError (one line, exit 2) when ``saved`` names code and the user did not pass
    ``--trust-run-code``. ``what`` names the command (``resume=RUN``); ``alternative`` a way
    around the flag (e.g. overriding the reward)."""
    items = run_code(saved, run_dir, user_keys)
    if items and not trusted:
        raise ConfigError(
            f"{what}: the run's config.yaml names code that would run: {'; '.join(items)}; mixrl runs code a run "
            f"directory names only when asked: add {TRUST_FLAG} if you trust whoever made {run_dir}{alternative}"
        )


__all__ = ["TRUST_FLAG", "require_trust", "run_code"]
