"""``mixrl explain``: print the objective a config trains (logic in :mod:`mixrl.explain`).

Registered in ``mixrl.cli.main`` with ``app.command()(explain)``. This module does not
import ``mixrl.cli.main`` (which imports it), so it handles user errors itself, the same
way as ``mixrl.cli.errors.user_errors``: one line on stderr, exit code 2.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from mixrl.errors import MixrlUserError
from mixrl.options import check_number, check_out_file


def explain(
    overrides: Optional[List[str]] = typer.Argument(
        None, help="Hydra overrides, e.g. algo=chord trainer.max_steps=200 recipe=NAME"
    ),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Also draw every schedule over 0..max_steps into this PNG."),
    steps: int = typer.Option(5, "--steps", help="Rows of the schedule table: N evenly spaced steps from 0 to max_steps."),
):
    """Print the objective the composed config trains, as math, and its schedules over the run."""
    out = Console(width=None if sys.stdout.isatty() else 160)
    err = Console(stderr=True)
    try:
        check_number(steps, "--steps", low=1, integer=True)
        _explain(list(overrides or []), plot, steps, out)
    except MixrlUserError as e:
        err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=2) from None


def _explain(overrides: list[str], plot: Optional[Path], steps: int, out: Console) -> None:
    from mixrl.config.compose import compose_config, compose_stages  # deferred: imports torch; `mixrl --help` must not load it
    from mixrl.config.context import check_context  # deferred: with compose_config
    from mixrl.explain import explain_text, plot_schedules, require_matplotlib, schedule_rows  # deferred: imports torch; `mixrl --help` must not load it

    if plot is not None:
        check_out_file(plot, "--plot", example="schedules.png")
        require_matplotlib()
    cfg = compose_config(overrides)
    stages = compose_stages(cfg, overrides)
    for _, stage_cfg in stages:
        check_context(stage_cfg)  # the completion fits the model's context (ConfigError: one line and the fix)
    staged = len(stages) > 1 or stages[0][0] != "main"
    blocks = []
    for i, (name, stage_cfg) in enumerate(stages):  # check every stage before printing anything
        title = None
        if staged:
            title = f"stage {i + 1}/{len(stages)} '{name}' of algo={cfg.algo.name}: algo={stage_cfg.algo.name}, {stage_cfg.trainer.max_steps} steps"
        blocks.append((explain_text(stage_cfg, title=title), schedule_rows(stage_cfg, steps), stage_cfg))
    for i, (text, (columns, rows), stage_cfg) in enumerate(blocks):
        if i:
            out.print()
        out.print(Text(text), highlight=False, soft_wrap=True)
        out.print()
        out.print(Text(f"schedules (value at optimizer step; trainer.max_steps={stage_cfg.trainer.max_steps})"), highlight=False)
        table = Table()
        for col in columns:
            table.add_column(col, justify="right")
        for row in rows:
            table.add_row(str(int(row[0])), *(f"{v:.6g}" for v in row[1:]))
        out.print(table)
    from mixrl.config.ledger import ledger_of, render_differences  # deferred: with the config modules above

    ledger = ledger_of(cfg.get("recipe_info"))
    if ledger is not None:  # a paper recipe: where it differs from the authors' run (the recipe page has every row)
        out.print()
        out.print(Text("\n".join(render_differences(ledger, cfg))), highlight=False, soft_wrap=True)
    if plot is not None:
        path = plot_schedules(stages if staged else cfg, str(plot))
        out.print(Text(f"schedules plotted to {path}"), highlight=False)
