"""REINFORCE++ (and its group-baseline variant), OPO, ReMax, GRPO's TRL scale_rewards and the
policy term's top-entropy selection, against numbers computed by hand or by plain python loops
written from the papers' / verl's formulas (a row of L tokens expanded to L token values)."""

from __future__ import annotations

import math

import pytest
import torch

from mixrl.config.compose import compose_config
from mixrl.core.advantages import ADVANTAGES, advantage_needs
from mixrl.core.terms import TERMS, TermInputs
from mixrl.errors import ConfigError


def _whiten_tokens(values, lengths, eps=1e-8):
    """verl's masked_whiten over the tokens of a batch, with every row's value repeated L times."""
    tokens = [v for v, n in zip(values, lengths) for _ in range(int(n))]
    n = len(tokens)
    mean = sum(tokens) / n
    var = sum((t - mean) ** 2 for t in tokens) / (n - 1)
    return [(v - mean) / math.sqrt(var + eps) for v in values]


def test_reinforce_pp_whitens_over_tokens_and_rows():
    r = torch.tensor([1.0, 0.0, 1.0, 1.0])
    L = torch.tensor([2.0, 4.0, 1.0, 3.0])
    g = torch.tensor([0, 0, 1, 1])
    got = ADVANTAGES.get("reinforce_pp")(r, g, lengths=L)
    assert got.tolist() == pytest.approx(_whiten_tokens([1, 0, 1, 1], [2, 4, 1, 3]), rel=1e-5)
    # hand numbers: 10 tokens, mean 0.6, var 2.4 / 9
    assert got[0].item() == pytest.approx(0.4 / math.sqrt(2.4 / 9), rel=1e-5)
    rows = ADVANTAGES.get("reinforce_pp")(r, g, token_weighted=False)  # each row weight 1: mean 0.75, var 0.25
    assert rows.tolist() == pytest.approx([0.5, -1.5, 0.5, 0.5], rel=1e-5)
    # an excluded row is whitened with the statistics of the included ones
    inc = torch.tensor([True, True, True, False])
    part = ADVANTAGES.get("reinforce_pp")(r, g, lengths=L, include=inc)
    assert part.tolist() == pytest.approx(_whiten_tokens([1, 0, 1], [2, 4, 1]) + [_whiten_tokens([1, 0, 1], [2, 4, 1])[0]], rel=1e-5)
    assert advantage_needs(ADVANTAGES.get("reinforce_pp")) == ("lengths",)
    with pytest.raises(ValueError, match="lengths"):
        ADVANTAGES.get("reinforce_pp")(r, g)


def test_reinforce_pp_baseline_group_mean_then_batch_whiten():
    r = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0])
    g = torch.tensor([0, 0, 1, 1, 2])  # group 2 has one response: no baseline (verl)
    L = torch.tensor([2.0, 4.0, 1.0, 3.0, 2.0])
    x = [1 - 0.5, 0 - 0.5, 0.0, 0.0, 1.0]
    got = ADVANTAGES.get("reinforce_pp_baseline")(r, g, lengths=L)
    assert got.tolist() == pytest.approx(_whiten_tokens(x, [2, 4, 1, 3, 2]), rel=1e-5)


def test_opo_length_weighted_baseline_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0])
    g = torch.tensor([0, 0, 0, 1, 1])
    L = torch.tensor([2.0, 4.0, 6.0, 3.0, 5.0])
    got = ADVANTAGES.get("opo")(r, g, lengths=L)
    # group 0: baseline (2*1 + 4*0 + 6*0) / 12 = 1/6; group 1: (3 + 5) / 8 = 1
    assert got.tolist() == pytest.approx([5 / 6, -1 / 6, -1 / 6, 0.0, 0.0], abs=1e-6)
    inc = torch.tensor([True, True, False, True, True])  # row 2 not in the baseline: 2 / 6
    got = ADVANTAGES.get("opo")(r, g, lengths=L, include=inc)
    assert got.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, 0.0, 0.0], abs=1e-6)
    single = ADVANTAGES.get("opo")(torch.tensor([0.7]), torch.tensor([3]), lengths=torch.tensor([5.0]))
    assert single.tolist() == pytest.approx([0.7])  # one response: baseline 0 (verl)
    with pytest.raises(ValueError, match="lengths"):
        ADVANTAGES.get("opo")(r, g)


def test_remax_subtracts_the_greedy_reward():
    r = torch.tensor([1.0, 0.0, 1.0, 0.0])
    b = torch.tensor([1.0, 1.0, 0.0, 0.0])
    got = ADVANTAGES.get("remax")(r, torch.tensor([0, 0, 1, 1]), baseline_rewards=b)
    assert got.tolist() == [0.0, -1.0, 1.0, 0.0]
    assert advantage_needs(ADVANTAGES.get("remax")) == ("baseline_rewards",)
    with pytest.raises(ValueError, match="greedy"):
        ADVANTAGES.get("remax")(r, torch.tensor([0, 0, 1, 1]))


def test_grpo_scale_batch_and_none_as_trl():
    """TRL scale_rewards: group mean subtracted; 'batch' divides by the unbiased std of all rewards."""
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    g = torch.arange(8) // 4
    means = [0.25] * 4 + [0.75] * 4
    batch_std = math.sqrt(8 * 0.25 / 7)  # batch mean 0.5, every (r - 0.5)^2 = 0.25
    got = ADVANTAGES.get("grpo")(r, g, scale="batch", eps=1e-4)
    assert got.tolist() == pytest.approx([(v - m) / (batch_std + 1e-4) for v, m in zip(r.tolist(), means)], rel=1e-5)
    none = ADVANTAGES.get("grpo")(r, g, scale="none")
    assert none.tolist() == pytest.approx([v - m for v, m in zip(r.tolist(), means)], abs=1e-7)
    group = ADVANTAGES.get("grpo")(r, g)
    assert group[0].item() == pytest.approx(0.75 / (0.5 + 1e-6), rel=1e-5)  # group std sqrt(0.75 / 3) = 0.5


def test_grpo_scale_bad_value_is_a_config_error():
    with pytest.raises(ConfigError, match="scale"):
        compose_config(["algo.advantage.scale=global"])
    assert compose_config(["algo.advantage.scale=batch"]).algo.advantage.scale == "batch"


def test_policy_top_entropy_keeps_the_high_entropy_tokens_values_and_gradients():
    """ppo_clip at ratio 1 (behaviour = logp): loss -A on kept tokens, d loss / d logp = -A there, 0 elsewhere."""
    logp = torch.tensor([[-0.5, -1.0, -0.2, -0.7, -0.3]], requires_grad=True)
    mask = torch.tensor([[True, True, True, True, False]])
    h = torch.tensor([[0.1, 0.9, 0.5, 0.3, 5.0]])  # the unselected token's entropy must not count
    x = TermInputs(logp=logp, mask=mask, advantages=torch.tensor([2.0]), behaviour_logp=logp.detach().clone(), entropies=h)
    out = TERMS.get("policy")(x, loss={"name": "ppo_clip"}, top_entropy=0.5)  # k = ceil(0.5 * 4) = 2: 0.9, 0.5
    assert out.per_token.detach()[0].tolist() == pytest.approx([0.0, -2.0, -2.0, 0.0, 0.0])
    out.per_token.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, -2.0, -2.0, 0.0, 0.0])
    assert out.metrics["policy/entropy_kept"] == pytest.approx(0.5)
    everything = TERMS.get("policy")(x, loss={"name": "ppo_clip"})
    assert everything.per_token.detach()[mask].tolist() == pytest.approx([-2.0] * 4)


def test_policy_top_entropy_range_is_checked():
    with pytest.raises(ConfigError, match="top_entropy"):
        compose_config(["algo.terms.policy.top_entropy=1.5"])
    assert compose_config(["algo.terms.policy.top_entropy=0.2"]).algo.terms.policy.top_entropy == 0.2
