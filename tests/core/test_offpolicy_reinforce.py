"""OPMD, AsymRE, REC, sPPO and VESPO vs hand computations (plain python from each formula).

Each test builds logp = old + log r as a leaf; the expected loss and d loss / d logp are
written out per token with ``math`` (no call into mixrl), including padded positions that
hold NaN / -inf.
"""

import math

import pytest
import torch

from mixrl.core import POLICY_LOSSES

OLD = [[-1.0, -2.0, -0.5], [-0.7, -1.2, float("nan")]]
MASK = [[1, 1, 1], [1, 1, 0]]
LR = [[0.1, 0.4, -0.5], [-0.3, 1.2, float("-inf")]]  # log r; padding holds NaN / -inf
ADV = [0.5, -1.5]


def run(name, lr=LR, adv=ADV, mask=MASK, old=OLD, **params):
    old_t = torch.tensor(old, dtype=torch.float64)
    logp = (old_t + torch.tensor(lr, dtype=torch.float64)).detach().requires_grad_(True)
    out = POLICY_LOSSES.get(name)(logp, old_t, torch.tensor(adv, dtype=torch.float64), torch.as_tensor(mask), **params)
    out.per_token_loss.sum().backward()
    return out, logp.grad


def hand(fn, lr=LR, adv=ADV, mask=MASK, old=OLD):
    """(loss, grad) per token from fn(A, logp, log r) -> (loss, dloss/dlogp); 0 on padding."""
    loss, grad = [], []
    for i, row in enumerate(lr):
        lrow, grow = [], []
        for t, x in enumerate(row):
            if not mask[i][t]:
                lrow.append(0.0)
                grow.append(0.0)
                continue
            v, g = fn(adv[i], old[i][t] + x, x)
            lrow.append(v)
            grow.append(g)
        loss.append(lrow)
        grad.append(grow)
    return loss, grad


def check(out, grad, expected, tol=1e-9):
    exp_loss, exp_grad = expected
    got_l, got_g = out.per_token_loss.detach().tolist(), grad.tolist()
    for a, b in zip(got_l, exp_loss):
        assert a == pytest.approx(b, abs=tol), (got_l, exp_loss)
    for a, b in zip(got_g, exp_grad):
        assert a == pytest.approx(b, abs=tol), (got_g, exp_grad)


# ---------------------------------------------------------------- opmd
def test_opmd_k2_is_reinforce_plus_half_tau_squared_log_ratio():
    tau = 0.4
    out, grad = run("opmd", tau=tau)
    # l = -A logp + tau/2 x^2; dl/dlogp = -A + tau x
    check(out, grad, hand(lambda a, lp, x: (-a * lp + tau / 2 * x * x, -a + tau * x)))
    assert not out.clipped.any()


def test_opmd_trinity_form_divides_reinforce_by_one_plus_tau():
    out, grad = run("opmd", tau=1.5, form="trinity")
    check(out, grad, hand(lambda a, lp, x: (-a * lp / 2.5, -a / 2.5)))


def test_opmd_k2_on_fresh_rows_has_the_reinforce_gradient():
    zeros = [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    _, g_opmd = run("opmd", lr=zeros, tau=3.0)
    _, g_rf = run("reinforce", lr=zeros)
    assert torch.allclose(g_opmd, g_rf)


# ---------------------------------------------------------------- asymre
def test_asymre_shifts_the_baseline_below_the_mean():
    out, grad = run("asymre", baseline_shift=-0.2)
    # A' = A + 0.2: row 0 (A = 0.5) -> 0.7, row 1 (A = -1.5) -> -1.3
    check(out, grad, hand(lambda a, lp, x: (-(a + 0.2) * lp, -(a + 0.2))))
    assert grad[0, 0].item() == pytest.approx(-0.7)
    assert grad[1, 0].item() == pytest.approx(1.3)


def test_asymre_equals_rec_forward_kl_regulariser():
    a, ga = run("asymre", baseline_shift=-0.3)
    b, gb = run("rec", clip_mode="none", regularizer="forward-kl", regularizer_coef=0.3)
    assert torch.allclose(a.per_token_loss, b.per_token_loss) and torch.allclose(ga, gb)


def test_asymre_rejects_a_positive_shift():
    with pytest.raises(ValueError, match="baseline_shift"):
        run("asymre", baseline_shift=0.1)


# ---------------------------------------------------------------- rec
RLR = [[math.log(1.1), math.log(1.3), math.log(0.3)], [math.log(0.7), math.log(3.5), math.log(1.1)]]
RMASK = [[1, 1, 1], [1, 1, 1]]
ROLD = [[-1.0, -2.0, -0.5], [-0.7, -1.2, -0.9]]
RADV = [1.0, -2.0]


def rec_hand(keep, weight, reg=lambda lp, x: (0.0, 0.0)):
    def fn(a, lp, x):
        r = math.exp(x)
        k = 1.0 if keep(a, r) else 0.0
        w = weight(a, r)
        rv, rg = reg(lp, x)
        return -k * w * a * lp + rv, -k * w * a + rg
    return hand(fn, RLR, RADV, RMASK, ROLD)


def rec_run(**p):
    return run("rec", lr=RLR, adv=RADV, mask=RMASK, old=ROLD, **p)


def test_rec_one_side_no_is_drops_tokens_past_the_clip_in_the_advantage_direction():
    out, grad = rec_run(clip_mode="one-side")
    # A > 0: r = 1.3 > 1.2 dropped, r = 0.3 kept; A < 0: r = 0.7 < 0.8 dropped, 3.5 kept
    check(out, grad, rec_hand(lambda a, r: (a >= 0 and r <= 1.2) or (a <= 0 and r >= 0.8), lambda a, r: 1.0))
    assert out.clipped.tolist() == [[False, True, False], [True, False, False]]


def test_rec_two_side_is_weights_by_the_detached_ratio():
    out, grad = rec_run(clip_mode="two-side", weight="importance_sampling")
    check(out, grad, rec_hand(lambda a, r: 0.8 <= r <= 1.2, lambda a, r: r))
    assert out.clipped.tolist() == [[False, True, True], [True, True, False]]


def test_rec_ring_keeps_far_tokens_on_the_safe_side():
    out, grad = rec_run(clip_mode="ring", ring_low=0.6, ring_high=2.0)
    # ring: A > 0 and r <= 0.4 (0.3 kept); A < 0 and r >= 3.0 (3.5 kept); 1.3 and 0.7 dropped
    keep = lambda a, r: (0.8 <= r <= 1.2) or (a >= 0 and r <= 0.4) or (a <= 0 and r >= 3.0)  # noqa: E731
    check(out, grad, rec_hand(keep, lambda a, r: 1.0))
    assert out.clipped.tolist() == [[False, True, False], [True, False, False]]


def test_rec_truncated_is_advantage_weight_and_k2_regulariser():
    out, grad = rec_run(clip_mode="none", weight="truncated_importance_sampling", ring_low=0.5, ring_high=1.0)
    check(out, grad, rec_hand(lambda a, r: True, lambda a, r: min(max(r, 0.5), 2.0)))
    out, grad = rec_run(clip_mode="none", weight="advantage", temp=2.0, regularizer="k2", regularizer_coef=0.3)
    check(out, grad, rec_hand(lambda a, r: True, lambda a, r: math.exp(a / 2.0), lambda lp, x: (0.3 * x * x, 0.6 * x)))


def test_rec_rejects_unknown_modes():
    for bad in ({"clip_mode": "gspo-one-side"}, {"weight": "is"}, {"regularizer": "kl"}):
        with pytest.raises(ValueError, match="must be one of"):
            rec_run(**bad)


# ---------------------------------------------------------------- sppo
def test_sppo_log_ratio_surrogate_with_a_log_symmetric_clip():
    out, grad = run("sppo", lr=RLR, adv=RADV, mask=RMASK, old=ROLD, clip_eps=0.25)
    # kept: 1/1.25 = 0.8 <= r <= 1.25 -> 1.1 (twice) only
    keep = lambda r: 0.8 <= r <= 1.25  # noqa: E731
    exp = hand(lambda a, lp, x: ((-a * x, -a) if keep(math.exp(x)) else (0.0, 0.0)), RLR, RADV, RMASK, ROLD)
    check(out, grad, exp)
    assert out.clipped.tolist() == [[False, True, True], [True, True, False]]


# ---------------------------------------------------------------- vespo
def test_vespo_kernel_on_the_product_sequence_ratio():
    kp, lp_, kn, ln = 2.0, 3.0, 3.0, 2.0
    out, grad = run("vespo", k_pos=kp, lambda_pos=lp_, k_neg=kn, lambda_neg=ln)
    phis = []
    for i in range(2):
        s = sum(x for x, m in zip(LR[i], MASK[i]) if m)  # sum, not mean: no length normalisation
        w = math.exp(s)
        k, lam = (kp, lp_) if ADV[i] >= 0 else (kn, ln)
        phis.append(w ** k * math.exp(-lam * (w - 1.0)))
    exp = hand(lambda a, lp, x: (-phis[0 if a > 0 else 1] * a * lp, -phis[0 if a > 0 else 1] * a))
    check(out, grad, exp)
    assert out.metrics["phi_mean"].item() == pytest.approx(sum(phis) / 2)
    # row 0: W = exp(0) = 1 -> phi = 1 (a fresh row's weight); row 1: W = e^0.9, phi = e^2.7 e^(-2 (e^0.9 - 1)) ~ 0.80
    assert phis[0] == pytest.approx(1.0) and phis[1] == pytest.approx(0.8032, abs=1e-4)
    assert not out.clipped.any()
    # A > 0 with W = e^0.9: (k, lam) = (2, 3), phi = e^1.8 e^(-3 (e^0.9 - 1)) ~ 0.08 < 0.5: clipped
    out, _ = run("vespo", adv=[0.5, 1.0])
    assert out.clipped.tolist() == [[False, False, False], [True, True, False]]


def test_vespo_extreme_weights_vanish_without_nan():
    lr = [[15.0, 15.0, 0.0], [-15.0, -15.0, 0.0]]
    out, grad = run("vespo", lr=lr, old=[[-1.0] * 3, [-1.0] * 3])
    assert torch.isfinite(out.per_token_loss).all() and torch.isfinite(grad).all()
    assert grad.abs().max().item() < 1e-8


def test_padding_gets_zero_loss_and_gradient_for_every_new_loss():
    for name in ("opmd", "asymre", "rec", "sppo", "vespo"):
        out, grad = run(name)
        assert out.per_token_loss[1, 2].item() == 0.0 and grad[1, 2].item() == 0.0, name
        assert torch.isfinite(out.per_token_loss).all() and torch.isfinite(grad).all(), name
