"""Judging a claim "method A beats method B on a metric" from per-seed values.

Two tests of the difference of means ``mean(A) - mean(B)``, both at 95%:

* :func:`welch` - Welch's unequal-variance t-test (two-sided), with the Welch-Satterthwaite
  degrees of freedom; the p-value comes from the Student t distribution via the regularised
  incomplete beta function (no scipy).
* :func:`bootstrap_ci` - a percentile bootstrap interval of the difference: each group is
  resampled with replacement, ``resamples`` times, from a seeded generator (reproducible).

:func:`judge` turns them into a verdict, stated with the test that produced it:
``"agrees"`` (the difference is significant in the claimed direction), ``"disagrees"``
(significant the other way) or ``"not resolved at this budget"``. With ``test="welch"`` a
difference is significant when p < alpha; with ``test="bootstrap"`` when the interval
excludes 0. ``better="lower"`` claims (rollouts to a target) flip the direction.

Pure Python; values are plain floats (one per seed).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

AGREES = "agrees"
DISAGREES = "disagrees"
UNRESOLVED = "not resolved at this budget"
TESTS = ("welch", "bootstrap")


# --------------------------------------------------------------------------- t distribution
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 3e-16
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """Two-sided p-value of Student's t with ``df`` degrees of freedom: P(|T| >= |t|)."""
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


# --------------------------------------------------------------------------- tests
@dataclass
class Welch:
    diff: float  # mean(a) - mean(b)
    t: float
    df: float
    p: float
    low: float  # 95% (1 - alpha) confidence interval of the difference
    high: float


def _t_quantile(q: float, df: float) -> float:
    """The ``q`` quantile (q > 0.5) of Student's t, by bisection on :func:`t_two_sided_p`."""
    target = 2.0 * (1.0 - q)
    lo, hi = 0.0, 1.0
    while t_two_sided_p(hi, df) > target:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_two_sided_p(mid, df) > target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def welch(a: Sequence[float], b: Sequence[float], alpha: float = 0.05) -> Welch:
    """Welch's t-test of mean(a) - mean(b), two-sided. Needs at least 2 values per group.

    Both groups without spread: p = 1 when the means are equal, else 0 (the difference is
    exact), and the interval is the difference itself."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"Welch's t-test needs at least 2 values per group, got {len(a)} and {len(b)}")
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    diff = ma - mb
    se2 = va + vb
    if se2 == 0.0:
        return Welch(diff, math.copysign(math.inf, diff) if diff else 0.0, math.inf, 0.0 if diff else 1.0, diff, diff)
    se = math.sqrt(se2)
    df = se2 * se2 / ((va * va) / (len(a) - 1) + (vb * vb) / (len(b) - 1))
    t = diff / se
    half = _t_quantile(1.0 - alpha / 2.0, df) * se
    return Welch(diff, t, df, t_two_sided_p(t, df), diff - half, diff + half)


def bootstrap_ci(a: Sequence[float], b: Sequence[float], *, alpha: float = 0.05, resamples: int = 10_000,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval (1 - alpha) of mean(a) - mean(b); seeded, reproducible."""
    if not a or not b:
        raise ValueError("the bootstrap needs at least 1 value per group")
    rng = random.Random(seed)
    na, nb = len(a), len(b)
    diffs = sorted(
        sum(rng.choices(a, k=na)) / na - sum(rng.choices(b, k=nb)) / nb for _ in range(resamples)
    )
    lo_i = int(math.floor(alpha / 2.0 * resamples))
    hi_i = int(math.ceil((1.0 - alpha / 2.0) * resamples)) - 1
    return diffs[lo_i], diffs[min(hi_i, resamples - 1)]


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
    """Mean and its (1 - alpha) Student-t interval ``mean -+ t_{1-alpha/2, n-1} s / sqrt(n)``
    (no interval for fewer than 2 values)."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("mean_ci needs at least one value")
    m = statistics.fmean(vals)
    if len(vals) < 2:
        return m, None, None
    half = _t_quantile(1.0 - alpha / 2.0, len(vals) - 1) * statistics.stdev(vals) / math.sqrt(len(vals))
    return m, m - half, m + half
