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
  seeds (:mod:`mixrl.experiments.claims`, :mod:`mixrl.experiments.stats`).

Everything here is pure Python over the files (no torch import); plots need matplotlib.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mixrl.errors import ConfigError, MixrlUserError

SUMMARY = "summary.json"
METRICS = "metrics.jsonl"
EVALS = "eval.jsonl"
CONFIG = "config.yaml"
_SKIP_DIRS = {"model", "trainer", ".git", "__pycache__", "wandb"}


class CompareError(MixrlUserError):
    """Nothing to compare, or a run directory that cannot be read."""


# --------------------------------------------------------------------------- reading
def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise CompareError(f"{path}:{i} is not valid JSON ({e.msg}); fix or delete the line") from None
    return rows


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) or math.isinf(f) else f


@dataclass
class Run:
    """One run directory, read."""

    path: Path
    summary: dict
    metrics: list[dict] = field(default_factory=list)  # metrics.jsonl rows (staged runs: the combined file)
    evals: list[dict] = field(default_factory=list)  # eval.jsonl rows, stages merged with continuous step/rollouts
    config: dict | None = None  # config.yaml, read only when grouping by config keys

    @property
    def seed(self) -> Any:
        return self.summary.get("seed")

    @property
    def method(self) -> str:
        return str(self.summary.get("recipe") or self.summary.get("algo") or "?")

    @property
    def steps(self) -> int:
        return int(self.summary.get("steps") or (self.metrics[-1].get("step", 0) if self.metrics else 0))

    @property
    def rollouts(self) -> int:
        return int(self.summary.get("rollouts") or 0)

    def eval_points(self, metric: str) -> list[tuple[int, float, float]]:
        """Held-out evaluations of ``metric`` as ``(step, rollouts, value)``, by step: before
        training (step 0), every ``eval.jsonl`` row, after training (the last step)."""
        pts: dict[int, tuple[int, float, float]] = {}
        before = _num((self.summary.get("eval_before") or {}).get(metric))
        if before is not None:
            pts[0] = (0, 0.0, before)
        for r in self.evals:
            v, s = _num(r.get(metric)), r.get("step")
            if v is None or s is None:
                continue
            ro = _num(r.get("rollouts"))
            if ro is None:  # older rows: assume a constant number of rollouts per step
                ro = self.rollouts * int(s) / max(self.steps, 1)
            pts[int(s)] = (int(s), ro, v)
        after = _num((self.summary.get("eval_after") or {}).get(metric))
        if after is not None and self.steps not in pts:
            pts[self.steps] = (self.steps, float(self.rollouts), after)
        return [pts[k] for k in sorted(pts)]

    def final(self, metric: str) -> float | None:
        after = self.summary.get("eval_after") or {}
        if metric in after:
            return _num(after[metric])
        if metric == "accuracy":
            return _num(self.summary.get("accuracy_after"))
        return None

    def best(self, metric: str) -> float | None:
        vals = [v for s, _, v in self.eval_points(metric) if s > 0]
        return max(vals) if vals else None

    def rollouts_to(self, metric: str, target: float) -> float | None:
        """Rollouts trained on when a held-out evaluation first reached ``target`` (None: never)."""
        for _, ro, v in self.eval_points(metric):
            if v >= target - 1e-12:
                return ro
        return None

    @property
    def generated_tokens(self) -> int | None:
        v = self.summary.get("generated_tokens")
        return None if v is None else int(v)

    def tokens_to(self, metric: str, target: float) -> float | None:
        """Generated completion tokens when a held-out evaluation first reached ``target``
        (None: never, or the run did not record them)."""
        tokens = {0: 0.0}
        for r in self.evals:
            if r.get("step") is not None and _num(r.get("generated_tokens")) is not None:
                tokens[int(r["step"])] = float(r["generated_tokens"])
        if self.generated_tokens is not None:
            tokens.setdefault(self.steps, float(self.generated_tokens))
        for s, _, v in self.eval_points(metric):
            if v >= target - 1e-12:
                return tokens.get(s)
        return None

    def collapsed(self, metric: str) -> bool | None:
        """Whether the final ``metric`` fell below half of the best held-out evaluation
        (before training included); None without a final value."""
        final = self.final(metric)
        vals = [v for _, _, v in self.eval_points(metric)]
        if final is None or not vals:
            return None
        best = max(vals)
        return best > 0 and final < 0.5 * best

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """``(steps, values)`` of a metrics.jsonl column (rows without a value skipped)."""
        xs, ys = [], []
        for r in self.metrics:
            v = _num(r.get(key))
            if v is not None and r.get("step") is not None:
                xs.append(int(r["step"]))
                ys.append(v)
        return xs, ys

    def last(self, key: str) -> float | None:
        _, ys = self.series(key)
        return ys[-1] if ys else None

    def mean(self, key: str) -> float | None:
        _, ys = self.series(key)
        return sum(ys) / len(ys) if ys else None

    def config_value(self, key: str) -> Any:
        if key in ("seed", "algo", "recipe"):
            return self.summary.get(key)
        if self.config is None:
            import yaml

            p = self.path / CONFIG
            self.config = yaml.safe_load(p.read_text()) if p.is_file() else {}
        node: Any = self.config
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                raise CompareError(f"--by {key}: run {self.path} has no config value '{key}' (see its config.yaml)")
            node = node[part]
        return node


def find_runs(paths: Iterable[str | Path]) -> list[Path]:
    """Every run directory at or below ``paths`` (a folder holding summary.json), sorted,
    without duplicates; a run's own sub-folders (stages) are not searched."""
    found: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise CompareError(f"'{p}' does not exist; give run directories or folders that contain runs")
        if not p.is_dir():
            raise CompareError(f"'{p}' is not a directory; give run directories or folders that contain runs")
        n = len(found)
        for root, dirs, files in os.walk(p):
            if SUMMARY in files:
                found.append(Path(root))
                dirs[:] = []
                continue
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        if len(found) == n:
            raise CompareError(f"no run found in '{p}': a run directory holds {SUMMARY} (written when training finishes)")
    unique = {q.resolve(): q for q in found}
    return [unique[k] for k in sorted(unique)]


def load_run(path: str | Path) -> Run:
    path = Path(path)
    try:
        summary = json.loads((path / SUMMARY).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CompareError(f"cannot read {path / SUMMARY}: {e}") from None
    run = Run(path=path, summary=summary, metrics=_read_jsonl(path / METRICS))
    stages = summary.get("stages")
    if stages:  # a staged run: each stage folder has its own eval.jsonl; make step and rollouts continuous
        step0, ro0, tok0 = 0, 0, 0
        for st in stages:
            sdir = Path(st.get("run_dir") or "")
            if not sdir.is_dir():  # the run was moved: stage folders sit inside it
                sdir = path / Path(st.get("run_dir", "")).name
            ssum = {}
            if (sdir / SUMMARY).is_file():
                ssum = json.loads((sdir / SUMMARY).read_text())
            for r in _read_jsonl(sdir / EVALS):
                r = dict(r, step=int(r["step"]) + step0, stage=st.get("name"))
                if r.get("rollouts") is not None:
                    r["rollouts"] = r["rollouts"] + ro0
                if r.get("generated_tokens") is not None:
                    r["generated_tokens"] = r["generated_tokens"] + tok0
                run.evals.append(r)
            step0 += int(st.get("steps") or ssum.get("steps") or 0)
            ro0 += int(ssum.get("rollouts") or 0)
            tok0 += int(ssum.get("generated_tokens") or 0)
    else:
        run.evals = _read_jsonl(path / EVALS)
    run.evals.sort(key=lambda r: r.get("step", 0))
    return run


# --------------------------------------------------------------------------- statistics
def mean_std(values: Sequence[float | None]) -> tuple[float | None, float | None, int]:
    """Mean, sample std (n - 1; None for fewer than 2 values) and count of the non-missing values."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None, None, 0
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else None), len(vals)


@dataclass
class MethodRow:
    method: str
    runs: list[Run]
    final_mean: float | None
    final_std: float | None
    best_mean: float | None
    best_std: float | None
    rollouts_mean: float | None  # over the runs that reached the target
    reached: int  # runs that reached the target
    with_evals: int  # runs with eval.jsonl (rollouts to target is measured only for them)
    entropy: float | None
    completion_length: float | None
    steps: float | None
    wall_seconds: float | None
    tokens_mean: float | None = None  # generated tokens to the target, over the runs that reached it
    tokens_reached: int = 0
    collapsed: int = 0  # runs whose final metric is below half their best

    @property
    def n(self) -> int:
        return len(self.runs)

    @property
    def seeds(self) -> list:
        return [r.seed for r in self.runs]


#: config keys (prefixes) that may differ between the seeds of one method
SEED_ONLY = ("seed", "run_dir", "resume", "logger", "recipe_info", "hardware.torch_threads", "trainer.eval_every",
             "trainer.eval_before_cache",
             "trainer.eval_batch_size", "trainer.save_steps", "trainer.save_total_limit")


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: json.dumps(node, sort_keys=True, default=str)}


def config_differences(runs: Sequence[Run]) -> list[str]:
    """Config keys whose values differ between ``runs``, other than seed-like keys (:data:`SEED_ONLY`)."""
    flats = []
    for run in runs:
        if run.config is None:
            import yaml

            p = run.path / CONFIG
            run.config = yaml.safe_load(p.read_text()) if p.is_file() else {}
        flats.append(_flat(run.config or {}))
    keys = sorted(set().union(*flats)) if flats else []
    return [k for k in keys
            if not any(k == s or k.startswith(s + ".") for s in SEED_ONLY)
            and len({f.get(k) for f in flats}) > 1]


def group_runs(runs: Sequence[Run], by: Sequence[str] = ()) -> dict[str, list[Run]]:
    """Runs by method label (``recipe`` or ``algo``, plus ``key=value`` for each ``by`` key),
    in order of first appearance. Runs of one label whose configs differ in anything but
    the seed (:func:`config_differences`) are not pooled: the differing keys join their label."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        label = run.method
        if by:
            label += " " + ",".join(f"{k}={_fmt_value(run.config_value(k))}" for k in by)
        groups.setdefault(label, []).append(run)
    split: dict[str, list[Run]] = {}
    for label, members in groups.items():
        diff = config_differences(members) if len(members) > 1 else []
        for run in members:
            sub = label
            if diff:
                sub += " " + ",".join(f"{k}={_fmt_value(run.config_value(k))}" for k in diff[:3])
                if len(diff) > 3:  # the other differing values, as a short digest
                    import hashlib

                    rest = json.dumps([_flat(run.config).get(k) for k in diff[3:]])
                    sub += f",+{len(diff) - 3} more keys #{hashlib.sha1(rest.encode()).hexdigest()[:6]}"
            split.setdefault(sub, []).append(run)
    return split


def _fmt_value(v: Any) -> str:
    if isinstance(v, dict) and "name" in v:  # a component or schedule: its name and parameters
        rest = ",".join(f"{k}={_fmt_value(x)}" for k, x in v.items() if k != "name")
        return f"{v['name']}({rest})" if rest else str(v["name"])
    return str(v)


def summarize(groups: dict[str, list[Run]], metric: str = "accuracy", target: float = 0.6) -> list[MethodRow]:
    rows = []
    for label, runs in groups.items():
        fm, fs, _ = mean_std([r.final(metric) for r in runs])
        bm, bs, _ = mean_std([r.best(metric) for r in runs])
        with_evals = [r for r in runs if r.evals]
        reached = [x for x in (r.rollouts_to(metric, target) for r in with_evals) if x is not None]
        tokens = [x for x in (r.tokens_to(metric, target) for r in with_evals) if x is not None]
        rows.append(MethodRow(
            method=label, runs=list(runs), final_mean=fm, final_std=fs, best_mean=bm, best_std=bs,
            rollouts_mean=statistics.fmean(reached) if reached else None, reached=len(reached), with_evals=len(with_evals),
            entropy=mean_std([r.last("entropy") for r in runs])[0],
            completion_length=mean_std([r.mean("completion_length") for r in runs])[0],
            steps=mean_std([float(r.steps) for r in runs])[0],
            wall_seconds=mean_std([_num(r.summary.get("wall_seconds")) for r in runs])[0],
            tokens_mean=statistics.fmean(tokens) if tokens else None, tokens_reached=len(tokens),
            collapsed=sum(1 for r in runs if r.collapsed(metric)),
        ))
    return rows


_LEVEL_KEY = re.compile(r"^(accuracy|pass@\d+)(?:/level(\d+))?$")


def by_level(rows: list[MethodRow]) -> list[dict]:
    """Held-out greedy accuracy and pass@k per level (and over all levels), before and after
    training: per method and level, for each measure present in ``eval_after``, the mean of
    the evaluations before training and the mean, std and 95% t-interval after, over runs."""
    from mixrl.experiments.stats import mean_ci

    out = []
    for row in rows:
        keys: set[str] = set()
        for run in row.runs:
            keys.update(k for k in (run.summary.get("eval_after") or {}) if _LEVEL_KEY.match(k))
        levels: dict[str, dict[str, str]] = {}
        for k in keys:
            measure, level = _LEVEL_KEY.match(k).groups()
            levels.setdefault(level or "all", {})[measure] = k
        for level in sorted(levels, key=lambda x: (x != "all", int(x) if x.isdigit() else 0)):
            entry: dict[str, Any] = {"method": row.method, "level": level, "measures": {}}
            for measure in sorted(levels[level], key=lambda m: (m != "accuracy", int(m[5:]) if m.startswith("pass@") else 0)):
                k = levels[level][measure]
                before = [v for v in (_num((r.summary.get("eval_before") or {}).get(k)) for r in row.runs) if v is not None]
                after = [v for v in (_num((r.summary.get("eval_after") or {}).get(k)) for r in row.runs) if v is not None]
                if not after:
                    continue
                m, lo, hi = mean_ci(after)
                entry["measures"][measure] = {
                    "key": k, "before_mean": statistics.fmean(before) if before else None, "after_mean": m,
                    "after_std": statistics.stdev(after) if len(after) > 1 else None, "after_ci95": [lo, hi], "n": len(after),
                }
            out.append(entry)
    return out


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


def available_metrics(runs: Sequence[Run]) -> list[str]:
    keys: set[str] = set()
    for r in runs:
        keys.update(k for k, v in (r.summary.get("eval_after") or {}).items() if k not in ("n", "samples") and _num(v) is not None)
        for e in r.evals:
            keys.update(k for k, v in e.items() if k not in ("step", "rollouts", "n", "samples", "seconds", "stage") and _num(v) is not None)
    return sorted(keys)


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


def render_markdown(rows: list[MethodRow], metric: str, target: float, plots: dict[str, str], curve_source: str,
                    inputs: Sequence[str] = (), claims: Sequence[dict] = ()) -> str:
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
    if claims:
        from mixrl.experiments.claims import render_claims

        out += ["## Claims", "",
                "Each claim compares the per-seed values of two methods. The verdict comes from the stated test at 95%: "
                "**agrees** / **disagrees** when the difference is significant in / against the claimed direction, else "
                "**not resolved at this budget**. The interval is the deciding test's interval of the difference "
                "(Welch: t-interval; bootstrap: percentile interval).", "", render_claims(claims), ""]
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
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

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
        import matplotlib  # noqa: F401
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


# --------------------------------------------------------------------------- entry point
@dataclass
class CompareResult:
    rows: list[MethodRow]
    out_dir: Path
    markdown: Path
    plots: dict[str, str]
    curve_source: str
    claims: list = field(default_factory=list)


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
        from mixrl.errors import did_you_mean

        raise CompareError(
            f"no run has held-out metric '{metric}'{did_you_mean(metric, metrics)}; available: {', '.join(metrics) or 'none'}"
        )
    groups = group_runs(runs, by)
    rows = summarize(groups, metric, target)
    judged = []
    if claims:
        from mixrl.experiments.claims import judge_claims

        judged = judge_claims(list(claims), groups)
    levels = by_level(rows)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written, desc = (make_plots(rows, out, metric, band) if plots else ({}, curve_source(runs, metric)))
    md = out / "compare.md"
    md.write_text(render_markdown(rows, metric, target, written, desc, [str(p) for p in paths], judged))
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
        "plots": written,
    }
    (out / "compare.json").write_text(json.dumps(data, indent=2))
    return CompareResult(rows, out, md, written, desc, judged)
