"""Markdown for ``mixrl compare``: the method table, the per-level table, claims and per-run rows.

:func:`table_header` / :func:`table_cells` are shared with the terminal table of
:mod:`mixrl.cli.compare`; :func:`render_markdown` writes ``compare.md``.
"""

from __future__ import annotations

from collections.abc import Sequence

from mixrl.experiments.claims import render_claims, render_estimates
from mixrl.experiments.summary import MethodRow, by_level

# --------------------------------------------------------------------------- formatting
def fmt(v: float | None, digits: int = 3) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def fmt_pm(mean: float | None, std: float | None, digits: int = 3) -> str:
    if mean is None:
        return "–"
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if std is not None else f"{mean:.{digits}f}"


def fmt_rollouts(row: MethodRow) -> str:
    if row.with_evals == 0:
        return "n/a (no eval.jsonl)"
    if row.reached == 0:
        return f"not reached (0/{row.with_evals})"
    return f"{row.rollouts_mean:,.0f} ({row.reached}/{row.with_evals})"


def fmt_tokens(row: MethodRow) -> str:
    if row.tokens_reached == 0:
        return "–"
    return f"{row.tokens_mean:,.0f} ({row.tokens_reached}/{row.with_evals})"


TABLE_COLUMNS = ("method", "runs", "final {metric}", "best {metric}", "rollouts to {target}", "tokens to {target}", "collapsed",
                 "final entropy", "completion length", "steps")


def table_header(metric: str, target: float) -> list[str]:
    return [c.format(metric=metric, target=f"{metric} ≥ {target:g}") for c in TABLE_COLUMNS]


def table_cells(row: MethodRow) -> list[str]:
    return [
        row.method, str(row.n), fmt_pm(row.final_mean, row.final_std), fmt_pm(row.best_mean, row.best_std),
        fmt_rollouts(row), fmt_tokens(row), f"{row.collapsed}/{row.n}", fmt(row.entropy), fmt(row.completion_length, 1),
        fmt(row.steps, 0),
    ]


def _md_table(header: list[str], rows: list[list[str]], left: Sequence[int] = (0,)) -> str:
    """A Markdown table; columns in ``left`` (indices, negative from the end) are left-aligned, others right."""
    esc = [[c.replace("|", "\\|") for c in r] for r in [header, *rows]]
    left_cols = {i % len(header) for i in left}
    lines = ["| " + " | ".join(esc[0]) + " |", "|" + "|".join("---" if i in left_cols else "---:" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in esc[1:]]
    return "\n".join(lines)




def render_by_level(entries: list[dict]) -> str:
    measures = sorted({m for e in entries for m in e["measures"]}, key=lambda m: (m != "accuracy", int(m[5:]) if m.startswith("pass@") else 0))
    if not measures or all(set(e["measures"]) <= {"accuracy"} and e["level"] == "all" for e in entries):
        return ""
    header = ["method", "level", *[("greedy accuracy" if m == "accuracy" else m) for m in measures]]
    body = []
    for e in entries:
        cells = [e["method"], e["level"]]
        for m in measures:
            x = e["measures"].get(m)
            if x is None:
                cells.append("–")
                continue
            lo, hi = x["after_ci95"]
            ci = f" [{lo:.3f}, {hi:.3f}]" if lo is not None else ""
            cells.append(f"{fmt(x['before_mean'])} → {x['after_mean']:.3f}{ci}")
        body.append(cells)
    return _md_table(header, body, left=(0, 1))


CLAIMS_INTRO = (
    "Each claim compares the per-seed values of two methods. The verdict comes from the stated test at 95% "
    "(computed by `scipy.stats`): **agrees** / **disagrees** when the difference is significant in / against the claimed "
    "direction, else **not resolved at this budget**. The interval is the deciding test's interval of the difference "
    "(Welch: t-interval; bootstrap: percentile interval). The claims of a suite are judged together, so the table also "
    "gives each Welch p-value adjusted by Holm's step-down procedure over all the measured claims (\"A Simple "
    "Sequentially Rejective Multiple Test Procedure\", Holm 1979) and the verdict that stands at a family-wise error "
    "rate of 5%: **verdict (Holm)**.")

ESTIMATES_INTRO = (
    "The interval estimates of \"Deep Reinforcement Learning at the Edge of the Statistical Precipice\" (Agarwal et al. "
    "2021, arXiv:2108.13264; rliable): each side's interquartile mean over its seeds and P(method better than "
    "baseline) (Mann-Whitney U / (n m), ties one half), each with a 95% stratified percentile bootstrap interval "
    "(50,000 resamples, seeded).")


def render_claims_section(claims: Sequence[dict]) -> str:
    """``## Claims``: the verdicts (raw and under Holm) and the rliable interval estimates.
    ``mixrl rejudge`` replaces this section of a committed page with a new one."""
    out = ["## Claims", "", CLAIMS_INTRO, "", render_claims(claims), ""]
    estimates = render_estimates(claims)
    if estimates:
        out += ["### Interval estimates", "", ESTIMATES_INTRO, "", estimates, ""]
    return "\n".join(out).rstrip("\n")


def render_aggregate(aggregate: dict | None) -> str:
    """``## Over the levels``: rliable's IQM and probability of improvement per method (or "")."""
    if not aggregate:
        return ""
    base = aggregate["baseline"]
    header = ["method", "runs x levels", f"IQM of final {aggregate['measure']} [95% CI]"]
    if base:
        header.append(f"P(better than {base}) [95% CI]")
    body = []
    for m in aggregate["methods"]:
        cells = [m["method"], f"{m['runs']} x {m['tasks']}", f"{m['iqm']:.3f} [{m['iqm_low']:.3f}, {m['iqm_high']:.3f}]"]
        if base:
            cells.append("–" if m["poi"] is None else f"{m['poi']:.2f} [{m['poi_low']:.2f}, {m['poi_high']:.2f}]")
        body.append(cells)
    return "\n".join([
        "## Over the levels", "",
        f"Each level ({', '.join(aggregate['levels'])}) is a task, as in \"Deep Reinforcement Learning at the Edge of the "
        "Statistical Precipice\" (Agarwal et al. 2021, arXiv:2108.13264; rliable): the interquartile mean of the final "
        f"held-out `{aggregate['measure']}` over all runs and levels, and the probability that a run of the method beats a run "
        "of the baseline on a level (Mann-Whitney U / (n m), averaged over levels), each with a 95% stratified bootstrap "
        "interval (runs resampled within each level; 50,000 resamples, seeded).", "",
        _md_table(header, body), ""])


def render_markdown(rows: list[MethodRow], metric: str, target: float, plots: dict[str, str], curve_source: str,
                    inputs: Sequence[str] = (), claims: Sequence[dict] = (), aggregate: dict | None = None) -> str:
    out = [f"# mixrl compare: held-out `{metric}`", ""]
    if inputs:
        out += ["Runs from: " + ", ".join(f"`{p}`" for p in inputs), ""]
    out += [_md_table(table_header(metric, target), [table_cells(r) for r in rows]), ""]
    out += [
        f"- **final**: held-out `{metric}` after training (`summary.json` eval_after), mean ± sample std (n - 1) over runs.",
        f"- **best**: per run the max of `{metric}` over `eval.jsonl` and the final evaluation, then mean ± std over runs.",
        f"- **rollouts to {metric} ≥ {target:g}**: on-policy rollouts trained on when a held-out evaluation (before training "
        "= 0, every `eval.jsonl` row, after training) first reached the target; mean over the runs that reached it "
        "(reached/runs with eval.jsonl). Runs without `eval.jsonl` (train with `trainer.eval_every=N`) are not counted.",
        f"- **tokens to {metric} ≥ {target:g}**: the same, counting the generated completion tokens of those rollouts.",
        f"- **collapsed**: runs whose final `{metric}` is below half of their best held-out evaluation (before training included).",
        "- **final entropy**: mean token entropy of the on-policy rollouts at the last logged step; **completion length**: "
        "mean over all steps. Both are means over runs.",
        "",
    ]
    level_table = render_by_level(by_level(rows))
    if level_table:
        out += ["## Held-out accuracy and pass@k by level", "",
                "Before training (mean over runs) → after training: mean [95% t-interval] over runs. pass@k is the unbiased "
                "estimator from `trainer.eval_samples` samples per problem (\"Evaluating Large Language Models Trained on Code\", "
                "Chen et al. 2021).", "", level_table, ""]
    agg = render_aggregate(aggregate)
    if agg:
        out += [agg]
    if claims:
        out += [render_claims_section(claims), ""]
    out += ["## Runs", ""]
    per_run = []
    for r in rows:
        for run in r.runs:
            ro = run.rollouts_to(metric, target) if run.evals else None
            per_run.append([
                r.method, str(run.seed), fmt(run.final(metric)), fmt(run.best(metric)),
                ("n/a" if not run.evals else ("not reached" if ro is None else f"{ro:,.0f}")),
                str(run.steps), f"{run.rollouts:,}", f"`{run.path}`",
            ])
    out += [_md_table(["method", "seed", f"final {metric}", f"best {metric}", "rollouts to target", "steps", "rollouts", "run directory"], per_run, left=(0, -1)), ""]
    if plots:
        out += ["## Plots", ""]
        if "learning_curve" in plots:
            out += [f"Learning curve: {curve_source}.", ""]
        for name, file in plots.items():
            out += [f"![{name}]({file})", ""]
    return "\n".join(out)


