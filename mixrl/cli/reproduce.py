"""``mixrl reproduce SUITE``: run a suite's recipes x seeds, then compare them and write the
README (:mod:`mixrl.experiments.reproduce`)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from mixrl.cli.console import err, out
from mixrl.cli.errors import user_errors
from mixrl.options import check_number
from mixrl.progress import progress_bar


@user_errors
def reproduce(
    suite: str = typer.Argument(..., help="A suite of conf/suites/ (toy, hard) or a path to a suite .yaml."),
    overrides: Optional[List[str]] = typer.Argument(None, help="Overrides applied to every run, after the suite's, e.g. trainer.max_steps=30"),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Where the runs, table, plots and README go (default: a new runs/reproduce/SUITE-<time>/)."),
    seeds: Optional[int] = typer.Option(None, "--seeds", help="Seeds per method (0..N-1); default: the suite's."),
    jobs: Optional[int] = typer.Option(None, "--jobs", help="Training processes at a time (one torch thread each when > 1); default: the suite's."),
    plots: bool = typer.Option(True, "--plots/--no-plots", help="Write PNG plots (needs matplotlib)."),
    only: Optional[str] = typer.Option(None, "--only", help="Comma-separated method labels to run (a smoke run), e.g. grpo,luffy-authors."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars (they show only on a terminal anyway)."),
):
    """Run a suite: its recipes x seeds at the suite's budget, then compare them (table, plots,
    claims judged over seeds) and write a README with the command, commit and machine."""
    from mixrl.experiments import reproduce as experiments_reproduce  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it
    from mixrl.experiments.suites import load_suite  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it

    check_number(seeds, "--seeds", low=1, integer=True)
    check_number(jobs, "--jobs", low=1, integer=True)
    s = load_suite(suite)
    out_dir = out_dir or experiments_reproduce.default_out_dir(s.name)
    experiments_reproduce.check_out_dir(out_dir)  # a folder of the user's own (its README.md, compare.md) is refused before any run
    err.print(f"writing to [bold]{out_dir}[/]")
    result = experiments_reproduce.reproduce_suite(s, out_dir, seeds=seeds, jobs=jobs, extra=list(overrides or []), log=err.print, plots=plots,
                             only=[x.strip() for x in only.split(",") if x.strip()] if only else (),
                             progress=progress_bar(err, quiet=quiet))
    out.print(Path(result["compare"]).read_text())
    out.print(f"written: [bold]{out_dir}[/] (README.md, compare.md, plots, runs/)")
