"""TempSamp-R1 (mixrl.core.tempsamp): the soft reward transform and the advantage it gives, by hand
from transform_rewards of ZhangZikun6666/TempSamp-R1 @ 55a92280a93474d694e215bbb4705d0a1f2efc04
(scripts/timelens/timelens_reward.py); the preset's gradient on the ground-truth row; refusals;
two training steps."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from mixrl.cli.main import app
from mixrl.config.builders import build_objective
from mixrl.config.compose import compose_config
from mixrl.core import provenance as prov
from mixrl.core.advantages import grpo
from mixrl.core.objective import compute_objective
from mixrl.core.tempsamp import soft_transform, tempsamp
from mixrl.errors import ConfigError


def _f(iou, tau=0.8, alpha=1.0):
    """transform_rewards as the implementation writes it (math on floats)."""
    if iou >= tau:
        return tau + math.log(iou - tau + 1.0) * 0.01
    return tau - (math.exp(alpha * (tau - iou)) - 1.0) / (math.exp(alpha) - 1.0)


def test_soft_transform_is_the_implementations_transform():
    r = torch.tensor([0.0, 0.3, 0.5, 0.79, 0.8, 0.9, 1.0])
    assert soft_transform(r, threshold=0.8, alpha=1.0).tolist() == pytest.approx([_f(x) for x in r.tolist()], abs=1e-6)
    assert _f(0.0) == pytest.approx(0.8 - (math.exp(0.8) - 1) / (math.e - 1))  # ~0.0867, the docstring's value
    assert _f(1.0) == pytest.approx(0.8 + 0.01 * math.log(1.2))  # ~0.8018
    # alpha 2, threshold 0.5: by hand
    assert soft_transform(torch.tensor([0.2]), threshold=0.5, alpha=2.0).item() == pytest.approx(
        0.5 - (math.exp(0.6) - 1) / (math.exp(2) - 1), abs=1e-6)


def test_tempsamp_advantage_is_grpo_of_the_transformed_rewards():
    iou = [0.9, 0.5, 0.1, 1.0, 0.0, 0.85, 0.85, 0.3]
    fmt = [0.1, 0.1, 0.0, 0.1, 0.0, 0.1, 0.0, 0.1]  # a second reward function (weight 1), added back unchanged
    rewards = torch.tensor([a + b for a, b in zip(iou, fmt)])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    out = tempsamp(torch.zeros(8), rewards=rewards, group_ids=groups, primary_rewards=torch.tensor(iou))
    shaped = [_f(a) + b for a, b in zip(iou, fmt)]
    by_hand = []
    for g in (range(0, 4), range(4, 8)):
        vals = [shaped[i] for i in g]
        m, s = statistics.mean(vals), statistics.stdev(vals)  # unbiased, as verl's torch.std
        by_hand += [(shaped[i] - m) / (s + 1e-6) for i in g]
    assert out.tolist() == pytest.approx(by_hand, abs=1e-5)
    # rows left out of the statistics are normalised with the included rows' mean and std
    include = torch.tensor([True, True, True, False, True, True, True, True])
    out = tempsamp(torch.zeros(8), rewards=rewards, group_ids=groups, include=include, primary_rewards=torch.tensor(iou))
    vals = shaped[:3]
    m, s = statistics.mean(vals), statistics.stdev(vals)
    assert out[3].item() == pytest.approx((shaped[3] - m) / (s + 1e-6), abs=1e-5)


def test_on_a_binary_reward_the_transform_changes_nothing():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    assert torch.allclose(tempsamp(torch.zeros(8), rewards=r, group_ids=g, primary_rewards=r), grpo(r, g), atol=1e-4)


def test_preset_trains_the_ground_truth_row_like_a_rollout_at_ratio_one():
    """token-mean over on_policy + expert tokens: d L / d log p_t = -A_i / N on every token of both
    populations (the rollouts at ratio 1, unclipped; the ground-truth row by advantage_nll)."""
    obj = build_objective(compose_config(["algo=tempsamp"]))
    logp = (-torch.rand(3, 4) - 0.1).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    source = torch.tensor([[prov.ON_POLICY] * 4, [prov.ON_POLICY] * 4, [prov.EXPERT] * 4])
    adv = torch.tensor([0.7, -1.2, 0.9])
    loss, _ = compute_objective(obj, logp=logp, mask=mask, advantages=adv, token_source=source,
                                entropies=torch.ones(3, 4))
    loss.backward()
    n = float(mask.sum())
    assert torch.allclose(logp.grad, -adv.unsqueeze(1) * mask / n, atol=1e-6)


@pytest.mark.parametrize("overrides, match", [
    (["algo=tempsamp", "algo.shaping.threshold=1.5"], "threshold"),
    (["algo=tempsamp", "algo.shaping.alpha=0"], "alpha"),
    (["algo=tempsamp", "algo.shaping.plateau=-0.1"], "plateau"),
])
def test_out_of_range_tempsamp_settings_are_refused_in_one_line(overrides, match):
    with pytest.raises(ConfigError, match=match) as e:
        compose_config(overrides)
    assert "\n" not in str(e.value)


runner = CliRunner()


@pytest.mark.slow
def test_tempsamp_preset_trains_two_steps(fast_overrides):
    run_dir = next(o for o in fast_overrides if o.startswith("run_dir=")).split("=", 1)[1]
    res = runner.invoke(app, ["train", "algo=tempsamp", *fast_overrides, "trainer.eval_size=0"])
    assert res.exit_code == 0, (res.stdout[-1500:], res.exception)
    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert len(rows) == 2
    assert all(math.isfinite(r["loss/gt"]) and math.isfinite(r["loss/policy"]) for r in rows)
