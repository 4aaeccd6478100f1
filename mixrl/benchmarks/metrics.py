"""Benchmark metrics over k samples per problem, each with a 95% confidence interval.

For a problem with ``n`` samples of which ``c`` are correct:

* ``avg@k``: mean correctness of the samples. Formula: ``avg = (1/P) sum_p c_p / n`` (all ``n``
  samples are used; with ``n = k`` it is the papers' "avg@k", an estimate of pass@1);
* ``pass@k``: unbiased estimator of "Evaluating Large Language Models Trained on Code" (Chen et
  al., 2021, arXiv:2107.03374). Formula: ``pass@k = (1/P) sum_p [1 - C(n - c_p, k) / C(n, k)]``
  (:func:`mixrl.evaluation.accuracy.pass_at_k`);
* ``maj@k``: majority vote over the first ``k`` samples of each problem. Formula:
  ``maj@k = (1/P) sum_p 1[the most frequent extracted answer among samples 1..k is correct]``;
  ties go to the answer seen first, and samples with no answer do not vote (a problem with none
  counts as wrong).

Interval: every number is a mean over problems of a per-problem value, and its interval is the
**percentile bootstrap over problems** (``scipy.stats.bootstrap``, 95%, 2000 resamples, seeded),
which needs no normality assumption and stays inside [0, 1]; it measures the spread from the
choice of problems and samples, not from the model's weights. With one problem, or every
problem at the same value, the interval is that value. The suite's average (the mean of the
benchmarks' values) gets a **stratified** bootstrap: problems are resampled within each
benchmark (``scipy.stats.bootstrap`` with one sample per benchmark, unpaired).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from mixrl.benchmarks.spec import parse_metric
from mixrl.evaluation.accuracy import pass_at_k

CONFIDENCE = 0.95
RESAMPLES = 2000


def per_problem(metric: str, correct: Sequence[bool], votes: Sequence[str | None] = ()) -> float:
    """One problem's value of ``metric`` (``avg@k`` / ``pass@k`` / ``maj@k``) from its samples'
    correctness (in sample order) and, for ``maj@k``, their vote keys."""
    kind, k = parse_metric(metric, "metric")
    n, c = len(correct), int(sum(bool(x) for x in correct))
    if k > n:
        raise ValueError(f"{metric} needs at least {k} samples, got {n}")
    if kind == "avg":
        return c / n
    if kind == "pass":
        return pass_at_k(n, c, k)
    first = [(v, bool(ok)) for v, ok in zip(list(votes)[:k], list(correct)[:k]) if v is not None]
    if not first:
        return 0.0
    counts = Counter(v for v, _ in first)
    best = max(counts.values())
    winner = next(v for v, _ in first if counts[v] == best)  # ties: the answer seen first
    return float(any(ok for v, ok in first if v == winner))


def interval(values: Sequence[float], *, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the mean of ``values`` (one per problem)."""
    x = np.asarray(values, dtype=float)
    if x.size <= 1 or np.all(x == x[0]):
        v = float(x.mean()) if x.size else float("nan")
        return v, v
    from scipy.stats import bootstrap  # deferred: scipy loads in ~0.3 s; only a table needs it

    res = bootstrap((x,), np.mean, confidence_level=CONFIDENCE, n_resamples=RESAMPLES, method="percentile",
                    rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def stratified_interval(groups: Sequence[Sequence[float]], *, seed: int = 0) -> tuple[float, float]:
    """95% interval of the mean over groups of each group's mean, problems resampled within each group."""
    arrays = [np.asarray(g, dtype=float) for g in groups if len(g)]
    if not arrays:
        return float("nan"), float("nan")
    point = float(np.mean([a.mean() for a in arrays]))
    if all(a.size <= 1 or np.all(a == a[0]) for a in arrays):
        return point, point
    from scipy.stats import bootstrap  # deferred: see interval()

    def stat(*xs, axis=-1):
        return np.mean([np.mean(x, axis=axis) for x in xs], axis=0)

    res = bootstrap(tuple(arrays), stat, confidence_level=CONFIDENCE, n_resamples=RESAMPLES, method="percentile",
                    paired=False, vectorized=True, rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def benchmark_metrics(metrics: Sequence[str], correct: Sequence[Sequence[bool]],
                      votes: Sequence[Sequence[str | None]], *, seed: int = 0) -> dict[str, dict]:
    """``{metric: {"value", "low", "high", "per_problem"}}`` for one benchmark
    (``correct[p]`` / ``votes[p]``: problem p's samples in order)."""
    out = {}
    for m in metrics:
        values = [per_problem(m, c, v) for c, v in zip(correct, votes)]
        low, high = interval(values, seed=seed)
        out[m] = {"value": float(np.mean(values)) if values else float("nan"), "low": low, "high": high,
                  "per_problem": values}
    return out
