"""Controllers: a few updates by hand, and state_dict round trips."""

import pytest
import torch

from mixrl.core import CONTROLLERS, POLICY_LOSSES


def contributions(ratios, advs, lo, hi):
    pos = sum(a * min(r, hi) for r, a in zip(ratios, advs) if a > 0)
    neg = sum(-a * max(r, lo) for r, a in zip(ratios, advs) if a < 0)
    return pos, neg


def test_bapo_widens_bounds_until_positive_share_reaches_rho0():
    ratios = [3.0, 1.0, 0.7, 1.0]
    advs = [1.0, -1.0, -1.0, 0.0]
    ctrl = CONTROLLERS.get("bapo")()  # rho0 0.5, [0.6, 0.9] step 0.02, [1.2, 3.0] step 0.05
    # by hand: start (0.6, 1.2): pos 1.2, neg 1.0 + 0.7 = 1.7, share 0.41 < 0.5.
    # step i raises both: lo = 0.6 + 0.02 i, hi = 1.2 + 0.05 i; the 0.7 token is lifted to lo
    # once lo > 0.7. i = 13: pos 1.85, neg 1.86 (< 0.5); i = 14: pos 1.9, neg 1.88 -> share 0.503.
    pos, neg = contributions(ratios, advs, 0.6 + 0.02 * 13, 1.2 + 0.05 * 13)
    assert pos / (pos + neg) < 0.5
    pos, neg = contributions(ratios, advs, 0.6 + 0.02 * 14, 1.2 + 0.05 * 14)
    assert pos / (pos + neg) >= 0.5
    clip_low, clip_high = ctrl.update(
        torch.tensor([ratios]), torch.tensor([advs]), torch.ones(1, 4, dtype=torch.bool)
    )
    assert (clip_low, clip_high) == pytest.approx((1 - 0.88, 1.9 - 1))
    assert ctrl.ratio_low == pytest.approx(0.88) and ctrl.ratio_high == pytest.approx(1.9)
    assert ctrl.rho == pytest.approx(1.9 / (1.9 + 1.88))
    # the epsilons plug straight into ppo_clip
    out = POLICY_LOSSES.get("ppo_clip")(torch.zeros(1, 4), torch.zeros(1, 4), torch.ones(1),
                                        torch.ones(1, 4), clip_low=clip_low, clip_high=clip_high)
    assert out.per_token_loss.shape == (1, 4)


def test_bapo_no_change_when_balanced_and_saturates_when_not():
    ctrl = CONTROLLERS.get("bapo")()
    mask = torch.ones(1, 2)
    # positive-dominated: bounds stay at (low_min, high_min)
    assert ctrl.update(torch.tensor([[1.0, 1.0]]), torch.tensor([[2.0, -1.0]]), mask) == pytest.approx((0.4, 0.2))
    # hopelessly negative-dominated: both bounds end at their maxima
    out = ctrl.update(torch.tensor([[1.0, 1.0]]), torch.tensor([[0.1, -5.0]]), mask)
    assert out == pytest.approx((1 - 0.9, 3.0 - 1))
    pos, neg = contributions([1.0, 1.0], [0.1, -5.0], 0.9, 3.0)
    assert ctrl.rho == pytest.approx(pos / (pos + neg))
    # masked tokens do not count; no signed tokens at all -> share 1
    assert ctrl.update(torch.tensor([[1.0, 1.0]]), torch.tensor([[0.1, -5.0]]),
                       torch.tensor([[1, 0]])) == pytest.approx((0.4, 0.2))


def test_bapo_reduce_hook_and_per_row_advantages():
    ctrl = CONTROLLERS.get("bapo")(rho0=0.6)
    calls = []

    def reduce(stats):
        calls.append(stats.clone())
        return stats * 2  # e.g. an all-reduce over two identical ranks: same share

    out = ctrl.update(torch.tensor([[1.0, 1.0], [1.0, 1.0]]), torch.tensor([1.0, -1.0]),
                      torch.ones(2, 2), reduce=reduce)
    assert calls and calls[0].tolist() == pytest.approx([2.0, 2.0])
    assert out[1] > 0.2  # share 0.5 < 0.6 at the start: the bounds moved


def test_bapo_state_dict_round_trip():
    a = CONTROLLERS.get("bapo")()
    a.update(torch.tensor([[3.0, 1.0, 0.7]]), torch.tensor([[1.0, -1.0, -1.0]]), torch.ones(1, 3))
    b = CONTROLLERS.get("bapo")()
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == a.state_dict()
    assert (b.clip_low, b.clip_high) == (a.clip_low, a.clip_high)
    assert set(a.metrics()) == {"bapo/ratio_low", "bapo/ratio_high", "bapo/positive_share"}


def test_bapo_rejects_bad_ranges():
    with pytest.raises(ValueError):
        CONTROLLERS.get("bapo")(low_min=0.9, low_max=0.6)


def test_entropic_pi_updates_by_hand():
    ctrl = CONTROLLERS.get("entropic")(target=0.5, kp=1.0, ki=0.5, coef_min=-1.0, coef_max=1.0)
    # e = 0.2, I = 0.2 -> 0.2 + 0.1; e = 0.1, I = 0.3 -> 0.1 + 0.15; e = -0.5, I = -0.2 -> -0.6
    assert ctrl.update(0.3) == pytest.approx(0.3)
    assert ctrl.update(0.4) == pytest.approx(0.25)
    assert ctrl.update(1.0) == pytest.approx(-0.6)
    # e = -2.5, I = -2.7 -> -3.85 clamped to -1
    assert ctrl.update(3.0) == pytest.approx(-1.0)
    assert ctrl.integral == pytest.approx(-2.7)


def test_entropic_anti_windup_and_state_round_trip():
    ctrl = CONTROLLERS.get("entropic")(target=1.0, kp=0.0, ki=1.0, integral_limit=0.5)
    assert ctrl.update(0.0) == pytest.approx(0.5)  # I = 1 clamped to 0.5
    clone = CONTROLLERS.get("entropic")(target=1.0, kp=0.0, ki=1.0, integral_limit=0.5)
    clone.load_state_dict(ctrl.state_dict())
    assert clone.state_dict() == ctrl.state_dict()
    assert clone.update(1.5) == ctrl.update(1.5) == pytest.approx(0.0)  # I = 0.5 - 0.5
