"""Advantage estimators vs hand computations (group statistics with plain python)."""

import math

import pytest
import torch

from mixrl.core import ADVANTAGES

REWARDS = [1.0, 0.0, 0.0, 1.0, 0.5, 0.0, 2.0]
GROUPS = [7, 7, 7, 7, 3, 3, 3]  # non-contiguous labels


def run(name, rewards=REWARDS, groups=GROUPS, include=None, **params):
    inc = None if include is None else torch.tensor(include)
    runtime = {"lengths": torch.ones(len(rewards)), "baseline_rewards": torch.zeros(len(rewards)),  # what the trainer passes
               "turn_rewards": torch.tensor(rewards).reshape(-1, 1),  # one turn a row: its reward (a stateful env's, mt_grpo)
               "token_credit": torch.zeros(len(rewards), 1), "mask": torch.ones(len(rewards), 1),  # one token a row, no credit (capo)
               "answer_ids": torch.arange(len(rewards))}  # every row its own final answer (polychromic)
    needs = {k: v for k, v in runtime.items() if k in getattr(ADVANTAGES.get(name), "needs", ())}
    out = ADVANTAGES.get(name)(torch.tensor(rewards), torch.tensor(groups), include=inc, **needs, **params)
    if "turn_rewards" in needs or "token_credit" in needs:  # per turn or per token, [N, 1]: one a row here
        out = out[:, 0]
    assert out.shape == (len(rewards),) and not out.requires_grad
    return out.tolist()


def mean(xs):
    return sum(xs) / len(xs)


def stdev(xs):  # unbiased (n - 1)
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def test_grpo_unbiased_std_by_hand():
    g7, g3 = REWARDS[:4], REWARDS[4:]
    exp = [(r - mean(g7)) / (stdev(g7) + 1e-6) for r in g7] + [
        (r - mean(g3)) / (stdev(g3) + 1e-6) for r in g3
    ]
    assert run("grpo") == pytest.approx(exp)
    # g7 = [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(1/3): A = +-0.866..., not +-1 (population)
    assert run("grpo")[0] == pytest.approx(0.5 / (math.sqrt(1 / 3) + 1e-6))


def test_grpo_population_std_option():
    assert run("grpo", unbiased=False)[0] == pytest.approx(0.5 / (0.5 + 1e-6))


def test_grpo_zero_variance_group_gives_zero():
    assert run("grpo", [1.0, 1.0, 1.0], [0, 0, 0]) == [0.0, 0.0, 0.0]


def test_grpo_include_excluded_rows_use_included_statistics():
    # LUFFY-style: 3 on-policy rows + 1 expert row (excluded from the statistics)
    rewards, groups, include = [1.0, 0.0, 0.0, 1.0], [0, 0, 0, 0], [True, True, True, False]
    on = [1.0, 0.0, 0.0]
    exp = [(r - mean(on)) / (stdev(on) + 1e-6) for r in rewards]
    assert run("grpo", rewards, groups, include) == pytest.approx(exp)


def test_grpo_degenerate_groups():
    # group 0: one included row -> no std, no scaling; group 1: no included row -> 0
    rewards, groups = [2.0, 5.0, 1.0, 3.0], [0, 0, 1, 1]
    include = [True, False, False, False]
    assert run("grpo", rewards, groups, include) == pytest.approx([0.0, 3.0, 0.0, 0.0])


def test_dr_grpo_mean_only():
    exp = [r - mean(REWARDS[:4]) for r in REWARDS[:4]] + [r - mean(REWARDS[4:]) for r in REWARDS[4:]]
    assert run("dr_grpo") == pytest.approx(exp)
    # LUFFY with on-policy-only statistics: expert row (excluded) reward 1 vs all-zero rollouts
    assert run("dr_grpo", [0.0, 0.0, 1.0], [0, 0, 0], [True, True, False]) == pytest.approx([0, 0, 1])


def test_rloo_leave_one_out():
    exp = []
    for i, r in enumerate(REWARDS):
        others = [REWARDS[j] for j in range(len(REWARDS)) if GROUPS[j] == GROUPS[i] and j != i]
        exp.append(r - mean(others))
    assert run("rloo") == pytest.approx(exp)


def test_rloo_with_include():
    rewards, groups, include = [1.0, 0.0, 3.0, 5.0], [0, 0, 0, 0], [True, True, True, False]
    exp = [1 - (0 + 3) / 2, 0 - (1 + 3) / 2, 3 - (1 + 0) / 2, 5 - (1 + 0 + 3) / 3]
    assert run("rloo", rewards, groups, include) == pytest.approx(exp)
    # a lone included row has no baseline
    assert run("rloo", [4.0, 2.0], [0, 0], [True, False]) == pytest.approx([0.0, -2.0])


def test_reinforce_batch_mean_ignores_groups():
    assert run("reinforce") == pytest.approx([r - mean(REWARDS) for r in REWARDS])
    inc = [True] * 6 + [False]
    m = mean(REWARDS[:6])
    assert run("reinforce", include=inc) == pytest.approx([r - m for r in REWARDS])


def test_batch_norm():
    m, s = mean(REWARDS), stdev(REWARDS)
    assert run("batch_norm") == pytest.approx([(r - m) / (s + 1e-6) for r in REWARDS])


@pytest.mark.parametrize("name", ADVANTAGES.names())
def test_no_nan_on_degenerate_inputs(name):
    assert run(name, [], []) == []
    assert all(math.isfinite(a) for a in run(name, [1.0], [0]))
    assert all(math.isfinite(a) for a in run(name, [1.0, 2.0], [0, 1], [False, False]))


def test_integer_rewards_are_accepted():
    out = ADVANTAGES.get("grpo")(torch.tensor([1, 0]), torch.tensor([0, 0]))
    assert out.dtype.is_floating_point
