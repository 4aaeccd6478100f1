"""``mixrl train --rehearse``'s glue: the job with the rehearsal's swaps appended
(:mod:`mixrl.config.rehearsal`), the swaps' table, and ``RUN_DIR/rehearsal.json``."""

from __future__ import annotations

import json
from pathlib import Path

from mixrl.cli.console import out
from mixrl.config.recipe_index import list_recipe_names


def _rehearsal_job(job: list[str]) -> tuple[list[list[str]], list]:
    """``--rehearse``: the job with the rehearsal's swaps appended (mixrl.config.rehearsal), and
    the swaps. The run directory is fixed here so that rehearsal.json lands in it."""
    from mixrl.config import rehearsal  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it
    from mixrl.config.compose import compose_config  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it
    from mixrl.trainer.state.rundir import default_run_dir  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it

    job = [f"recipe={o}" if "=" not in o and o in list_recipe_names() else o for o in job]
    cfg = compose_config(job)
    swaps = rehearsal.plan_rehearsal(cfg)
    job = [*job, *rehearsal.overrides(swaps)]
    if not cfg.run_dir:
        job.append(f"run_dir={default_run_dir(cfg)}")
    return [job], swaps


def _print_rehearsal(swaps: list) -> None:
    from mixrl.config import rehearsal  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it

    out.print(rehearsal.table(swaps))


def _write_rehearsal(cfg, swaps: list) -> None:
    """RUN_DIR/rehearsal.json: the swaps, once the run directory exists (also after a failed run)."""
    run_dir = Path(str(cfg.run_dir))
    if run_dir.is_dir():
        (run_dir / "rehearsal.json").write_text(json.dumps({"swaps": [s.row() for s in swaps]}, indent=2, default=str) + "\n")
