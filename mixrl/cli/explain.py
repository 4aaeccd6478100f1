"""``mixrl explain``: print the objective a config trains (logic in :mod:`mixrl.explain`).

Registered in ``mixrl.cli.main`` with ``app.command()(explain)``. This module does not
import ``mixrl.cli.main`` (which imports it), so it handles user errors itself, the same
way as main's ``user_errors``: one line on stderr, exit code 2.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from mixrl.errors import MixrlUserError


def explain(
    overrides: Optional[List[str]] = typer.Argument(
        None, help="Hydra overrides, e.g. algo=gspo offpolicy=expert algo.mix.mode=aux_loss"
    ),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Also draw every schedule over 0..max_steps into this PNG."),
    steps: int = typer.Option(5, "--steps", help="Rows of the schedule table: evenly spaced steps from 0 to max_steps."),
):
    """Print the objective the composed config trains, as math, with its schedules over the run."""
    out = Console(width=None if sys.stdout.isatty() else 160)
    err = Console(stderr=True)
    try:
        _explain(list(overrides or []), plot, steps, out)
    except MixrlUserError as e:
        err.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True, markup=True)
        raise typer.Exit(code=2) from None


def _explain(overrides: list[str], plot: Optional[Path], steps: int, out: Console) -> None:
    from mixrl.config.compose import compose_config
    from mixrl.explain import explain_text, plot_schedules, schedule_rows

    cfg = compose_config(overrides)
    text = explain_text(cfg)  # raises ConfigError on a contradiction
    columns, rows = schedule_rows(cfg, steps)
    out.print(Text(text), highlight=False, soft_wrap=True)
    table = Table()
    for col in columns:
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(str(int(row[0])), *(f"{v:.6g}" for v in row[1:]))
    out.print()
    out.print(Text(f"schedules (value at optimizer step; trainer.max_steps={cfg.trainer.max_steps})"), highlight=False)
    out.print(table)
    if plot is not None:
        path = plot_schedules(cfg, str(plot))
        out.print(Text(f"schedules plotted to {path}"), highlight=False)
