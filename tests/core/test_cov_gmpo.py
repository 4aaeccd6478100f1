"""Clip-Cov, KL-Cov and GMPO vs hand computations from the papers' formulas (values and
d loss / d logp), padding with NaN, the selection size and the determinism of Clip-Cov's draw."""

import math

import pytest
import torch

from mixrl.core import POLICY_LOSSES
from mixrl.core.aggregation import seq_mean_token_mean

# two rows, the last token of row 1 is padding
OLD = [[-1.0, -2.0, -0.5], [-0.7, -1.2, -3.0]]
MASK = [[1, 1, 1], [1, 1, 0]]


def run(name, log_ratios, adv, mask=MASK, old=OLD, **params):
    old_t = torch.tensor(old, dtype=torch.float64)
    logp = (old_t + torch.tensor(log_ratios, dtype=torch.float64)).requires_grad_(True)
    out = POLICY_LOSSES.get(name)(logp, old_t, torch.tensor(adv, dtype=torch.float64), torch.as_tensor(mask), **params)
    out.per_token_loss.sum().backward()
    return out, logp.grad, logp.detach().tolist()


def close(tensor, expected, tol=1e-9):
    got = tensor.detach().tolist() if torch.is_tensor(tensor) else tensor
    for row_got, row_exp in zip(got, expected):
        assert row_got == pytest.approx(row_exp, abs=tol), (got, expected)


def hand_cov(logp, adv, mask):
    """Cov_t = (log p_t - mean log p)(A_t - mean A) over valid tokens, a plain loop."""
    cells = [(b, t) for b in range(len(mask)) for t in range(len(mask[b])) if mask[b][t]]
    mlp = sum(logp[b][t] for b, t in cells) / len(cells)
    ma = sum(adv[b] for b, t in cells) / len(cells)
    return {(b, t): (logp[b][t] - mlp) * (adv[b] - ma) for b, t in cells}


# ---------------------------------------------------------------- clip_cov
def test_clip_cov_detaches_every_window_token_values_and_gradients_by_hand():
    lr = [[0.1, -0.2, 0.3], [0.0, 0.2, 0.0]]
    adv = [2.0, -2.0]
    # clip_ratio 1: all candidates are taken, so the draw does not matter
    out, grad, logp = run("clip_cov", lr, adv, clip_ratio=1.0, cov_lower=0.3, cov_upper=5.0)
    cov = hand_cov(logp, adv, MASK)
    window = {c for c, v in cov.items() if 0.3 <= v <= 5.0}
    assert window and len(window) < 5  # some tokens in, some out
    exp_loss, exp_grad = [], []
    for b in range(2):
        lrow, grow = [], []
        for t in range(3):
            r = math.exp(lr[b][t])
            if not MASK[b][t] or (b, t) in window:
                lrow.append(0.0), grow.append(0.0)
            else:  # -A r, d/dlogp = -A r
                lrow.append(-adv[b] * r), grow.append(-adv[b] * r)
        exp_loss.append(lrow), exp_grad.append(grow)
    close(out.per_token_loss, exp_loss)
    close(grad, exp_grad)
    assert {(b, t) for b in range(2) for t in range(3) if out.clipped[b, t]} == window
    assert float(out.metrics["cov_selected_frac"]) == pytest.approx(len(window) / 5)


def test_clip_cov_verl_form_ppo_clip_and_clipped_tokens_not_candidates():
    lr = [[0.5, -0.2, 0.05], [0.0, 0.2, 0.0]]  # r = e^0.5 > 1.2 with A > 0: PPO-clipped
    adv = [2.0, -2.0]
    out, grad, logp = run("clip_cov", lr, adv, clip_ratio=1.0, cov_lower=-100.0, cov_upper=100.0,
                          clip_low=0.2, clip_high=0.2)
    # every valid token is in the window; the PPO-clipped one is not a candidate: loss -A * 1.2, no gradient
    close(out.per_token_loss, [[-2.0 * 1.2, 0.0, 0.0], [0.0, 0.0, 0.0]])
    close(grad, [[0.0] * 3, [0.0] * 3])
    assert out.clipped.tolist() == [[True, True, True], [True, True, False]]
    assert float(out.metrics["cov_selected_frac"]) == pytest.approx(4 / 5)


def test_clip_cov_selects_the_share_among_candidates_and_is_deterministic():
    g = torch.Generator().manual_seed(0)
    B, T = 8, 64
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[:, 50:] = False
    n = int(mask.sum())  # 400
    params = dict(clip_ratio=0.05, cov_lower=0.0, cov_upper=5.0)

    def draw(**kw):
        return POLICY_LOSSES.get("clip_cov")(logp, logp, adv, mask, **params, **kw).clipped

    s1 = draw(generator=torch.Generator().manual_seed(7))
    lp = logp
    cov = (lp - lp[mask].mean()) * (adv[:, None] - adv[:, None].expand(B, T)[mask].mean())
    cand = mask & (cov >= 0.0) & (cov <= 5.0)
    assert int(cand.sum()) > 20
    assert int(s1.sum()) == int(0.05 * n) == 20
    assert not bool((s1 & ~cand).any())  # only candidates, never padding
    assert torch.equal(s1, draw(generator=torch.Generator().manual_seed(7)))  # same seed, same tokens
    assert not torch.equal(s1, draw(generator=torch.Generator().manual_seed(8)))
    torch.manual_seed(3)
    a = draw()  # no generator: torch's default generator, seeded by the caller
    torch.manual_seed(3)
    assert torch.equal(a, draw())
    # at least one token even when ratio * N < 1; all candidates when fewer than k
    assert int(POLICY_LOSSES.get("clip_cov")(logp, logp, adv, mask, clip_ratio=1e-6, cov_lower=0.0).clipped.sum()) == 1
    assert int(draw(generator=None).sum()) == 20


def test_clip_cov_nan_padding_is_ignored():
    lr = [[0.1, -0.2, 0.3], [0.0, 0.2, 0.0]]
    adv = [2.0, -2.0]
    ref, ref_grad, _ = run("clip_cov", lr, adv, clip_ratio=1.0, cov_lower=0.3)
    old = [row[:] for row in OLD]
    old[1][2] = float("nan")
    lr_nan = [row[:] for row in lr]
    lr_nan[1][2] = float("nan")
    out, grad, _ = run("clip_cov", lr_nan, adv, old=old, clip_ratio=1.0, cov_lower=0.3)
    assert torch.isfinite(out.per_token_loss).all() and torch.isfinite(grad).all()
    close(out.per_token_loss, ref.per_token_loss.tolist())
    close(grad, ref_grad.tolist())
    assert torch.equal(out.clipped, ref.clipped)


# ---------------------------------------------------------------- kl_cov
def test_kl_cov_penalises_top_covariance_tokens_values_and_gradients_by_hand():
    lr = [[0.1, -0.2, 0.3], [-0.1, 0.2, float("nan")]]
    old = [row[:] for row in OLD]
    old[1][2] = float("nan")
    adv = [1.5, -0.5]
    # k = max(1, floor(0.4 * 5)) = 2
    out, grad, logp = run("kl_cov", lr, adv, old=old, kl_ratio=0.4, kl_coef=0.7)
    cov = hand_cov(logp, adv, MASK)
    top = set(sorted(cov, key=lambda c: -cov[c])[:2])
    exp_loss, exp_grad = [], []
    for b in range(2):
        lrow, grow = [], []
        for t in range(3):
            if not MASK[b][t]:
                lrow.append(0.0), grow.append(0.0)
                continue
            x = lr[b][t]
            r = math.exp(x)
            pen = 0.7 * abs(x) if (b, t) in top else 0.0
            dpen = 0.7 * math.copysign(1.0, x) if (b, t) in top else 0.0
            lrow.append(-adv[b] * r + pen), grow.append(-adv[b] * r + dpen)
        exp_loss.append(lrow), exp_grad.append(grow)
    close(out.per_token_loss, exp_loss)
    close(grad, exp_grad)
    assert not out.clipped.any()
    assert float(out.metrics["kl_selected_frac"]) == pytest.approx(2 / 5)


def test_kl_cov_at_least_one_token_and_no_effect_on_policy():
    lr = [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    adv = [1.0, -1.0]
    out, grad, _ = run("kl_cov", lr, adv, kl_ratio=1e-6, kl_coef=5.0)
    assert float(out.metrics["kl_selected_frac"]) == pytest.approx(1 / 5)
    # |log r| has gradient 0 at r = 1: an on-policy step is the plain surrogate -A r
    close(grad, [[-1.0] * 3, [1.0, 1.0, 0.0]])


# ---------------------------------------------------------------- gmpo
def gmpo_paper_objective(logp, old, adv, mask, eps_low, eps_high):
    """The paper's objective written in ratio space, a loop per row, autograd for the gradient:
    J = mean_i sgn(A_i) prod_t |min(r_t A_i, clip(r_t, e^-eps_low, e^eps_high) A_i)|^(1/|o_i|)."""
    terms = []
    for b in range(len(adv)):
        prod, n = 1.0, 0
        for t in range(logp.shape[1]):
            if not mask[b][t]:
                continue
            r = torch.exp(logp[b, t] - old[b][t])
            rc = torch.clamp(r, math.exp(-eps_low), math.exp(eps_high))
            prod = prod * torch.abs(torch.minimum(r * adv[b], rc * adv[b]))
            n += 1
        terms.append(math.copysign(1.0, adv[b]) * prod ** (1.0 / n))
    return -sum(terms) / len(terms)  # a loss


def test_gmpo_matches_paper_objective_value_and_gradient():
    lr = [[0.1, 0.6, -0.7], [0.3, -0.5, 0.0]]  # row 0 (A > 0): 0.6 clipped; row 1 (A < 0): -0.5 clipped
    adv = [1.5, -0.8]
    old_t = torch.tensor(OLD, dtype=torch.float64)
    logp = (old_t + torch.tensor(lr, dtype=torch.float64)).requires_grad_(True)
    out = POLICY_LOSSES.get("gmpo")(logp, old_t, torch.tensor(adv, dtype=torch.float64), torch.tensor(MASK), clip_low=0.4, clip_high=0.4)
    total = seq_mean_token_mean(out.per_token_loss, torch.tensor(MASK))
    total.backward()

    ref_logp = (old_t + torch.tensor(lr, dtype=torch.float64)).requires_grad_(True)
    ref = gmpo_paper_objective(ref_logp, OLD, adv, MASK, 0.4, 0.4)
    ref.backward()
    assert total.item() == pytest.approx(ref.item(), abs=1e-12)
    close(logp.grad, ref_logp.grad.tolist(), tol=1e-12)
    # hand numbers: g0 = exp((0.1 + 0.4 - 0.7) / 3), g1 = exp((0.3 - 0.4) / 2)
    g0, g1 = math.exp(-0.2 / 3), math.exp(-0.1 / 2)
    close(out.per_token_loss, [[-1.5 * g0] * 3, [0.8 * g1, 0.8 * g1, 0.0]])
    close(logp.grad, [[-1.5 * g0 / 3 / 2, 0.0, -1.5 * g0 / 3 / 2], [0.8 * g1 / 2 / 2, 0.0, 0.0]])
    assert out.clipped.tolist() == [[False, True, False], [False, True, False]]
    assert float(out.metrics["clip_frac_high"]) == pytest.approx(1 / 5)
    assert float(out.metrics["clip_frac_low"]) == pytest.approx(1 / 5)


def test_gmpo_nan_padding_and_per_token_advantages():
    lr = [[0.1, 0.6, -0.7], [0.3, -0.5, float("nan")]]
    old = [row[:] for row in OLD]
    old[1][2] = float("nan")
    out, grad, _ = run("gmpo", lr, [[1.5, 1.5, 1.5], [-0.8, -0.8, float("nan")]], old=old)
    ref, ref_grad, _ = run("gmpo", [[0.1, 0.6, -0.7], [0.3, -0.5, 0.0]], [1.5, -0.8])
    assert torch.isfinite(out.per_token_loss).all() and torch.isfinite(grad).all()
    close(out.per_token_loss, ref.per_token_loss.tolist())
    close(grad, ref_grad.tolist())
