"""mixrl.experiments.stats: Welch's t-test, the bootstrap interval, Holm's adjustment and verdicts, against hand
computations, textbook values and the hand-written incomplete-beta code they replace (mixrl.experiments.stats at
commit 99786f1)."""

from __future__ import annotations

import math

import pytest

from mixrl.experiments.stats import AGREES, DISAGREES, UNRESOLVED, bootstrap_ci, holm, judge, mean_ci, t_quantile, t_two_sided_p, welch


def test_t_p_value_matches_closed_forms():
    for t in (0.3, 1.0, 2.5, 7.0):
        # df = 1 (Cauchy): P(|T| >= t) = 1 - 2 atan(t) / pi
        assert t_two_sided_p(t, 1) == pytest.approx(1 - 2 * math.atan(t) / math.pi, abs=1e-10)
        # df = 2: P(|T| >= t) = 1 - t / sqrt(2 + t^2)
        assert t_two_sided_p(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), abs=1e-10)
    # large df tends to the normal: P(|Z| >= 1.959964) = 0.05
    assert t_two_sided_p(1.959964, 1e7) == pytest.approx(0.05, abs=1e-5)
    # the textbook quantile t_{0.975, 4} = 2.776445
    assert t_two_sided_p(2.776445, 4) == pytest.approx(0.05, abs=1e-6)
    # textbook table quantiles: t_{0.975, 4} = 2.776, t_{0.975, 10} = 2.228, t_{0.995, 5} = 4.032
    assert t_quantile(0.975, 4) == pytest.approx(2.776445, abs=1e-6)
    assert t_quantile(0.975, 10) == pytest.approx(2.228139, abs=1e-6)
    assert t_quantile(0.995, 5) == pytest.approx(4.032143, abs=1e-6)


def test_scipy_agrees_with_the_hand_written_code_it_replaces():
    # values of welch / mean_ci from the incomplete-beta implementation at commit 99786f1
    w = welch([0.5, 0.6, 0.55, 0.7, 0.52], [0.4, 0.45, 0.5, 0.42, 0.48])
    assert (w.t, w.df) == (pytest.approx(3.0846152896509684, rel=1e-12), pytest.approx(5.990347384067678, rel=1e-12))
    assert w.p == pytest.approx(0.02158032072318552, rel=1e-9)
    assert (w.low, w.high) == (pytest.approx(0.025596927125623975, rel=1e-9), pytest.approx(0.22240307287437613, rel=1e-9))
    w = welch([0.124, 0.13, 0.11, 0.125, 0.131], [0.16, 0.148, 0.148, 0.137, 0.164])
    assert w.p == pytest.approx(0.002345916565636754, rel=1e-9)
    assert w.low == pytest.approx(-0.04162226109627844, rel=1e-9)
    m, lo, hi = mean_ci([0.3, 0.35, 0.25, 0.4, 0.3])
    assert (m, lo, hi) == (pytest.approx(0.32), pytest.approx(0.2492142611508864, rel=1e-9), pytest.approx(0.3907857388491136, rel=1e-9))


def test_welch_with_one_constant_group_is_quiet_and_exact():
    # every run of one side at its budget (rollouts_to): s_b = 0, so t = diff / (s_a / sqrt(n_a)), df = n_a - 1
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w = welch([5120.0, 12800.0, 8960.0, 6400.0, 11520.0], [12800.0] * 5)
    sa = math.sqrt(sum((x - 8960.0) ** 2 for x in [5120.0, 12800.0, 8960.0, 6400.0, 11520.0]) / 4)
    assert w.t == pytest.approx(-3840.0 / (sa / math.sqrt(5)))
    assert w.df == pytest.approx(4)


def test_welch_by_hand():
    # a = [1, 2, 3], b = [4, 5, 6]: means 2 and 5, sample variances 1 and 1
    # se^2 = 1/3 + 1/3 = 2/3, t = -3 / sqrt(2/3) = -3.674235
    # df = (2/3)^2 / ((1/3)^2 / 2 + (1/3)^2 / 2) = 4
    w = welch([1, 2, 3], [4, 5, 6])
    assert w.diff == -3
    assert w.t == pytest.approx(-3 / math.sqrt(2 / 3))
    assert w.df == pytest.approx(4)
    # df = 4 in closed form, with u = t / sqrt(4 + t^2): P(|T| >= t) = 1 - u (3 - u^2) / 2
    u = abs(w.t) / math.sqrt(4 + w.t ** 2)
    assert w.p == pytest.approx(1 - u * (3 - u * u) / 2, abs=1e-10)
    assert 0.01 < w.p < 0.05
    # the 95% interval is diff -+ t_{0.975,4} * se
    half = 2.776445 * math.sqrt(2 / 3)
    assert (w.low, w.high) == (pytest.approx(-3 - half, abs=1e-5), pytest.approx(-3 + half, abs=1e-5))


def test_welch_unequal_variances_by_hand():
    # a = [1, 2, 3, 4]: mean 2.5, var 5/3; b = [3, 5, 7, 9, 11]: mean 7, var 10
    # se^2 = 5/12 + 2 = 29/12; df = (29/12)^2 / ((5/12)^2 / 3 + 2^2 / 4) = 5.520788
    w = welch([1, 2, 3, 4], [3, 5, 7, 9, 11])
    assert w.t == pytest.approx(-4.5 / math.sqrt(29 / 12))
    assert w.df == pytest.approx((29 / 12) ** 2 / ((5 / 12) ** 2 / 3 + 1), rel=1e-12)
    assert w.df == pytest.approx(5.520788, abs=1e-6)
    assert 0.02 < w.p < 0.05  # |t| = 2.895 lies between t_{0.975} and t_{0.99} for 5-6 df


def test_welch_without_spread():
    assert welch([0, 0, 0], [0, 0, 0]).p == 1.0
    w = welch([1, 1], [0, 0])
    assert w.p == 0.0 and (w.low, w.high) == (1, 1)
    with pytest.raises(ValueError):
        welch([1], [0, 1])


def test_bootstrap_by_hand_and_seeded():
    assert bootstrap_ci([1, 1], [0, 0]) == (1, 1)
    # a = [0, 1] resampled: mean 0 (1/4), 0.5 (1/2), 1 (1/4); b = [0]: the 95% interval is [0, 1]
    assert bootstrap_ci([0, 1], [0], resamples=4000) == (0, 1)
    a, b = [0.5, 0.6, 0.55, 0.7, 0.52], [0.4, 0.45, 0.5, 0.42, 0.48]
    assert bootstrap_ci(a, b, seed=3) == bootstrap_ci(a, b, seed=3)
    lo, hi = bootstrap_ci(a, b)
    assert lo < sum(a) / 5 - sum(b) / 5 < hi and lo > 0


def test_holm_by_hand():
    # sorted p: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> max so far 0.06)
    assert holm([0.01, 0.04, 0.03, None, 0.005]) == [pytest.approx(0.03), pytest.approx(0.06), pytest.approx(0.06), None,
                                                     pytest.approx(0.02)]
    assert holm([0.4, 0.9]) == [pytest.approx(0.8), pytest.approx(0.9)]  # capped at 1 and monotone
    assert holm([0.6, 0.7]) == [1.0, 1.0]
    assert holm([0.03]) == [0.03] and holm([]) == []


def test_verdicts():
    hi = [0.50, 0.52, 0.51, 0.49, 0.50]
    lo = [0.10, 0.12, 0.11, 0.09, 0.13]
    assert judge(hi, lo).verdict == AGREES
    assert judge(lo, hi).verdict == DISAGREES
    assert judge(lo, hi, better="lower").verdict == AGREES  # e.g. rollouts to a target
    noisy = [0.1, 0.6, 0.3, 0.5, 0.2]
    j = judge(noisy, [0.3, 0.35, 0.25, 0.4, 0.3])
    assert j.verdict == UNRESOLVED and j.p > 0.05 and j.low < 0 < j.high
    assert judge([0.0] * 5, [0.0] * 5).verdict == UNRESOLVED  # nobody learns level 6: nothing to claim
    assert judge([0.3], [0.1, 0.2]).verdict == UNRESOLVED  # one seed is no test
    b = judge(hi, lo, test="bootstrap")
    assert b.verdict == AGREES and b.low == b.boot_low and b.low > 0 and "bootstrap" in b.test
    with pytest.raises(ValueError):
        judge(hi, lo, better="sideways")
