"""Compare run directories: a Markdown table per method and learning-curve plots.

``mixrl compare RUN_DIR...`` (thin CLI in :mod:`mixrl.cli.compare`) calls :func:`compare`.
A RUN_DIR is one run (it holds ``summary.json``) or any folder of runs (a multirun sweep
``runs/multirun/<date>/<time>/``): every folder below it that holds ``summary.json`` is a
run, and the search does not descend into a run (a staged run's stage folders belong to it).

Runs are grouped by method: the recipe name when the run used one, else ``algo``
(``--by KEY`` adds config values, e.g. ``--by algo.coefs.mu``). Per method:

* final held-out ``metric`` (``summary.eval_after``): mean and sample std (n - 1) over runs;
* best: per run, the max of ``metric`` over ``eval.jsonl`` and the final evaluation
  (the evaluation before training is not counted), then the mean over runs;
* rollouts to ``target``: per run, the on-policy rollouts trained on when a held-out
  evaluation (before training = 0 rollouts, ``eval.jsonl`` rows, after training) first
  reached ``metric >= target``; the mean over the runs that reached it and how many did.
  Needs ``eval.jsonl`` (``trainer.eval_every=N``);
* generated tokens to ``target``: the same, counting the completion tokens of those rollouts
  (``generated_tokens`` in ``eval.jsonl`` / ``summary.json``; older runs have none);
* collapsed: runs whose final ``metric`` is below half of their best held-out evaluation
  (the evaluation before training included);
* final entropy (last logged step) and mean completion length (over all steps), means over runs;
* held-out pass@k by level: greedy accuracy and pass@k (``trainer.eval_samples``) before and
  after training, per level, mean ± std over runs;
* claims (``claims=``, e.g. from a suite): per claim a verdict from a stated test over the
  seeds (:mod:`mixrl.experiments.claims`, :mod:`mixrl.experiments.stats`), with Holm's adjustment
  over the claims and rliable's interval estimates;
* over the held-out levels (tasks), rliable's suite figures: each method's interquartile mean of
  the final per-level accuracy over runs x levels with a stratified bootstrap interval, and its
  probability of improvement over the claims' usual baseline (:func:`aggregate_over_levels`).

Everything here is pure Python over the files (no torch import); plots need matplotlib.
This module is the entry point; the work is in :mod:`~mixrl.experiments.runs` (reading),
:mod:`~mixrl.experiments.summary` (statistics), :mod:`~mixrl.experiments.report` (Markdown)
and :mod:`~mixrl.experiments.plots` (PNGs).
"""


from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mixrl.errors import did_you_mean
from mixrl.options import replace_text
from mixrl.experiments.claims import judge_claims
from mixrl.experiments.plots import curve_source, make_plots, require_matplotlib
from mixrl.experiments.report import render_markdown
from mixrl.experiments.runs import CompareError, find_runs, load_run
from mixrl.experiments.summary import MethodRow, available_metrics, by_level, group_runs, level_scores, summarize

# --------------------------------------------------------------------------- entry point
@dataclass
class CompareResult:
    rows: list[MethodRow]
    out_dir: Path
    markdown: Path
    plots: dict[str, str]
    curve_source: str
    claims: list = field(default_factory=list)
    aggregate: dict | None = None


def aggregate_over_levels(rows: Sequence[MethodRow], claims: Sequence = (), measure: str = "accuracy") -> dict | None:
    """rliable's suite figures over the held-out levels (:func:`mixrl.experiments.intervals.suite_estimates`):
    each method's final ``measure`` per run and level, its IQM and stratified bootstrap interval, and
    P(method > baseline), the baseline being the method the claims name most often as theirs. None
    when fewer than two levels are shared by every method."""
    scores = {}
    for r in rows:
        levels, matrix = level_scores(r, measure)
        if matrix:
            scores[r.method] = (levels, matrix)
    shared = set.intersection(*(set(lv) for lv, _ in scores.values())) if scores else set()
    if len(shared) < 2:
        return None
    levels = sorted(shared, key=int)
    mats = {m: [[row[lv.index(x)] for x in levels] for row in mat] for m, (lv, mat) in scores.items()}
    named = [c.baseline for c in claims if c.baseline in mats]
    baseline = max(set(named), key=named.count) if named else None
    from mixrl.experiments.intervals import suite_estimates  # deferred: numpy and scipy; `mixrl --help` imports compare

    return {"measure": measure, "levels": levels, "baseline": baseline, "scores": mats,
            "methods": suite_estimates(mats, baseline=baseline)}


#: what ``mixrl compare`` writes into its ``--out`` folder (the PNGs first, then compare.json, then compare.md);
#: ``compare.json`` marks a folder as an earlier compare's (:func:`mixrl.options.check_out_folder`)
COMPARE_MARKER = "compare.json"
COMPARE_PARTIAL = ("learning_curve.png", "reward.png", "entropy.png", "mu.png")
COMPARE_WRITES = (COMPARE_MARKER, "compare.md", *COMPARE_PARTIAL)


def compare(paths: Sequence[str | Path], out_dir: str | Path, *, metric: str = "accuracy", target: float = 0.6,
            by: Sequence[str] = (), band: str = "minmax", plots: bool = True, claims: Sequence = ()) -> CompareResult:
    """Read the runs under ``paths``, write ``compare.md``, ``compare.json`` and the PNGs into ``out_dir``."""
    if band not in ("minmax", "std"):
        raise CompareError(f"--band must be 'minmax' or 'std', got '{band}'")
    if plots:
        require_matplotlib()
    runs = [load_run(p) for p in find_runs(paths)]
    metrics = available_metrics(runs)
    if metric not in metrics:
        raise CompareError(
            f"no run has held-out metric '{metric}'{did_you_mean(metric, metrics)}; available: {', '.join(metrics) or 'none'}"
        )
    groups = group_runs(runs, by)
    rows = summarize(groups, metric, target)
    judged = []
    if claims:
        judged = judge_claims(list(claims), groups)
    levels = by_level(rows)
    aggregate = aggregate_over_levels(rows, claims)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written, desc = (make_plots(rows, out, metric, band) if plots else ({}, curve_source(runs, metric)))
    data = {
        "metric": metric, "target": target,
        "methods": [{
            "method": r.method, "n": r.n, "seeds": r.seeds, "final_mean": r.final_mean, "final_std": r.final_std,
            "best_mean": r.best_mean, "best_std": r.best_std, "rollouts_to_target_mean": r.rollouts_mean,
            "reached": r.reached, "with_eval_jsonl": r.with_evals, "final_entropy": r.entropy,
            "completion_length": r.completion_length, "steps": r.steps, "wall_seconds": r.wall_seconds,
            "tokens_to_target_mean": r.tokens_mean, "tokens_reached": r.tokens_reached, "collapsed": r.collapsed,
            "runs": [str(run.path) for run in r.runs],
        } for r in rows],
        "by_level": levels,
        "claims": judged,
        "aggregate": aggregate,
        "plots": written,
    }
    replace_text(out / COMPARE_MARKER, json.dumps(data, indent=2))  # before compare.md: a folder with compare.md has its marker
    md = out / "compare.md"
    replace_text(md, render_markdown(rows, metric, target, written, desc, [str(p) for p in paths], judged, aggregate))  # whole or not at all
    return CompareResult(rows, out, md, written, desc, judged, aggregate)
