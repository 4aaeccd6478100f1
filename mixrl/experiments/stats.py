"""Judging a claim "method A beats method B on a metric" from per-seed values.

Two tests of the difference of means ``mean(A) - mean(B)``, both at 95%, computed by
``scipy.stats``:

* :func:`welch` - Welch's unequal-variance t-test (two-sided), with the Welch-Satterthwaite
  degrees of freedom: ``scipy.stats.ttest_ind(a, b, equal_var=False)`` and its
  ``confidence_interval``.

  Formula: ``t = (mean(a) - mean(b)) / se``, ``se^2 = s_a^2/n_a + s_b^2/n_b``,
  ``df = se^4 / ((s_a^2/n_a)^2/(n_a-1) + (s_b^2/n_b)^2/(n_b-1))``, ``p = 2 P(T_df >= |t|)``,
  interval ``diff -+ t_{1-alpha/2, df} se`` ("The generalization of 'Student's' problem when
  several different population variances are involved", Welch 1947).
* :func:`bootstrap_ci` - a percentile bootstrap interval of the difference: each group is
  resampled with replacement, independently, ``resamples`` times, from a seeded generator
  (reproducible): ``scipy.stats.bootstrap(..., method="percentile", paired=False)``.

:func:`judge` turns them into a verdict, stated with the test that produced it:
``"agrees"`` (the difference is significant in the claimed direction), ``"disagrees"``
(significant the other way) or ``"not resolved at this budget"``. With ``test="welch"`` a
difference is significant when p < alpha; with ``test="bootstrap"`` when the interval
excludes 0. ``better="lower"`` claims (rollouts to a target) flip the direction.

:func:`holm` adjusts the p-values of many claims judged at once (Holm-Bonferroni, "A Simple
Sequentially Rejective Multiple Test Procedure", Holm 1979).

Values are plain floats (one per seed); scipy loads on first use (about 0.3 s), so importing
this module stays cheap.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass

AGREES = "agrees"
DISAGREES = "disagrees"
UNRESOLVED = "not resolved at this budget"
TESTS = ("welch", "bootstrap")


# --------------------------------------------------------------------------- t distribution
def t_two_sided_p(t: float, df: float) -> float:
    """Two-sided p-value of Student's t with ``df`` degrees of freedom: P(|T| >= |t|) (``scipy.stats.t``)."""
    if math.isinf(t):
        return 0.0
    from scipy.stats import t as student_t  # deferred: scipy loads in ~0.3 s; `mixrl --help` imports this module

    return float(2.0 * student_t.sf(abs(t), df))


def t_quantile(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t with ``df`` degrees of freedom (``scipy.stats.t.ppf``)."""
    from scipy.stats import t as student_t  # deferred: see t_two_sided_p

    return float(student_t.ppf(q, df))


# --------------------------------------------------------------------------- tests
@dataclass
class Welch:
    diff: float  # mean(a) - mean(b)
    t: float
    df: float
    p: float
    low: float  # 95% (1 - alpha) confidence interval of the difference
    high: float


def welch(a: Sequence[float], b: Sequence[float], alpha: float = 0.05) -> Welch:
    """Welch's t-test of mean(a) - mean(b), two-sided (``scipy.stats.ttest_ind(equal_var=False)``).
    Needs at least 2 values per group.

    Both groups without spread: p = 1 when the means are equal, else 0 (the difference is
    exact), and the interval is the difference itself (scipy returns NaN there)."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"Welch's t-test needs at least 2 values per group, got {len(a)} and {len(b)}")
    diff = statistics.fmean(a) - statistics.fmean(b)
    if statistics.variance(a) == 0.0 and statistics.variance(b) == 0.0:
        return Welch(diff, math.copysign(math.inf, diff) if diff else 0.0, math.inf, 0.0 if diff else 1.0, diff, diff)
    from scipy.stats import ttest_ind  # deferred: see t_two_sided_p

    with warnings.catch_warnings():  # one group constant (every run at its budget): scipy warns of precision loss, its result is exact
        warnings.filterwarnings("ignore", "Precision loss occurred", RuntimeWarning)
        res = ttest_ind([float(x) for x in a], [float(x) for x in b], equal_var=False)
    ci = res.confidence_interval(confidence_level=1.0 - alpha)
    return Welch(diff, float(res.statistic), float(res.df), float(res.pvalue), float(ci.low), float(ci.high))


def bootstrap_ci(a: Sequence[float], b: Sequence[float], *, alpha: float = 0.05, resamples: int = 10_000,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval (1 - alpha) of mean(a) - mean(b), the groups resampled
    independently (``scipy.stats.bootstrap``, ``paired=False``); seeded, reproducible.
    A group of one value is that value in every resample."""
    if not a or not b:
        raise ValueError("the bootstrap needs at least 1 value per group")
    import numpy as np  # deferred: see t_two_sided_p (numpy with scipy)
    from scipy.stats import bootstrap  # deferred: see t_two_sided_p

    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size < 2 and y.size < 2:
        d = float(x[0] - y[0])
        return d, d
    if x.size < 2 or y.size < 2:  # scipy resamples groups of two or more: the single value is a constant shift
        sign, data, shift = (1.0, x, -y[0]) if y.size < 2 else (-1.0, y, x[0])
        res = bootstrap((data,), np.mean, confidence_level=1.0 - alpha, n_resamples=resamples, method="percentile",
                        rng=np.random.default_rng(seed))
        ends = sorted(float(sign * v + shift) for v in (res.confidence_interval.low, res.confidence_interval.high))
        return ends[0], ends[1]

    def diff_of_means(u, v, axis=-1):
        return np.mean(u, axis=axis) - np.mean(v, axis=axis)

    res = bootstrap((x, y), diff_of_means, confidence_level=1.0 - alpha, n_resamples=resamples, method="percentile",
                    paired=False, vectorized=True, rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


# --------------------------------------------------------------------------- many claims at once
def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm-Bonferroni adjusted p-values ("A Simple Sequentially Rejective Multiple Test
    Procedure", Holm 1979), in the input's order; ``None`` (a claim without a test) stays None
    and does not count in the family.

    Formula: with the m p-values sorted, p_(1) <= ... <= p_(m),
    ``adj_(i) = min(1, max_{j <= i} (m - j + 1) p_(j))``; rejecting where ``adj < alpha`` is
    Holm's step-down procedure at family-wise error rate alpha."""
    idx = sorted((i for i, p in enumerate(pvalues) if p is not None), key=lambda i: pvalues[i])
    m, out, running = len(idx), list(pvalues), 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))
        out[i] = running
    return out


# --------------------------------------------------------------------------- verdicts
@dataclass
class Judgement:
    verdict: str  # agrees | disagrees | not resolved at this budget
    test: str  # the test the verdict comes from, in words
    diff: float | None  # mean(a) - mean(b)
    low: float | None  # the interval of the difference from the deciding test
    high: float | None
    p: float | None  # Welch's two-sided p-value (reported with either test)
    boot_low: float | None
    boot_high: float | None
    n_a: int
    n_b: int

    def as_dict(self) -> dict:
        return asdict(self)


def judge(a: Sequence[float], b: Sequence[float], *, better: str = "higher", test: str = "welch",
          alpha: float = 0.05, resamples: int = 10_000, seed: int = 0) -> Judgement:
    """Verdict on the claim "a is better than b" (``better``: higher or lower values win).

    ``test="welch"``: significant when Welch's p < alpha; ``"bootstrap"``: when the seeded
    percentile interval excludes 0. Fewer than 2 values in a group: not resolved."""
    if better not in ("higher", "lower"):
        raise ValueError(f"better must be 'higher' or 'lower', got {better!r}")
    if test not in TESTS:
        raise ValueError(f"test must be one of {', '.join(TESTS)}, got {test!r}")
    a, b = [float(x) for x in a], [float(x) for x in b]
    conf = f"{100 * (1 - alpha):g}%"
    name = (f"Welch t-test, two-sided, alpha {alpha:g}" if test == "welch"
            else f"bootstrap {conf} CI of the difference ({resamples} resamples, seed {seed})")
    diff = statistics.fmean(a) - statistics.fmean(b) if a and b else None
    if len(a) < 2 or len(b) < 2:
        return Judgement(UNRESOLVED, name + " (fewer than 2 seeds)", diff, None, None, None, None, None, len(a), len(b))
    w = welch(a, b, alpha)
    blo, bhi = bootstrap_ci(a, b, alpha=alpha, resamples=resamples, seed=seed)
    if test == "welch":
        significant, low, high = w.p < alpha, w.low, w.high
    else:
        significant, low, high = (blo > 0 or bhi < 0), blo, bhi
    sign = 1.0 if better == "higher" else -1.0
    if not significant or w.diff == 0:
        verdict = UNRESOLVED
    else:
        verdict = AGREES if sign * w.diff > 0 else DISAGREES
    return Judgement(verdict, name, w.diff, low, high, w.p, blo, bhi, len(a), len(b))


def mean_ci(values: Sequence[float], alpha: float = 0.05) -> tuple[float, float | None, float | None]:
    """Mean and its (1 - alpha) Student-t interval ``mean -+ t_{1-alpha/2, n-1} s / sqrt(n)`` (``scipy.stats.t``)
    (no interval for fewer than 2 values)."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("mean_ci needs at least one value")
    m = statistics.fmean(vals)
    if len(vals) < 2:
        return m, None, None
    half = t_quantile(1.0 - alpha / 2.0, len(vals) - 1) * statistics.stdev(vals) / math.sqrt(len(vals))
    return m, m - half, m + half
