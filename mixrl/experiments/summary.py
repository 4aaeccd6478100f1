"""Per-method statistics of compared runs: runs grouped by method, then means and spreads over seeds.

:func:`group_runs` pools the runs of one method (recipe or algo, plus ``--by`` keys) and
splits them when their configs differ in anything but the seed; :func:`summarize` gives one
:class:`MethodRow` per method (final, best, rollouts and tokens to the target, collapse);
:func:`by_level` the held-out accuracy and pass@k per level before and after training.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
import hashlib

from mixrl.experiments.runs import Run, _num
from mixrl.experiments.stats import mean_ci

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
        flats.append(_flat(run.load_config()))
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


def level_scores(row: MethodRow, measure: str = "accuracy") -> tuple[list[str], list[list[float]]]:
    """The levels and the ``runs x levels`` matrix of ``measure`` after training (``eval_after``
    keys ``MEASURE/levelN``), for :func:`mixrl.experiments.intervals.suite_estimates`. A run that
    lacks one of the levels the method's runs share is left out."""
    per_run = []
    for run in row.runs:
        after = run.summary.get("eval_after") or {}
        vals = {}
        for k, v in after.items():
            m = _LEVEL_KEY.match(k)
            if m and m.group(1) == measure and m.group(2) is not None and _num(v) is not None:
                vals[m.group(2)] = float(v)
        per_run.append(vals)
    shared = set.intersection(*(set(v) for v in per_run)) if per_run else set()
    levels = sorted(shared, key=int)
    return levels, [[v[lv] for lv in levels] for v in per_run if levels]


def available_metrics(runs: Sequence[Run]) -> list[str]:
    keys: set[str] = set()
    for r in runs:
        keys.update(k for k, v in (r.summary.get("eval_after") or {}).items() if k not in ("n", "samples") and _num(v) is not None)
        for e in r.evals:
            keys.update(k for k, v in e.items() if k not in ("step", "rollouts", "n", "samples", "seconds", "stage") and _num(v) is not None)
    return sorted(keys)


