"""pass@k: the unbiased estimator (Chen et al. 2021) against hand computations, and its
per-level report in evaluate_accuracy (generation replaced by fixed completions)."""

from __future__ import annotations

from math import comb

import pytest

from mixrl.evaluation import accuracy
from mixrl.evaluation.accuracy import evaluate_accuracy, pass_at_k, pass_at_k_ks


def test_pass_at_k_hand_values():
    # n=5 samples, c=2 correct, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # k=1 is the fraction of correct samples
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(32, 3, 1) == pytest.approx(3 / 32)
    # n=10, c=3, k=4: 1 - C(7,4)/C(10,4) = 1 - 35/210 = 5/6
    assert pass_at_k(10, 3, 4) == pytest.approx(5 / 6)
    assert pass_at_k(32, 0, 8) == 0.0
    assert pass_at_k(8, 1, 8) == 1.0  # n == k: solved iff any sample is correct
    assert pass_at_k(32, 25, 8) == 1.0  # fewer than k wrong samples: every k-subset holds a correct one


def test_pass_at_k_matches_binomials_everywhere():
    for n in (1, 8, 32):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - comb(n - c, k) / comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12), (n, c, k)


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 8)


def test_reported_ks():
    assert pass_at_k_ks(32, 0, [1, 8, 32]) == [1, 8, 32]
    assert pass_at_k_ks(8, 0, [1, 8, 32]) == [1, 8]
    assert pass_at_k_ks(4, 4, [1, 8, 32]) == [1, 4]


def test_evaluate_reports_pass_at_k_per_level(monkeypatch):
    rows = [{"prompt": "a", "answer": "1", "level": 1}, {"prompt": "b", "answer": "1", "level": 1},
            {"prompt": "c", "answer": "1", "level": 5}]
    # 4 samples per problem: problem a has 2 correct, b 0, c 1; greedy solves only a
    sampled = {"a": ["1", "0", "1", "0"], "b": ["0"] * 4, "c": ["0", "0", "0", "1"]}

    def fake_generate(model, tokenizer, prompts, *, do_sample=False, num_return_sequences=1, **kw):
        if not do_sample:
            return [["1" if p == "a" else "0"] for p in prompts]
        assert num_return_sequences == 4
        return [sampled[p] for p in prompts]

    monkeypatch.setattr(accuracy, "generate_completions", fake_generate)

    def reward(prompts, completions, answer, **kw):
        return [1.0 if c == a else 0.0 for c, a in zip(completions, answer)]

    res = evaluate_accuracy(None, None, rows, reward, max_new_tokens=4, samples=4, ks=[1, 2, 8])
    assert res["accuracy"] == pytest.approx(1 / 3) and res["accuracy/level5"] == 0.0
    # pass@2 by hand: a: 1 - C(2,2)/C(4,2) = 5/6; b: 0; c: 1 - C(3,2)/C(4,2) = 1/2
    assert res["pass@2"] == pytest.approx((5 / 6 + 0 + 1 / 2) / 3)
    assert res["pass@2/level1"] == pytest.approx((5 / 6 + 0) / 2)
    assert res["pass@2/level5"] == pytest.approx(0.5)
    assert res["pass@1"] == pytest.approx(3 / 12) == res["sampled_accuracy"]
    assert "pass@8" not in res  # k > n is not reported
    assert res["samples"] == 4.0
