"""Policy losses vs hand computations from each paper's formula (values and d loss / d logp)."""

import math

import pytest
import torch

from mixrl.core import POLICY_LOSSES, PolicyLossOutput
from mixrl.core.aggregation import seq_mean_token_mean

OLD = [[-1.0, -2.0, -0.5], [-0.7, -1.2, -3.0]]
MASK = [[1, 1, 1], [1, 1, 0]]


def make(log_ratios, old=OLD):
    """logp = old + log r as a leaf with gradient; old_logp as a constant."""
    old_t = torch.tensor(old, dtype=torch.float64)
    logp = (old_t + torch.tensor(log_ratios, dtype=torch.float64)).requires_grad_(True)
    return logp, old_t


def run(name, log_ratios, adv, mask=MASK, old=OLD, **params):
    logp, old_t = make(log_ratios, old)
    out = POLICY_LOSSES.get(name)(
        logp, old_t, torch.tensor(adv, dtype=torch.float64), torch.as_tensor(mask), **params
    )
    assert isinstance(out, PolicyLossOutput)
    out.per_token_loss.sum().backward()
    return out, logp.grad


def close(tensor, expected, tol=1e-9):
    got = tensor.detach().tolist()
    for row_got, row_exp in zip(got, expected):
        assert row_got == pytest.approx(row_exp, abs=tol), (got, expected)


# ---------------------------------------------------------------- ppo_clip
def test_ppo_clip_values_gradients_and_clip_flags_by_hand():
    lr = [[0.1, 0.3, -0.5], [0.1, -0.5, 1.5]]
    adv = [1.0, -2.0]
    out, grad = run("ppo_clip", lr, adv, clip_low=0.2, clip_high=0.2)
    r = [[math.exp(x) for x in row] for row in lr]
    # row 0, A = +1: r0 inside, r1 > 1.2 clipped, r2 < 0.8 but A > 0 keeps the unclipped branch
    # row 1, A = -2: r0 inside, r1 < 0.8 clipped (loss 2 * 0.8), r2 masked
    exp_loss = [[-r[0][0], -1.2, -r[0][2]], [2 * r[1][0], 2 * 0.8, 0.0]]
    exp_grad = [[-r[0][0], 0.0, -r[0][2]], [2 * r[1][0], 0.0, 0.0]]  # d(-A r)/dlogp = -A r
    close(out.per_token_loss, exp_loss)
    close(grad, exp_grad)
    assert out.clipped.tolist() == [[False, True, False], [False, True, False]]


def test_ppo_clip_asymmetric_clip_higher():
    lr = [[math.log(1.25), math.log(1.3), 0.0], [math.log(0.75), 0.0, 0.0]]
    out, grad = run("ppo_clip", lr, [1.0, -1.0], clip_low=0.2, clip_high=0.28)
    # 1.25 < 1.28 -> unclipped; 1.3 > 1.28 -> clipped at 1.28; A<0 with r=0.75 < 0.8 -> clipped
    close(out.per_token_loss, [[-1.25, -1.28, -1.0], [0.8, 1.0, 0.0]])
    close(grad, [[-1.25, 0.0, -1.0], [0.0, 1.0, 0.0]])


def test_ppo_clip_dual_clip_bounds_negative_advantage_loss():
    lr = [[0.0, 0.0, 0.0], [1.5, math.log(2.0), 0.0]]
    out, grad = run("ppo_clip", lr, [0.0, -2.0], dual_clip_c=3.0)
    # row 1 t0: r = e^1.5 = 4.48 > c = 3 -> loss = min(max(2 r, 2 * 1.2), 2 * 3) = 6, no gradient
    # row 1 t1: r = 2 < 3 -> ordinary PPO branch: 2 * 2 = 4, gradient -A r = 4
    close(out.per_token_loss, [[0.0, 0.0, 0.0], [6.0, 4.0, 0.0]])
    close(grad, [[0.0, 0.0, 0.0], [0.0, 4.0, 0.0]])
    assert out.clipped.tolist() == [[False, False, False], [True, False, False]]
    assert float(out.metrics["dual_clip_frac"]) == pytest.approx(1 / 5)
    with pytest.raises(ValueError):
        run("ppo_clip", lr, [0.0, -2.0], dual_clip_c=0.5)


def test_ppo_clip_ratio_is_clamped_for_extreme_log_ratios():
    lr = [[100.0, -100.0, 0.0], [0.0, 0.0, 0.0]]
    out, _ = run("ppo_clip", lr, [-1.0, 1.0])
    assert torch.isfinite(out.per_token_loss).all()
    assert out.per_token_loss[0, 0].item() == pytest.approx(math.exp(20.0))


# ---------------------------------------------------------------- reinforce
def test_reinforce_plain_and_truncated_is():
    lr = [[math.log(3.0), math.log(0.5), 0.0], [math.log(1.5), 0.0, 0.0]]
    adv = [2.0, -1.0]
    logp_vals = [[OLD[b][t] + lr[b][t] for t in range(3)] for b in range(2)]
    out, grad = run("reinforce", lr, adv)
    close(out.per_token_loss, [[-2.0 * logp_vals[0][t] for t in range(3)],
                               [1.0 * logp_vals[1][0], 1.0 * logp_vals[1][1], 0.0]])
    close(grad, [[-2.0, -2.0, -2.0], [1.0, 1.0, 0.0]])
    out, grad = run("reinforce", lr, adv, tis_cap=2.0)
    w = [[2.0, 0.5, 1.0], [1.5, 1.0, 0.0]]  # min(r, 2)
    close(grad, [[-2.0 * w[0][t] for t in range(3)], [1.0 * w[1][0], 1.0 * w[1][1], 0.0]])
    assert out.clipped.tolist() == [[True, False, False], [False, False, False]]
    with pytest.raises(ValueError):
        run("reinforce", lr, adv, tis_cap=0.5)


@pytest.mark.parametrize("params", [{}, {"tis_cap": 1.0}, {"tis_cap": 5.0}])
def test_on_policy_gradients_equal_reinforce(params):
    """old_logp == logp: every variant's gradient is REINFORCE's -A grad log p, as is PPO's."""
    adv = [1.5, -0.5]
    _, grad = run("reinforce", [[0.0] * 3] * 2, adv, **params)
    _, grad_ppo = run("ppo_clip", [[0.0] * 3] * 2, adv)
    expected = [[-1.5, -1.5, -1.5], [0.5, 0.5, 0.0]]
    close(grad, expected)
    close(grad_ppo, expected)


# ---------------------------------------------------------------- topr
def test_topr_positive_plain_negative_truncated():
    lr = [[math.log(3.0), math.log(0.5), 0.0], [math.log(3.0), math.log(0.5), 0.0]]
    adv = [2.0, -1.0]
    out, grad = run("topr", lr, adv)
    # A >= 0: gradient -A (no ratio at all); A < 0: -clip(r, 0, 1) * A
    close(grad, [[-2.0, -2.0, -2.0], [1.0 * 1.0, 1.0 * 0.5, 0.0]])
    logp1 = [OLD[1][0] + lr[1][0], OLD[1][1] + lr[1][1]]
    close(out.per_token_loss[1:], [[1.0 * logp1[0], 0.5 * logp1[1], 0.0]])
    assert out.clipped.tolist() == [[False, False, False], [True, False, False]]


# ---------------------------------------------------------------- cispo
def test_cispo_clipped_is_weight_keeps_every_gradient():
    lr = [[math.log(2.0), math.log(0.1), 0.0], [math.log(1.1), math.log(3.0), 0.0]]
    adv = [1.0, -2.0]
    out, grad = run("cispo", lr, adv)  # bounds [0, 1.28]
    w = [[1.28, 0.1, 1.0], [1.1, 1.28, 0.0]]
    close(grad, [[-1.0 * w[0][t] for t in range(3)], [2.0 * w[1][0], 2.0 * w[1][1], 0.0]])
    assert out.clipped.tolist() == [[True, False, False], [False, True, False]]
    _, grad = run("cispo", lr, adv, clip_low=0.5, clip_high=0.5)  # bounds [0.5, 1.5]
    close(grad[0:1], [[-1.5, -0.5, -1.0]])


# ---------------------------------------------------------------- gspo
def test_gspo_sequence_ratio_value_and_gradient():
    lr = [[0.2, -0.1, 0.5], [0.3, 0.1, 9.0]]  # row 1's last token is padding
    adv = [1.0, -1.0]
    s0 = math.exp((0.2 - 0.1 + 0.5) / 3)
    s1 = math.exp((0.3 + 0.1) / 2)
    out, grad = run("gspo", lr, adv, clip_low=10.0, clip_high=10.0)  # wide: no clipping
    close(out.per_token_loss, [[-s0] * 3, [s1, s1, 0.0]])
    # GSPO-token: d loss_t / d logp_t = -A s
    close(grad, [[-s0] * 3, [s1, s1, 0.0]])
    # seq-mean-token-mean of the broadcast loss == GSPO's sequence objective:
    # J = mean_i( -A_i s_i ), d J / d logp_t = -A_i s_i / |y_i| / n_rows
    logp, old = make(lr)
    o = POLICY_LOSSES.get("gspo")(logp, old, torch.tensor(adv), torch.tensor(MASK),
                                  clip_low=10.0, clip_high=10.0)
    total = seq_mean_token_mean(o.per_token_loss, torch.tensor(MASK))
    total.backward()
    assert total.item() == pytest.approx((-s0 + s1) / 2)
    close(logp.grad, [[-s0 / 3 / 2] * 3, [s1 / 2 / 2, s1 / 2 / 2, 0.0]])


def test_gspo_default_clip_blocks_whole_sequence():
    lr = [[0.01, 0.01, 0.01], [0.0001, 0.0001, 0.0]]
    out, grad = run("gspo", lr, [1.0, 1.0])  # s0 = e^0.01 > 1 + 4e-4 -> clipped; s1 inside
    s1 = math.exp(0.0001)
    close(out.per_token_loss, [[-(1 + 4e-4)] * 3, [-s1, -s1, 0.0]])
    close(grad, [[0.0] * 3, [-s1, -s1, 0.0]])
    assert out.clipped.tolist() == [[True] * 3, [False, False, False]]


# ---------------------------------------------------------------- sapo
def test_sapo_soft_gate_value_and_gradient():
    lr = [[0.0, math.log(1.5), math.log(0.5)], [math.log(1.2), math.log(3.0), 0.0]]
    adv = [2.0, -1.0]
    out, grad = run("sapo", lr, adv, tau_pos=1.0, tau_neg=2.0)

    def sig(x):
        return 1 / (1 + math.exp(-x))

    exp_loss, exp_grad = [], []
    for b, a in enumerate(adv):
        tau = 1.0 if a > 0 else 2.0
        row_l, row_g = [], []
        for t in range(3):
            if not MASK[b][t]:
                row_l.append(0.0)
                row_g.append(0.0)
                continue
            r = math.exp(lr[b][t])
            s = sig(tau * (r - 1))
            row_l.append(-(4 / tau) * s * a)
            row_g.append(-a * 4 * s * (1 - s) * r)  # d/dlogp, dr/dlogp = r
        exp_loss.append(row_l)
        exp_grad.append(row_g)
    close(out.per_token_loss, exp_loss)
    close(grad, exp_grad)
    assert grad[0, 0].item() == pytest.approx(-2.0)  # r = 1: exactly the PG gradient -A
    assert not out.clipped.any()


# ---------------------------------------------------------------- m2po
def test_m2po_masks_fewest_largest_tokens_under_budget():
    lr = [[0.0, 0.1, -0.2], [0.5, 0.05, 7.0]]  # row 1 last token is padding
    adv = [1.0, -2.0]
    # hand: valid squares [0, .01, .04, .25, .0025]; drop the largest until mean <= 0.04
    valid = [(b, t) for b in range(2) for t in range(3) if MASK[b][t]]
    kept = sorted(valid, key=lambda bt: lr[bt[0]][bt[1]] ** 2)
    while kept and sum(lr[b][t] ** 2 for b, t in kept) / len(kept) > 0.04:
        kept.pop()
    assert set(valid) - set(kept) == {(1, 0)}
    out, grad = run("m2po", lr, adv)
    exp_loss = [[0.0] * 3 for _ in range(2)]
    for b, t in kept:
        exp_loss[b][t] = -math.exp(lr[b][t]) * adv[b]
    close(out.per_token_loss, exp_loss)
    close(grad, exp_loss)  # d(-r A)/dlogp = -r A
    assert out.clipped.tolist() == [[False] * 3, [True, False, False]]
    assert float(out.metrics["m2_before"]) == pytest.approx((0.01 + 0.04 + 0.25 + 0.0025) / 5)
    assert float(out.metrics["m2_after"]) == pytest.approx((0.01 + 0.04 + 0.0025) / 4)


def test_m2po_keeps_everything_under_budget():
    lr = [[0.1, -0.1, 0.1], [0.0, 0.1, 0.0]]
    out, _ = run("m2po", lr, [1.0, 1.0])
    assert not out.clipped.any()


# ---------------------------------------------------------------- sft
def test_sft_is_negative_log_likelihood():
    out, grad = run("sft", [[0.0] * 3] * 2, [5.0, -5.0])
    close(out.per_token_loss, [[1.0, 2.0, 0.5], [0.7, 1.2, 0.0]])
    close(grad, [[-1.0] * 3, [-1.0, -1.0, 0.0]])


# ---------------------------------------------------------------- shared contracts
@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_masked_positions_are_zero_and_get_no_gradient(name):
    lr = [[0.3, -0.2, 0.1], [0.2, 0.4, 3.0]]
    out, grad = run(name, lr, [1.0, -1.0])
    assert out.per_token_loss[1, 2].item() == 0.0
    assert grad[1, 2].item() == 0.0
    assert not out.clipped[1, 2]
    assert out.per_token_loss.shape == out.clipped.shape == (2, 3)
    assert out.clipped.dtype == torch.bool
    assert all(v.dim() == 0 and not v.requires_grad for v in out.metrics.values())


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_all_padding_rows_give_no_nan(name):
    logp = torch.zeros(2, 3, requires_grad=True)
    out = POLICY_LOSSES.get(name)(logp, torch.zeros(2, 3), torch.tensor([1.0, -1.0]),
                                  torch.zeros(2, 3, dtype=torch.bool))
    out.per_token_loss.sum().backward()
    assert torch.equal(out.per_token_loss, torch.zeros(2, 3))
    assert torch.isfinite(logp.grad).all()
    assert all(torch.isfinite(v) for v in out.metrics.values())


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_float_mask_equals_bool_mask(name):
    lr = [[0.3, -0.2, 0.1], [0.2, 0.4, 3.0]]
    a, _ = run(name, lr, [1.0, -1.0], mask=torch.tensor(MASK, dtype=torch.bool))
    b, _ = run(name, lr, [1.0, -1.0], mask=torch.tensor(MASK, dtype=torch.float32))
    assert torch.equal(a.per_token_loss, b.per_token_loss)
    assert torch.equal(a.clipped, b.clipped)


POISON_PARAMS = {"reinforce": {"tis_cap": 2.0}}  # the IS-capped form reads old_logp too


@pytest.mark.parametrize("poison", [float("nan"), float("-inf"), float("inf")])
@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_nan_or_inf_in_padding_never_reaches_loss_or_gradient(name, poison):
    """Padding of logp / old_logp / per-token advantages may hold NaN or +-inf."""
    lr = [[0.3, -0.2, 0.1], [0.2, 0.4, 0.0]]
    adv_tok = [[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]]
    params = POISON_PARAMS.get(name, {})
    clean, clean_grad = run(name, lr, adv_tok, **params)

    old = torch.tensor(OLD, dtype=torch.float64)
    old[1, 2] = poison
    logp = (torch.tensor(OLD, dtype=torch.float64) + torch.tensor(lr, dtype=torch.float64))
    logp[1, 2] = poison
    logp.requires_grad_(True)
    adv = torch.tensor(adv_tok, dtype=torch.float64)
    adv[1, 2] = poison
    out = POLICY_LOSSES.get(name)(logp, old, adv, torch.tensor(MASK), **params)
    out.per_token_loss.sum().backward()

    assert torch.isfinite(out.per_token_loss).all()
    assert torch.isfinite(logp.grad).all()
    assert logp.grad[1, 2].item() == 0.0
    assert torch.allclose(out.per_token_loss, clean.per_token_loss.detach())
    assert torch.allclose(logp.grad, clean_grad)
    assert torch.equal(out.clipped, clean.clipped)
    for key, value in out.metrics.items():
        assert torch.isfinite(value), key
        assert torch.allclose(value, clean.metrics[key]), key


def test_ppo_clip_without_the_clip_is_the_critique_grpo_authors_loss_remove_clip():
    """zhangxy-2019/critique-GRPO @ e8f03a2, critique_core_algos.py:587-599: with
    loss_remove_clip=True the on-policy loss is -A * ratio, unclipped. Ratios 1.5 and 0.5 with
    A = +1 and -1: unclipped [-1.5, 0.5]; clipped at 0.2: [max(-1.5, -1.2), max(0.5, 0.8)] = [-1.2, 0.8]."""
    import math

    from mixrl.core.clip_losses import ppo_clip

    logp = torch.tensor([[math.log(1.5), math.log(0.5)]], requires_grad=True)
    old = torch.zeros(1, 2)
    adv = torch.tensor([[1.0, -1.0]])
    mask = torch.ones(1, 2)
    free = ppo_clip(logp, old, adv, mask, clip=False)
    assert free.per_token_loss.tolist()[0] == pytest.approx([-1.5, 0.5])
    assert not free.clipped.any()
    free.per_token_loss.sum().backward()
    assert logp.grad.tolist()[0] == pytest.approx([-1.5, 0.5])  # d(-A r)/dlogp = -A r: both tokens get a gradient
    clipped = ppo_clip(logp, old, adv, mask)
    assert clipped.per_token_loss.tolist()[0] == pytest.approx([-1.2, 0.8])
    assert clipped.clipped.tolist() == [[True, True]]
