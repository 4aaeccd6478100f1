"""GAE and the clipped value loss against hand computations (a backwards python loop from the
GAE paper's definition; value-loss gradients derived by hand)."""

import math

import pytest
import torch

from mixrl.core import ADVANTAGES, VALUE_LOSSES, gae_advantage_return


def _gae_by_hand(rewards, values, gamma, lam):
    """One row, no padding: delta_t = r_t + gamma V_(t+1) - V_t (V after the end = 0),
    A_t = sum_l (gamma lam)^l delta_(t+l), written as the sum, not the recursion."""
    T = len(rewards)
    v_next = values[1:] + [0.0]
    delta = [rewards[t] + gamma * v_next[t] - values[t] for t in range(T)]
    adv = [sum((gamma * lam) ** (l - t) * delta[l] for l in range(t, T)) for t in range(T)]
    return adv, [a + v for a, v in zip(adv, values)]


def test_gae_matches_the_sum_of_discounted_td_errors_and_skips_padding():
    r = [[0.0, 0.5, 0.0, 1.0], [0.0, 2.0, 0.0, 0.0]]
    v = [[0.3, -0.2, 0.7, 0.1], [0.5, 0.25, 9.0, 9.0]]  # row 2: two padded tokens (values ignored)
    mask = [[1, 1, 1, 1], [1, 1, 0, 0]]
    adv, ret = gae_advantage_return(torch.tensor(r), torch.tensor(v), torch.tensor(mask), gamma=0.9, lam=0.8)
    a0, r0 = _gae_by_hand(r[0], v[0], 0.9, 0.8)
    a1, r1 = _gae_by_hand(r[1][:2], v[1][:2], 0.9, 0.8)
    assert adv[0].tolist() == pytest.approx(a0, abs=1e-6)
    assert ret[0].tolist() == pytest.approx(r0, abs=1e-6)
    assert adv[1].tolist() == pytest.approx(a1 + [0.0, 0.0], abs=1e-6)
    assert ret[1].tolist() == pytest.approx(r1 + [0.0, 0.0], abs=1e-6)
    # hand numbers for row 2: delta_1 = 2 - 0.25 = 1.75, delta_0 = 0 + 0.9*0.25 - 0.5 = -0.275
    assert adv[1, 1].item() == pytest.approx(1.75) and adv[1, 0].item() == pytest.approx(-0.275 + 0.72 * 1.75)


def test_gae_with_gamma_lam_one_is_return_minus_value():
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.2, 0.4, 0.6]])
    adv, ret = gae_advantage_return(r, v, torch.ones(1, 3), gamma=1.0, lam=1.0)
    assert adv.tolist()[0] == pytest.approx([0.8, 0.6, 0.4])
    assert ret.tolist()[0] == pytest.approx([1.0, 1.0, 1.0])


def test_registered_gae_whitens_over_included_tokens():
    r = torch.tensor([[0.0, 1.0], [0.0, 0.0], [3.0, 0.0]])
    v = torch.zeros(3, 2)
    mask = torch.tensor([[1, 1], [1, 1], [1, 0]])
    include = torch.tensor([True, True, False])
    out = ADVANTAGES.get("gae")(torch.zeros(3), torch.zeros(3), include=include, token_rewards=r, values=v, mask=mask,
                                gamma=1.0, lam=1.0)
    raw = [[1.0, 1.0], [0.0, 0.0], [3.0]]
    inc = raw[0] + raw[1]
    mean = sum(inc) / 4
    std = math.sqrt(sum((x - mean) ** 2 for x in inc) / 3 + 1e-8)
    want = [[(x - mean) / std for x in raw[0]], [(x - mean) / std for x in raw[1]], [(3.0 - mean) / std, 0.0]]
    assert out.tolist() == [pytest.approx(w, abs=1e-5) for w in want]
    plain = ADVANTAGES.get("gae")(torch.zeros(3), torch.zeros(3), token_rewards=r, values=v, mask=mask, whiten=False)
    assert plain[2].tolist() == [3.0, 0.0]


def test_value_loss_values_and_gradients_by_hand():
    # token 0: unclipped error larger; token 1: clipped error larger; token 2: masked
    values = torch.tensor([[1.0, 0.5, 7.0]], requires_grad=True)
    old = torch.tensor([[0.9, 0.0, 0.0]])
    ret = torch.tensor([[0.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, frac = VALUE_LOSSES.get("clipped_mse")(values, old, ret, mask, clip=0.2)
    # token 0: v=1.0 -> (1-0)^2 = 1; clipped v = 1.0 (inside 0.9 +- 0.2) -> 1: max 1, grad 2(v - R) = 2
    # token 1: v=0.5 -> (0.5-1)^2 = 0.25; clipped v = 0.2 -> (0.2-1)^2 = 0.64: max 0.64, grad 0 (clipped branch)
    assert loss.item() == pytest.approx(0.5 * (1.0 + 0.64) / 2)
    assert frac.item() == pytest.approx(0.5)
    loss.backward()
    assert values.grad.tolist()[0] == pytest.approx([0.5 * 2 * 1.0 / 2, 0.0, 0.0])
    v2 = torch.tensor([[0.5]], requires_grad=True)
    loss2, _ = VALUE_LOSSES.get("clipped_mse")(v2, torch.tensor([[0.0]]), torch.tensor([[1.0]]), torch.ones(1, 1), clip=None)
    loss2.backward()
    assert loss2.item() == pytest.approx(0.125) and v2.grad.item() == pytest.approx(-0.5)


def test_bounds_refuse_out_of_range():
    from mixrl.errors import ConfigError

    with pytest.raises(ConfigError):
        ADVANTAGES.check_ranges("gae", {"gamma": 1.5})
    with pytest.raises(ConfigError):
        VALUE_LOSSES.check_ranges("clipped_mse", {"clip": 0.0})
