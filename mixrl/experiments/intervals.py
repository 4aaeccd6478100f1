"""Interval estimates for RL results over few runs, as "Deep Reinforcement Learning at the Edge
of the Statistical Precipice" (Agarwal et al. 2021, arXiv:2108.13264) recommends and its
library rliable implements (google-research/rliable @ 3ccd9f4d, ``rliable/metrics.py`` and
``rliable/library.py``): the interquartile mean, stratified bootstrap confidence intervals and
the probability of improvement.

Scores are a ``runs x tasks`` matrix per method (here a task is one held-out measure, e.g.
``accuracy/level5``; a claim over one measure is a one-column matrix).

* :func:`iqm` - interquartile mean: the 25%-trimmed mean over all runs and tasks
  (``scipy.stats.trim_mean(scores, 0.25, axis=None)``, as ``rliable.metrics.aggregate_iqm``).

  Formula: sort the N = runs x tasks scores, drop the lowest and highest ``floor(N / 4)``,
  average the rest.
* :func:`probability_of_improvement` - P(X > Y): per task the Mann-Whitney U statistic of X
  over Y divided by ``n m`` (ties count one half), averaged over tasks
  (``rliable.metrics.probability_of_improvement``).

  Formula: ``P(X > Y) = 1/T sum_t 1/(n m) sum_i sum_j S(x_it, y_jt)``, S = 1 if x > y,
  1/2 if equal, 0 otherwise.
* :func:`stratified_bootstrap_ci` - the percentile interval of an aggregate when the runs are
  resampled with replacement *within each task* (``rliable.library.StratifiedBootstrap``, and
  for two methods ``StratifiedIndependentBootstrap``: each method's runs resampled
  independently), ``resamples`` times from a seeded generator.

The rliable package itself pulls arch, statsmodels, seaborn and their dependencies (nine
packages) for these few lines, so they are written here with numpy and scipy and tested
against hand values (``tests/test_intervals.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

#: rliable's defaults (``get_interval_estimates``: reps=50000, 95%)
RESAMPLES = 50_000
CONFIDENCE = 0.95


def _matrix(scores) -> np.ndarray:
    """``runs x tasks`` as floats; a flat sequence is one task."""
    x = np.asarray(scores, dtype=float)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"scores must be a non-empty runs x tasks matrix, got shape {x.shape}")
    return x


def iqm(scores) -> float:
    """Interquartile mean over all runs and tasks (25% trimmed mean; rliable ``aggregate_iqm``)."""
    from scipy.stats import trim_mean  # deferred: scipy loads in ~0.3 s; `mixrl --help` imports this module

    return float(trim_mean(_matrix(scores), proportiontocut=0.25, axis=None))


def _iqm_batched(x: np.ndarray) -> np.ndarray:
    """IQM of each ``x[r]`` (shape ``resamples x runs x tasks``)."""
    from scipy.stats import trim_mean  # deferred: see iqm

    return trim_mean(x.reshape(x.shape[0], -1), proportiontocut=0.25, axis=1)


def _poi_batched(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) of each resample (``x``: resamples x n x tasks, ``y``: resamples x m x tasks)."""
    gt = (x[:, :, None, :] > y[:, None, :, :]).mean(axis=(1, 2))
    eq = (x[:, :, None, :] == y[:, None, :, :]).mean(axis=(1, 2))
    return (gt + 0.5 * eq).mean(axis=-1)


def probability_of_improvement(x, y) -> float:
    """P(X > Y) averaged over tasks, from each task's Mann-Whitney U / (n m) (rliable
    ``probability_of_improvement``; ``scipy.stats.mannwhitneyu``)."""
    from scipy.stats import mannwhitneyu  # deferred: see iqm

    x, y = _matrix(x), _matrix(y)
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"X and Y need the same tasks, got {x.shape[1]} and {y.shape[1]}")
    per_task = []
    for t in range(x.shape[1]):
        if np.array_equal(x[:, t], y[:, t]):
            per_task.append(0.5)
        else:
            u = mannwhitneyu(x[:, t], y[:, t], alternative="greater").statistic
            per_task.append(float(u) / (x.shape[0] * y.shape[0]))
    return float(np.mean(per_task))


def _resample(x: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    """``resamples`` stratified resamples of ``x`` (runs x tasks): runs drawn with replacement
    within each task, independently per task (rliable ``StratifiedBootstrap``)."""
    idx = rng.integers(0, x.shape[0], size=(resamples, x.shape[0], x.shape[1]))
    return np.take_along_axis(np.broadcast_to(x, (resamples, *x.shape)), idx, axis=1)


def stratified_bootstrap_ci(aggregate: Callable[..., np.ndarray], *scores, resamples: int = RESAMPLES,
                            confidence: float = CONFIDENCE, seed: int = 0) -> tuple[float, float]:
    """Percentile interval of ``aggregate(*resampled)`` where each of ``scores`` (runs x tasks
    matrices, one per method) is resampled by runs within each task, independently of the others.
    ``aggregate`` takes the batched resamples (``resamples x runs x tasks`` each) and returns one
    value per resample (:data:`AGGREGATES` holds IQM and the probability of improvement)."""
    mats = [_matrix(s) for s in scores]
    rng = np.random.default_rng(seed)
    values = aggregate(*[_resample(m, rng, resamples) for m in mats])
    tail = 100.0 * (1.0 - confidence) / 2.0
    low, high = np.percentile(values, [tail, 100.0 - tail])
    return float(low), float(high)


#: batched aggregates for :func:`stratified_bootstrap_ci`
AGGREGATES: dict[str, Callable[..., np.ndarray]] = {"iqm": _iqm_batched, "poi": _poi_batched}


def claim_estimates(a: Sequence[float], b: Sequence[float], *, better: str = "higher", resamples: int = RESAMPLES,
                    seed: int = 0) -> dict:
    """A claim's rliable numbers: each side's IQM over seeds with its stratified bootstrap 95%
    interval, and P(method better than baseline) with its interval (``better="lower"``: the
    values are negated first, so the probability is still that the method is better)."""
    x, y = _matrix(a), _matrix(b)
    sign = 1.0 if better == "higher" else -1.0
    out = {"iqm_method": iqm(x), "iqm_baseline": iqm(y)}
    out["iqm_method_low"], out["iqm_method_high"] = stratified_bootstrap_ci(_iqm_batched, x, resamples=resamples, seed=seed)
    out["iqm_baseline_low"], out["iqm_baseline_high"] = stratified_bootstrap_ci(_iqm_batched, y, resamples=resamples,
                                                                                seed=seed + 1)
    out["poi"] = probability_of_improvement(sign * x, sign * y)
    out["poi_low"], out["poi_high"] = stratified_bootstrap_ci(_poi_batched, sign * x, sign * y, resamples=resamples,
                                                              seed=seed)
    return out


def suite_estimates(scores: dict[str, Sequence[Sequence[float]]], *, baseline: str | None = None,
                    resamples: int = RESAMPLES, seed: int = 0) -> list[dict]:
    """Per method (``scores``: method -> runs x tasks, the same tasks for every method): the IQM over
    runs and tasks with its stratified bootstrap 95% interval and, against ``baseline`` (when it is
    one of the methods), P(method > baseline) averaged over tasks with its interval; the figures
    the paper draws for a suite (its Fig. 1 and Fig. 8)."""
    out = []
    base = _matrix(scores[baseline]) if baseline in scores else None
    for i, (method, s) in enumerate(scores.items()):
        x = _matrix(s)
        low, high = stratified_bootstrap_ci(_iqm_batched, x, resamples=resamples, seed=seed + i)
        row = {"method": method, "runs": x.shape[0], "tasks": x.shape[1], "iqm": iqm(x), "iqm_low": low, "iqm_high": high,
               "poi": None, "poi_low": None, "poi_high": None}
        if base is not None and method != baseline:
            row["poi"] = probability_of_improvement(x, base)
            row["poi_low"], row["poi_high"] = stratified_bootstrap_ci(_poi_batched, x, base, resamples=resamples, seed=seed + i)
        out.append(row)
    return out
