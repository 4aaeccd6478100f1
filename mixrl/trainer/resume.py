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
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from mixrl.errors import ConfigError

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")

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
    "resume",
)


def checkpoint_dir(run_dir: str | Path) -> Path:
    """Where a run's Trainer checkpoints live."""
    return Path(run_dir) / "trainer"


def last_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete ``checkpoint-<step>`` folder of a run, or None."""
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return None
    found = []
    for p in folder.iterdir():
        m = CHECKPOINT_RE.match(p.name)
        if m and p.is_dir() and (p / "trainer_state.json").is_file():  # written last: the checkpoint is complete
            found.append((int(m.group(1)), p))
    return max(found)[1] if found else None


def checkpoint_step(path: str | Path) -> int:
    return int(CHECKPOINT_RE.match(Path(path).name).group(1))


def _override_key(text: str) -> str:
    return text.lstrip("+~").partition("=")[0].strip()


def resume_config(run_dir: str, overrides: list[str]) -> DictConfig:
    """The config to resume ``run_dir`` with: its ``config.yaml`` plus the safe overrides.

    Raises ``ConfigError`` (one line) when the directory is not a run, or an override would
    change the objective, data or model of the run.
    """
    from mixrl.config.compose import import_plugins, validate

    path = Path(run_dir)
    cfg_file = path / "config.yaml"
    if not cfg_file.is_file():
        raise ConfigError(f"resume={run_dir}: no config.yaml there, so it is not a mixrl run directory; "
                          "give the run directory printed by `mixrl train`")
    keys = [_override_key(o) for o in overrides]
    bad = [o for o, k in zip(overrides, keys) if not any(k == s or k.startswith(s) for s in RESUME_SAFE)]
    if bad:
        raise ConfigError(
            f"resume={run_dir} uses that run's config.yaml; '{bad[0]}' would change what is trained; "
            f"start a new run instead (with resume only these may change: {', '.join(s.rstrip('.') for s in RESUME_SAFE if s != 'resume')})"
        )
    saved = OmegaConf.load(cfg_file)
    for text in overrides:
        key, _, value = text.lstrip("+~").partition("=")
        if key.strip() == "resume":
            continue
        OmegaConf.update(saved, key.strip(), None if value in ("", "null") else value, merge=False)
    saved.resume = str(path)
    saved.run_dir = str(path)
    import_plugins(list(saved.get("plugins") or []))  # the run's own components, before validation
    cfg = validate(saved)
    if cfg.algo.get("stages"):
        raise ConfigError(f"resume={run_dir}: staged algos ({cfg.algo.name}) cannot be resumed yet; start a new run")
    return cfg


def truncate_jsonl(path: str | Path, last_step: int) -> int:
    """Drop rows with ``step > last_step`` (and a torn last line); returns rows kept."""
    path = Path(path)
    if not path.is_file():
        return 0
    kept = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by the kill
        if int(row.get("step", 0)) <= last_step:
            kept.append(line)
    path.write_text("".join(k + "\n" for k in kept))
    return len(kept)


RUN_STATE_FILE = "mixrl_run_state.json"


def save_run_state(trainer, folder: str | Path) -> None:
    """Write mixrl's own counters (the rollout count) into a checkpoint folder. The trainer
    calls it before TRL writes the checkpoint, so a checkpoint that looks complete (its
    ``trainer_state.json`` exists) always has them, even when the run is killed right after."""
    (Path(folder) / RUN_STATE_FILE).write_text(json.dumps({"rollouts": int(trainer.mixrl_rollouts),
                                                          "generated_tokens": int(getattr(trainer, "mixrl_generated_tokens", 0))}))


def load_run_state(trainer, checkpoint: str | Path) -> None:
    """Restore what :func:`save_run_state` wrote (a checkpoint without it keeps the counters)."""
    path = Path(checkpoint) / RUN_STATE_FILE
    if path.is_file():
        state = json.loads(path.read_text())
        trainer.mixrl_rollouts = int(state.get("rollouts", 0))
        trainer.mixrl_generated_tokens = int(state.get("generated_tokens", 0))
