"""The paper readings added for stale and replayed data, against hand computation: TOPR's
trajectory-ratio taper, M2PO's budget over harmful tokens only (A log r > 0), and ReMix's
KL-Convex term (values and d loss / d logp)."""

import math

import pytest
import torch

from mixrl.core import POLICY_LOSSES
from mixrl.core.terms import TERMS, TermInputs

OLD = [[-1.0, -2.0, -0.5], [-0.7, -1.2, -3.0]]
MASK = [[1, 1, 1], [1, 1, 0]]


def run(name, log_ratios, adv, **params):
    old = torch.tensor(OLD, dtype=torch.float64)
    logp = (old + torch.tensor(log_ratios, dtype=torch.float64)).requires_grad_(True)
    out = POLICY_LOSSES.get(name)(logp, old, torch.tensor(adv, dtype=torch.float64), torch.as_tensor(MASK), **params)
    out.per_token_loss.sum().backward()
    return out, logp.grad, logp.detach()


def close(a, b):
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    assert a.flatten().tolist() == pytest.approx(b.flatten().tolist(), abs=1e-9) and a.shape == b.shape


def test_topr_trajectory_taper_uses_the_rows_ratio_product():
    """Row 0 (A = 2): no ratio, gradient -A. Row 1 (A = -1), valid ratios 0.5 and 0.8: the
    token taper weighs them 0.5 and 0.8, the trajectory taper both by clip(0.5 * 0.8, 0, 1) = 0.4."""
    lr = [[math.log(3.0), math.log(0.5), 0.0], [math.log(0.5), math.log(0.8), 5.0]]  # row 1 last: padding
    adv = [2.0, -1.0]
    out, grad, logp = run("topr", lr, adv, taper="trajectory")
    close(grad, [[-2.0, -2.0, -2.0], [0.4, 0.4, 0.0]])
    close(out.per_token_loss[1], [0.4 * float(logp[1, 0]), 0.4 * float(logp[1, 1]), 0.0])
    assert not out.clipped.any()
    _, grad_tok, _ = run("topr", lr, adv)  # default: per token, unchanged
    close(grad_tok[1], [0.5, 0.8, 0.0])
    # a negative row whose trajectory ratio exceeds 1 (3 * 0.5 = 1.5) is truncated to 1 on every token
    out, grad, _ = run("topr", [[0.0] * 3, [math.log(3.0), math.log(0.5), 0.0]], [1.0, -1.0], taper="trajectory")
    close(grad[1], [1.0, 1.0, 0.0])
    assert out.clipped.tolist() == [[False] * 3, [True, True, False]]


def test_m2po_harmful_budget_masks_only_tokens_with_a_log_r_positive():
    """A = [1, -2]. Tokens (row, t): log r (0,1) = 0.1 (A log r > 0: harmful), (0,2) = -0.6
    (not), (1,0) = -0.5 (harmful), (1,1) = 0.05 (not), (0,0) = 0 (not).
    all: squares [0, .01, .36, .25, .0025]: drop .36 (mean .1245), then .25 (mean .0656) -> mean .004.
    harmful: squares [.01, .25]: mean .13 > .04, drop .25 -> .01; (0,2) stays although its
    (log r)^2 = .36 is the largest."""
    lr = [[0.0, 0.1, -0.6], [-0.5, 0.05, 9.0]]
    adv = [1.0, -2.0]
    out_all, _, _ = run("m2po", lr, adv)
    assert out_all.clipped.tolist() == [[False, False, True], [True, False, False]]
    out, grad, _ = run("m2po", lr, adv, budget_over="harmful")
    assert out.clipped.tolist() == [[False, False, False], [True, False, False]]
    expected = [[-math.exp(lr[0][t]) * adv[0] for t in range(3)], [0.0, -math.exp(0.05) * adv[1], 0.0]]
    close(out.per_token_loss, expected)
    close(grad, expected)  # d(-r A)/dlogp = -r A on kept tokens
    with pytest.raises(ValueError, match="budget_over"):
        run("m2po", lr, adv, budget_over="some")


def test_kl_convex_is_a_convex_combination_of_kl_to_base_and_to_behaviour():
    """k3(x) = e^x - 1 - x with x = log(q / p); d k3 / d logp = 1 - q / p. p = 0.5, reference
    q = 0.25, behaviour b = 0.4, lam = 0.3:
    l = 0.3 (0.5 - 1 - log 0.5) + 0.7 (0.8 - 1 - log 0.8); dl/dlogp = 0.3 (1 - 0.5) + 0.7 (1 - 0.8)."""
    logp = torch.tensor([[math.log(0.5)]], dtype=torch.float64, requires_grad=True)
    x = TermInputs(logp=logp, mask=torch.ones(1, 1, dtype=torch.bool), advantages=torch.zeros(1),
                   behaviour_logp=torch.tensor([[math.log(0.4)]], dtype=torch.float64),
                   ref_logp=torch.tensor([[math.log(0.25)]], dtype=torch.float64))
    out = TERMS.get("kl_convex")(x, lam=0.3)
    out.per_token.sum().backward()
    want = 0.3 * (0.5 - 1 - math.log(0.5)) + 0.7 * (0.8 - 1 - math.log(0.8))
    assert float(out.per_token.detach()) == pytest.approx(want)
    assert float(logp.grad) == pytest.approx(0.3 * 0.5 + 0.7 * 0.2)
    assert out.metrics["kl_convex/base"] == pytest.approx(0.5 - 1 - math.log(0.5))
    with pytest.raises(ValueError, match="lam"):
        TERMS.get("kl_convex")(x, lam=1.5)
