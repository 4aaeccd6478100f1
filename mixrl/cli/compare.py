"""``mixrl compare``, ``mixrl rejudge`` and ``mixrl eval`` (logic in :mod:`mixrl.experiments.compare`,
:mod:`mixrl.experiments.rejudge` and
:mod:`mixrl.trainer.saved_eval`).

Registered in ``mixrl.cli.main`` with ``app.command("compare")(compare)``,
``app.command("rejudge")(rejudge)`` and ``app.command("eval")(eval_model)``; user errors print one line and exit 2
(``mixrl.cli.errors.user_errors``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mixrl.cli.errors import user_errors
from mixrl.experiments.compare import compare as run_compare
from mixrl.experiments.rejudge import check_folder, rejudge_folder
from mixrl.experiments.report import table_cells, table_header
from mixrl.benchmarks.spec import is_benchmark_override
from mixrl.errors import ConfigError
from mixrl.evaluation.saved import resolve_model_dir
from mixrl.options import check_number, check_out_file, check_out_folder, json_object_with, write_out_file
from mixrl.progress import progress_bar

__all__ = ["check_out_file", "compare", "eval_model", "rejudge"]  # check_out_file lives in mixrl.options; importable here too


def _consoles() -> tuple[Console, Console]:
    return Console(width=None if sys.stdout.isatty() else 160), Console(stderr=True)


# --------------------------------------------------------------------------- compare
@user_errors
def compare(
    run_dirs: List[Path] = typer.Argument(
        ..., help="Run directories, or folders of runs (a multirun sweep: every sub-folder with summary.json).",
        show_default=False,
    ),
    metric: str = typer.Option("accuracy", "--metric", help="Held-out metric: accuracy, accuracy/level3, pass@4, ..."),
    out_dir: Path = typer.Option(Path("compare"), "--out", help="Folder for compare.md, compare.json and the PNG plots."),
    target: float = typer.Option(0.6, "--target", help="Report the rollouts each method needs to reach metric >= TARGET."),
    by: Optional[List[str]] = typer.Option(
        None, "--by", help="Also group by a config value (repeatable), e.g. --by algo.coefs.mu; default: recipe or algo."
    ),
    band: str = typer.Option("minmax", "--band", help="Band around the mean curve: minmax or std."),
    plots: bool = typer.Option(True, "--plots/--no-plots", help="Write PNG plots (needs matplotlib)."),
):
    """Compare runs by method: held-out accuracy (mean ± std over seeds), rollouts to a target, plots."""
    from mixrl.experiments.compare import COMPARE_MARKER, COMPARE_PARTIAL, COMPARE_WRITES  # deferred: only compare needs them

    out, _ = _consoles()
    check_number(target, "--target")
    check_out_folder(out_dir, "--out", command="mixrl compare", writes=COMPARE_WRITES, marker=COMPARE_MARKER,
                     partial=COMPARE_PARTIAL, is_marker=json_object_with("metric", "methods"))  # the user's own compare.md is never overwritten
    result = run_compare(run_dirs, out_dir, metric=metric, target=target, by=list(by or []), band=band, plots=plots)
    table = Table(title=f"mixrl compare: held-out {metric}")
    for i, col in enumerate(table_header(metric, target)):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in result.rows:
        table.add_row(*[escape(c) for c in table_cells(row)])
    n_runs = sum(r.n for r in result.rows)
    table.caption = f"{n_runs} runs; final/best: mean ± sample std over runs; rollouts: mean over runs that reached the target"
    out.print(table)
    out.print(f"wrote [bold]{result.markdown}[/]" + (f" and {len(result.plots)} plots in {result.out_dir}" if result.plots else ""))


# --------------------------------------------------------------------------- rejudge
@user_errors
def rejudge(
    folders: List[Path] = typer.Argument(
        ..., help="Results folders holding compare.json (written by mixrl reproduce or mixrl compare), e.g. docs/results/hard.",
        show_default=False,
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the changes without rewriting any file."),
):
    """Judge the claims of results folders again from the per-seed values in their compare.json (no runs needed):
    scipy's tests, Holm's adjustment, rliable's interval estimates. Rewrites compare.json and the Claims
    section of compare.md and README.md, and prints every verdict that changed."""
    out, _ = _consoles()
    for folder in folders:  # every folder is checked before any is written
        check_folder(folder)
    table = Table(title="mixrl rejudge: verdicts that changed")
    for col in ("folder", "claim", "before", "now", "now, under Holm"):
        table.add_column(col)
    total = 0
    for folder in folders:
        rows, changes = rejudge_folder(folder, write=not dry_run)
        total += len(rows)
        for c in changes:
            table.add_row(escape(c.folder), escape(c.claim), c.old, c.new, c.holm)
        out.print(f"{folder}: {len(rows)} claims, {len(changes)} changed" + ("" if dry_run or not rows else " (rewritten)"))
    if table.row_count:
        out.print(table)


# --------------------------------------------------------------------------- eval
@user_errors
def eval_model(
    model_dir: Path = typer.Argument(..., help="A saved model folder (a run's model/, full or a LoRA adapter) or a run directory.", show_default=False),
    overrides: Optional[List[str]] = typer.Argument(
        None, help="Hydra overrides selecting the held-out split and evaluation, e.g. data=gsm8k trainer.eval_size=500 trainer.eval_pass_k=4"
    ),
    out_file: Optional[Path] = typer.Option(None, "--out", help="Also write the results as JSON to this file."),
    trust_run_code: bool = typer.Option(
        False, "--trust-run-code",
        help="Run the code the run's config.yaml names (plugins, a reward file or module, model.trust_remote_code); "
             "without it such a run is refused.",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars (they show only on a terminal anyway)."),
    plot_file: Optional[Path] = typer.Option(
        None, "--plot", help="With benchmarks=SUITE: also draw the table as a PNG (ours with 95% intervals beside the paper's rows)."),
):
    """Evaluate a saved model on its run's held-out split (greedy accuracy, per level, pass@k), or
    with benchmarks=SUITE on the papers' benchmarks under their protocol (conf/benchmarks/: math6,
    ood3, arith, ...; benchmarks.NAME.KEY=VALUE changes one), beside the paper's reported numbers.

    Given a run directory (or its model/), the run's own config.yaml (data, reward, template,
    held-out split) is used, with any overrides applied on top. Code that config names runs
    only with --trust-run-code."""
    from mixrl.trainer.saved_eval import eval_config, evaluate_saved_model  # deferred: trainer.saved_eval imports transformers; `mixrl --help` never loads it

    out, err = _consoles()
    if out_file is not None:
        check_out_file(out_file, example="eval.json", written_by=json_object_with("model_dir"), command="mixrl eval")  # before the evaluation: its results are not lost to an unwritable --out
    benchmarks = any(is_benchmark_override(o) for o in overrides or [])
    if plot_file is not None:
        if not benchmarks:
            raise ConfigError("--plot draws the benchmark table: add benchmarks=SUITE (e.g. benchmarks=math6), or drop --plot")
        check_out_file(plot_file, "--plot", example="table.png")
        from mixrl.explain.schedules import require_matplotlib  # deferred: matplotlib is optional (the plot extra)

        require_matplotlib()  # before the evaluation: a missing matplotlib is one line, not a lost table
    if benchmarks:  # benchmarks=SUITE: the papers' benchmarks (mixrl.cli.benchmarks)
        _eval_benchmarks(model_dir, list(overrides or []), out_file, trust_run_code, quiet, out, err, plot_file)
        return
    cfg, saved = eval_config(model_dir, list(overrides or []), trust_run_code=trust_run_code)  # a bad override fails before any model is loaded
    resolve_model_dir(model_dir)
    err.print(f"config: {saved} (the run's own{', with the overrides' if overrides else ''})" if saved
              else "config: the defaults and the overrides (no config.yaml next to the model)", highlight=False, soft_wrap=True)
    with progress_bar(err, quiet=quiet or not cfg.logger.progress, transient=True) as prog:
        task = prog.add_task("held-out eval", total=None)
        result = evaluate_saved_model(
            model_dir, cfg, progress=lambda n: prog.advance(task, n), on_rows=lambda n: prog.update(task, total=n)
        )
    table = Table(title=f"mixrl eval: {escape(result['model_dir'])}")
    table.add_column("held-out metric")
    table.add_column("value", justify="right")
    metrics = result["metrics"]
    for key, value in metrics.items():
        if key not in ("n", "samples"):
            table.add_row(escape(key), f"{value:.3f}")
    table.caption = (
        f"{int(metrics.get('n', 0))} problems of {escape(result['data'])} ({result['split']}), reward {result['reward']}, "
        f"{result['max_new_tokens']} new tokens max; {result['seconds']:.1f}s"
    )
    out.print(table)
    if out_file is not None:
        write_out_file(out_file, json.dumps(result, indent=2) + "\n", written_by=json_object_with("model_dir"), command="mixrl eval")
        out.print(f"wrote [bold]{escape(str(out_file))}[/]")


def _eval_benchmarks(model_dir, overrides, out_file, trust_run_code, quiet, out, err, plot_file=None) -> None:
    """``mixrl eval MODEL benchmarks=SUITE``: the table of :mod:`mixrl.cli.benchmarks`."""
    from mixrl.cli import benchmarks as command  # deferred: imports torch when it evaluates; `mixrl --help` never loads it

    result = command.evaluate(model_dir, overrides, trust_run_code=trust_run_code, quiet=quiet, err=err)
    out.print(command.render_table(result))
    if out_file is not None:
        command.write_json(result, out_file)
        out.print(f"wrote [bold]{escape(str(out_file))}[/]")
    if plot_file is not None:
        command.plot_table(result, plot_file)
        out.print(f"wrote [bold]{escape(str(plot_file))}[/]")
