"""PALU's controller (mixrl.core.palu): the two-extreme multiplier, the quantile budget and the
budgeted rewards, by hand; its state round-trips."""

from __future__ import annotations

import math

import pytest
import torch

from mixrl.core import CONTROLLERS
from mixrl.core.palu import PaluController, budgeted_rewards


def test_budgeted_rewards_zero_only_rows_past_the_budget():
    r = torch.tensor([1.0, 1.0, 0.0, 0.5])
    n = torch.tensor([3, 7, 9, 5])
    assert budgeted_rewards(r, n, 5).tolist() == [1.0, 0.0, 0.0, 0.5]  # len 5 is within a budget of 5
    assert budgeted_rewards(r, n, None).tolist() == r.tolist()
    rows = torch.tensor([True, False, True, True])
    assert budgeted_rewards(r, n, 5, rows).tolist() == [1.0, 1.0, 0.0, 0.5]  # row 1 is not a rollout


def test_below_target_the_multiplier_is_at_its_upper_extreme_and_rewards_stay():
    c = CONTROLLERS.get("palu")(target=0.5, quantile=0.5)
    r = torch.tensor([1.0, 0.0, 0.0, 0.0])
    out = c.step({"rewards": r, "lengths": torch.tensor([10, 2, 2, 2]), "correct": r > 0.5})
    assert out.tolist() == r.tolist()
    assert c.metrics()["palu/lambda"] == 1.0 and c.metrics()["palu/accuracy"] == 0.25
    assert c.budget is None and math.isnan(c.metrics()["palu/budget"])


def test_at_target_the_budget_moves_to_the_quantile_of_correct_lengths_and_cuts_rewards():
    """Correct lengths [4, 6, 8, 10], q = 0.5: torch's linear quantile = 7 -> budget 7; the correct
    rows of length 8 and 10 lose their reward; the failed one keeps its 0."""
    c = PaluController(target=0.5, quantile=0.5)
    r = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0])
    n = torch.tensor([4, 6, 8, 10, 3])
    out = c.step({"rewards": r, "lengths": n, "correct": r > 0.5})
    assert c.budget == 7.0
    assert out.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0]
    m = c.metrics()
    assert m["palu/lambda"] == 0.0 and m["palu/accuracy"] == pytest.approx(0.8) and m["palu/clipped"] == pytest.approx(0.4)
    # the budget never rises: longer correct answers next step keep it at 7 (and go past it)
    out = c.step({"rewards": torch.ones(2), "lengths": torch.tensor([20, 30]), "correct": torch.tensor([True, True])})
    assert c.budget == 7.0 and out.tolist() == [0.0, 0.0]
    # accuracy below target: the budget is kept but not applied
    out = c.step({"rewards": torch.tensor([1.0, 0.0, 0.0]), "lengths": torch.tensor([20, 1, 1]),
                  "correct": torch.tensor([True, False, False])})
    assert out.tolist() == [1.0, 0.0, 0.0] and c.budget == 7.0 and c.lam == 1.0


def test_min_budget_floors_the_quantile():
    c = PaluController(target=0.0, quantile=0.5, min_budget=5)
    c.step({"rewards": torch.ones(2), "lengths": torch.tensor([1, 2]), "correct": torch.tensor([True, True])})
    assert c.budget == 5.0


def test_state_round_trips():
    c = PaluController(target=0.5, quantile=0.5)
    c.step({"rewards": torch.ones(2), "lengths": torch.tensor([4, 6]), "correct": torch.tensor([True, True])})
    d = PaluController(target=0.5, quantile=0.5)
    d.load_state_dict(c.state_dict())
    assert d.metrics() == c.metrics() and d.budget == 5.0


def test_palu_ranges_are_declared():
    from mixrl.core.registry import ComponentParamError

    with pytest.raises(ComponentParamError, match="quantile"):
        CONTROLLERS.check_ranges("palu", {"quantile": 0.0}, "algo.controller")


def test_a_correct_rollout_past_the_budget_is_pushed_down_by_hand():
    """Budget 5 (set by one length step): rewards [1, 1, 0, 0], lengths [3, 9, 3, 3] -> R' = [1, 0, 0, 0];
    the GRPO advantage of R' (mean 0.25, unbiased std 0.5) is [1.5, -0.5, -0.5, -0.5]: the correct but
    long row 1 now has a negative advantage. One token per row, r = 1, token-mean: dL/dlogp = -A / 4."""
    from mixrl.core import ADVANTAGES
    from mixrl.core.objective import Objective, TermSpec, compute_objective

    c = PaluController(target=0.5, quantile=0.5)
    c.budget = 5.0
    rewards = c.step({"rewards": torch.tensor([1.0, 1.0, 0.0, 0.0]), "lengths": torch.tensor([3, 9, 3, 3]),
                      "correct": torch.tensor([True, True, False, False])})
    assert c.budget == 5.0 and rewards.tolist() == [1.0, 0.0, 0.0, 0.0]  # quantile of [3, 9] = 6 > 5: kept at 5
    adv = ADVANTAGES.get("grpo")(rewards, torch.zeros(4, dtype=torch.long))
    assert adv.tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5], rel=1e-5)
    logp = torch.full((4, 1), -1.0, requires_grad=True)
    obj = Objective([TermSpec("policy", "policy", ("on_policy",), None, 1.0, "token-mean", {}, {"loss": {"name": "ppo_clip"}})])
    loss, _ = compute_objective(obj, logp=logp, mask=torch.ones(4, 1), advantages=adv)
    assert loss.item() == pytest.approx(0.0, abs=1e-6)  # -mean(A) with r = 1
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([-0.375, 0.125, 0.125, 0.125], rel=1e-5)
