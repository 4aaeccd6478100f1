"""PNG plots for ``mixrl compare``: the learning curve and training curves, mean and band over runs.

matplotlib is optional (``pip install 'mixrl[plot]'``) and imported only when a plot is drawn.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from mixrl.errors import ConfigError
from mixrl.experiments.runs import Run
from mixrl.experiments.summary import MethodRow

# --------------------------------------------------------------------------- plots
def _aggregate(series: list[tuple[list[float], list[float]]], band: str):
    """Mean and band (min-max or ±std) over runs at each x that any run has."""
    by_x: dict[float, list[float]] = {}
    for xs, ys in series:
        for x, y in zip(xs, ys):
            by_x.setdefault(x, []).append(y)
    xs = sorted(by_x)
    mean = [statistics.fmean(by_x[x]) for x in xs]
    if band == "std":
        sd = [statistics.stdev(by_x[x]) if len(by_x[x]) > 1 else 0.0 for x in xs]
        lo, hi = [m - s for m, s in zip(mean, sd)], [m + s for m, s in zip(mean, sd)]
    else:
        lo, hi = [min(by_x[x]) for x in xs], [max(by_x[x]) for x in xs]
    return xs, mean, lo, hi


def _plot(path: Path, title: str, ylabel: str, groups: dict[str, list[tuple[list[float], list[float]]]], band: str) -> None:
    import matplotlib  # deferred: matplotlib is optional (the plot extra)

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt  # deferred: matplotlib is optional (the plot extra)

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for i, (label, series) in enumerate(groups.items()):
        xs, mean, lo, hi = _aggregate(series, band)
        if not xs:
            continue
        color = f"C{i % 10}"
        n = len(series)
        ax.plot(xs, mean, color=color, label=f"{label} (n={n})", marker="o" if len(xs) <= 12 else None, markersize=3)
        if n > 1:
            ax.fill_between(xs, lo, hi, color=color, alpha=0.2, linewidth=0)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def require_matplotlib():
    try:
        import matplotlib  # noqa: F401  # deferred: matplotlib is optional (the plot extra)
    except ImportError:
        raise ConfigError("plots need matplotlib: pip install 'mixrl[plot]' (or pass --no-plots)") from None


def curve_source(runs: Sequence[Run], metric: str) -> str:
    """'heldout' when every run has eval.jsonl rows, else 'training'."""
    return "heldout" if runs and all(r.evals for r in runs) else "training"


def make_plots(rows: list[MethodRow], out_dir: Path, metric: str, band: str = "minmax") -> tuple[dict[str, str], str]:
    """Write the PNGs into ``out_dir``; returns ({name: file name}, description of the learning curve)."""
    require_matplotlib()
    runs = [run for r in rows for run in r.runs]
    source = curve_source(runs, metric)
    band_text = "min–max over runs" if band == "minmax" else "±1 std over runs"
    plots: dict[str, str] = {}
    if source == "heldout":
        curves = {r.method: [([float(s) for s, _, _ in run.eval_points(metric)], [v for _, _, v in run.eval_points(metric)])
                             for run in r.runs] for r in rows}
        desc = f"held-out {metric} (eval.jsonl every trainer.eval_every steps, step 0 = before training)"
        ylabel = f"held-out {metric}"
    else:
        key = "accuracy" if metric == "accuracy" else metric
        curves = {r.method: [([float(x) for x in xs], ys) for xs, ys in (run.series(key) for run in r.runs)] for r in rows}
        desc = f"training {key} of the on-policy rollouts (metrics.jsonl; no eval.jsonl in every run, train with trainer.eval_every=N for held-out curves)"
        ylabel = f"training {key}"
    if any(xs for series in curves.values() for xs, _ in series):
        _plot(out_dir / "learning_curve.png", f"{desc}\nmean, band: {band_text}", ylabel, curves, band)
        plots["learning_curve"] = "learning_curve.png"
    for key, name, ylabel in (("reward_mean", "reward", "reward (mean over rollouts)"), ("entropy", "entropy", "entropy"),
                              ("mu", "mu", "mixing coefficient mu")):
        curves = {r.method: [run.series(key) for run in r.runs] for r in rows}
        curves = {m: s for m, s in curves.items() if any(xs for xs, _ in s)}  # mu: only methods that have it
        if not curves:
            continue
        _plot(out_dir / f"{name}.png", f"training {key} (metrics.jsonl)\nmean, band: {band_text}", ylabel, curves, band)
        plots[name] = f"{name}.png"
    return plots, desc


