"""``mixrl samples RUN_DIR``: what the model wrote, from the run's ``samples.jsonl``
(:mod:`mixrl.trainer.sample_log`).

Registered in ``mixrl.cli.main`` with ``app.command("samples")(samples)``; a missing directory
or a run without a sample log prints one line and exits 2 (``mixrl.cli.errors.user_errors``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mixrl.cli.errors import user_errors
from mixrl.options import check_number


@user_errors
def samples(
    run_dir: Path = typer.Argument(..., help="A run directory (the run_dir of `mixrl train`)."),
    last: int = typer.Option(3, "--last", help="Training rows of the last N logged steps (0: all kept)."),
    source: Optional[str] = typer.Option(None, "--source", help="Only rows of this source: on_policy, expert, prefix, replay, teacher, hinted, ..."),
    heldout: bool = typer.Option(False, "--eval", help="The last held-out evaluation's rows instead of training rows."),
    as_json: bool = typer.Option(False, "--json", help="The selected rows as JSON lines (texts untrimmed)."),
    width: int = typer.Option(60, "--width", help="Characters shown of each prompt and completion in the table (0: all)."),
):
    """Show what the model writes: a few prompts and completions per logged step, with their
    source (on-policy, expert, prefix, replay, teacher, hinted, ...), reward and advantage,
    from RUN_DIR/samples.jsonl (logger.samples_per_step rows per step)."""
    check_number(last, "--last", low=0, integer=True)  # 0: all
    check_number(width, "--width", low=0, integer=True)  # 0: all
    from mixrl.trainer.sample_log import COLUMNS, cells, read_samples, select, sources_in  # deferred: imports torch (mixrl.core); `mixrl --help` must not load it

    rows = read_samples(run_dir, warn=lambda text: Console(stderr=True).print(f"note: {escape(text)}", highlight=False, soft_wrap=True))
    chosen = select(rows, last=last, source=source, heldout=heldout)
    if as_json:
        sys.stdout.write("".join(json.dumps(r) + "\n" for r in chosen))
        return
    out = Console(width=None if sys.stdout.isatty() else 200)
    if not chosen:
        split = [r for r in rows if (r.get("split") == "eval") == heldout]
        what = "held-out evaluation" if heldout else "training step"
        have = sources_in(split)
        note = f"; sources in the log: {', '.join(have)}" if source and have else ""
        Console(stderr=True).print(f"no {what} samples{f' of source {escape(source)}' if source else ''} in {run_dir}{note}",
                                   highlight=False, soft_wrap=True)
        return
    title = "held-out evaluation" if heldout else f"training samples, last {last} logged steps" if last else "training samples"
    table = Table(title=f"{run_dir} — {title}", show_lines=True)
    for col in COLUMNS:
        table.add_column(col, overflow="fold", justify="right" if col in ("step", "reward", "advantage") else "left")
    for r in chosen:
        table.add_row(*(escape(c) for c in cells(r, width)))
    out.print(table)
