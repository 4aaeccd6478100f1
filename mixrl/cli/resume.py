"""``mixrl train resume=auto run_dir=PATH``: the overrides a requeued job runs again, resolved
to ``resume=PATH`` or a new run into PATH."""

from __future__ import annotations

from pathlib import Path

from mixrl.cli.console import err
from mixrl.errors import ConfigError


def _resolve_resume_auto(overrides: list[str], multirun: bool) -> list[str]:
    """``resume=auto run_dir=PATH``: the command a requeued job runs again. With a complete checkpoint
    in PATH (:func:`mixrl.trainer.state.rundir.last_checkpoint`) it becomes ``resume=PATH`` (the
    other overrides are checked against the run's config as for any resume); with none, a new run
    into PATH, refused as any new run is when PATH holds something else (one line, exit 2)."""
    from mixrl.config.compose import parse_overrides  # deferred: imports torch; `mixrl --help` must not load it
    from mixrl.trainer.state.rundir import check_new_run_dir, last_checkpoint  # deferred: imports torch

    parsed = parse_overrides(list(overrides))
    resume = [ov.value() for ov in parsed if ov.key_or_group == "resume"]
    if not resume or resume[-1] != "auto":
        return overrides
    if multirun:
        raise ConfigError("resume=auto continues one run; drop -m (multirun)")
    run_dirs = [ov.value() for ov in parsed if ov.key_or_group == "run_dir"]
    if not run_dirs or not run_dirs[-1]:
        raise ConfigError("resume=auto needs run_dir=PATH: the run directory to continue if it holds a checkpoint, "
                          "or to start in if it is new")
    run_dir = Path(str(run_dirs[-1]))
    kept = [o for o, ov in zip(overrides, parsed) if ov.key_or_group != "resume"]
    if last_checkpoint(run_dir) is not None:
        err.print(f"resume=auto: continuing {run_dir} from its newest complete checkpoint", highlight=False, soft_wrap=True)
        return [*kept, f"resume={run_dir}"]
    ranks = [ov.value() for ov in parsed if ov.key_or_group == "hardware.machine_rank"]
    if ranks and str(ranks[-1]) != "0":
        return kept  # machine R>0 of a multi-node run joins the directory machine 0 checks (and may have created already)
    try:
        check_new_run_dir(run_dir, say=lambda text: None)
    except ConfigError as e:
        raise ConfigError(f"resume=auto: {run_dir} holds no complete checkpoint to continue from, and a new run cannot "
                          f"start there: {e}") from None
    if run_dir.is_dir() and any(p.name not in ("launch", ".mixrl.lock") for p in run_dir.iterdir()):
        err.print(f"resume=auto: {run_dir} holds no complete checkpoint; starting it again", highlight=False, soft_wrap=True)
    return kept
