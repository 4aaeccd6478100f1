"""mixrl.experiments.intervals: rliable's IQM, probability of improvement and stratified bootstrap
("Deep Reinforcement Learning at the Edge of the Statistical Precipice", arXiv:2108.13264), against hand values."""

from __future__ import annotations

import numpy as np
import pytest

from mixrl.experiments.intervals import AGGREGATES, claim_estimates, iqm, probability_of_improvement, stratified_bootstrap_ci


def test_iqm_by_hand():
    assert iqm(list(range(1, 9))) == pytest.approx(4.5)  # drop 1, 2 and 7, 8: mean(3, 4, 5, 6)
    assert iqm([0.1, 0.9, 0.3, 0.5, 0.2]) == pytest.approx((0.2 + 0.3 + 0.5) / 3)  # N = 5: drop floor(5/4) = 1 each side
    # runs x tasks: all 8 scores pooled (rliable's axis=None), 100 is an outlier the IQM drops
    assert iqm([[1, 2], [3, 100], [4, 5], [6, 7]]) == pytest.approx((3 + 4 + 5 + 6) / 4)


def test_probability_of_improvement_by_hand():
    # x = [1, 2, 3] vs y = [0, 2, 5]: wins 1>0, 2>0, 3>0, 3>2 = 4, one tie (2 = 2) = 0.5 -> 4.5 / 9
    assert probability_of_improvement([1, 2, 3], [0, 2, 5]) == pytest.approx(0.5)
    assert probability_of_improvement([3, 4], [1, 2]) == 1.0 and probability_of_improvement([1, 2], [3, 4]) == 0.0
    assert probability_of_improvement([0.0] * 3, [0.0] * 3) == 0.5
    # two tasks: 1 on the first, 0.125 on the second (x = [1, 2] vs y = [2, 3]: one tie, no win = 0.5 / 4) -> mean 0.5625
    assert probability_of_improvement([[5, 1], [6, 2]], [[1, 2], [2, 3]]) == pytest.approx(0.5625)
    # the batched form used by the bootstrap agrees with scipy's Mann-Whitney on random data
    rng = np.random.default_rng(1)
    x, y = rng.integers(0, 4, size=(5, 3)).astype(float), rng.integers(0, 4, size=(4, 3)).astype(float)
    assert AGGREGATES["poi"](x[None], y[None])[0] == pytest.approx(probability_of_improvement(x, y))


def test_stratified_bootstrap_resamples_within_tasks():
    # task 0 always 0, task 1 always 1: every stratified resample has mean 0.5 (pooled resampling would not)
    scores = [[0, 1], [0, 1], [0, 1]]
    mean = lambda x: x.mean(axis=(1, 2))  # noqa: E731
    assert stratified_bootstrap_ci(mean, scores, resamples=2000) == (0.5, 0.5)
    # one task, runs [0, 1]: the mean of a resample is 0, 0.5 or 1 (prob. 1/4, 1/2, 1/4): the 95% interval is [0, 1]
    assert stratified_bootstrap_ci(mean, [0.0, 1.0], resamples=4000) == (0.0, 1.0)
    # seeded and reproducible; the interval holds the point estimate
    a = [0.1, 0.4, 0.35, 0.2, 0.3]
    lo, hi = stratified_bootstrap_ci(AGGREGATES["iqm"], a, resamples=5000, seed=3)
    assert (lo, hi) == stratified_bootstrap_ci(AGGREGATES["iqm"], a, resamples=5000, seed=3)
    assert lo <= iqm(a) <= hi


def test_claim_estimates_direction():
    hi, lo = [0.50, 0.52, 0.51, 0.49, 0.50], [0.10, 0.12, 0.11, 0.09, 0.13]
    e = claim_estimates(hi, lo, resamples=2000)
    assert e["iqm_method"] == pytest.approx((0.50 + 0.50 + 0.51) / 3) and e["iqm_baseline"] == pytest.approx(0.11)
    assert (e["poi"], e["poi_low"], e["poi_high"]) == (1.0, 1.0, 1.0)
    assert claim_estimates(hi, lo, better="lower", resamples=2000)["poi"] == 0.0  # fewer rollouts is better: the method loses


def test_compare_aggregates_over_levels_by_hand(tmp_path):
    import json

    from mixrl.experiments.claims import parse_claim
    from mixrl.experiments.compare import compare

    levels = {"a/x": [(0.6, 0.4), (0.7, 0.5), (0.8, 0.6)], "b/x": [(0.5, 0.0), (0.6, 0.0), (0.7, 0.1)]}
    for recipe, per_run in levels.items():
        for seed, (l3, l5) in enumerate(per_run):
            d = tmp_path / "runs" / f"{recipe[0]}{seed}"
            d.mkdir(parents=True)
            after = {"accuracy": (l3 + l5) / 2, "accuracy/level3": l3, "accuracy/level5": l5, "n": 8.0}
            (d / "summary.json").write_text(json.dumps({"recipe": recipe, "algo": recipe[0], "seed": seed, "steps": 2,
                                                        "rollouts": 20, "eval_before": {"accuracy": 0.1}, "eval_after": after}))
    claim = parse_claim({"paper": "P", "claim": "A beats B", "method": "a/x", "baseline": "b/x"})
    res = compare([tmp_path / "runs"], tmp_path / "out", plots=False, claims=[claim])
    agg = res.aggregate
    assert agg["levels"] == ["3", "5"] and agg["baseline"] == "b/x"
    a, b = agg["methods"]
    # A's 6 scores sorted 0.4 0.5 0.6 0.6 0.7 0.8: drop one each side -> mean(0.5, 0.6, 0.6, 0.7) = 0.6
    # B's: 0 0 0.1 0.5 0.6 0.7 -> mean(0, 0.1, 0.5, 0.6) = 0.3
    assert (a["iqm"], b["iqm"]) == (pytest.approx(0.6), pytest.approx(0.3))
    assert a["iqm_low"] <= 0.6 <= a["iqm_high"]
    # P(A > B): level 3, [0.6 0.7 0.8] vs [0.5 0.6 0.7]: 6 wins + 2 ties x 1/2 = 7/9; level 5: 1 -> (7/9 + 1) / 2
    assert a["poi"] == pytest.approx(8 / 9) and b["poi"] is None
    assert a["poi_low"] <= 8 / 9 <= a["poi_high"]
    md = (tmp_path / "out" / "compare.md").read_text()
    assert "## Over the levels" in md and "| a/x | 3 x 2 | 0.600 [" in md
    assert json.loads((tmp_path / "out" / "compare.json").read_text())["aggregate"]["scores"]["b/x"][2] == [0.7, 0.1]
