"""The pair losses of mixrl.core.preference_losses (rdpo, slic, copg, osp) against values and
gradients computed by hand from the papers' formulas.

The batch is tests/core/test_preference.py's: one pair, a chosen row of 2 tokens and a rejected
row of 3, aggregated as the objective does (seq-mean-token-sum over the population's 2 rows), so
the value is the pair's loss and each token's gradient is d loss / d s(side). Every expected
number is computed with ``math`` from the formula in the docstring of the test, not with the code.
"""

from __future__ import annotations

import math

import pytest
import torch

from mixrl.core.aggregation import AGGREGATIONS
from mixrl.core.terms import TERMS, TermInputs

LP_W, LP_L = [-1.0, -2.0], [-0.5, -1.5, -1.0]
REF_W, REF_L = [-1.2, -2.1], [-0.4, -1.0, -1.2]
S_W, S_L = sum(LP_W), sum(LP_L)  # -3.0, -3.0
R_W, R_L = sum(REF_W), sum(REF_L)  # -3.3, -2.6
D_W, D_L = S_W - R_W, S_L - R_L  # Delta(y_w) = 0.3, Delta(y_l) = -0.4


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def _softplus(z: float) -> float:  # -log sigmoid(-z)
    return math.log1p(math.exp(z))


def _loss(kind: str, params: dict, *, rewards=(1.0, 0.0), rows_sel=(0, 1)):
    """(value, d value / d logp, metrics) of one term on the pair; ``rewards``: (R(y_w), R(y_l))."""
    logp = torch.tensor([[*LP_W, 0.0], LP_L], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[*REF_W, 0.0], REF_L], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    rows = {
        "pair_index": torch.tensor([0, 0]), "pair_side": torch.tensor([1, 0]),
        "pair_partner_logp": torch.tensor([S_L, S_W], dtype=torch.float64),
        "pair_partner_ref_logp": torch.tensor([R_L, R_W], dtype=torch.float64),
        "pair_partner_len": torch.tensor([3.0, 2.0], dtype=torch.float64),
        "pair_reward": torch.tensor([rewards[0], rewards[1]]),
        "pair_partner_reward": torch.tensor([rewards[1], rewards[0]]),
    }
    sel = torch.zeros_like(mask)
    for r in rows_sel:
        sel[r] = mask[r]
    x = TermInputs(logp=logp, mask=sel, advantages=torch.zeros(2), behaviour_logp=logp.detach(), ref_logp=ref, rows=rows)
    out = TERMS.get(kind)(x, **params)
    value = AGGREGATIONS.get("seq-mean-token-sum")(out.per_token * sel, sel, num_items=2.0)
    value.backward()
    return float(value.detach()), logp.grad.clone(), out.metrics


def _grad(gw: float, gl: float) -> torch.Tensor:
    """gw on each chosen token, gl on each rejected token."""
    return torch.tensor([[gw, gw, 0.0], [gl, gl, gl]], dtype=torch.float64)


def test_rdpo_value_and_gradient_by_hand():
    """L = [(1 - e) softplus(-h) - e softplus(h)] / (1 - 2e), h = beta (D_w - D_l);
    dL/dh = [-(1 - e) sigmoid(-h) - e sigmoid(h)] / (1 - 2e)."""
    beta, eps = 0.5, 0.2
    h = beta * (D_W - D_L)  # 0.35
    value, grad, metrics = _loss("rdpo", {"beta": beta, "epsilon": eps})
    assert value == pytest.approx(((1 - eps) * _softplus(-h) - eps * _softplus(h)) / (1 - 2 * eps), abs=1e-12)
    dh = (-(1 - eps) * _sigmoid(-h) - eps * _sigmoid(h)) / (1 - 2 * eps)
    torch.testing.assert_close(grad, _grad(beta * dh, -beta * dh))
    assert metrics["rdpo/margin"] == pytest.approx(h)


def test_rdpo_at_zero_flip_rate_is_dpo():
    v_r, g_r, _ = _loss("rdpo", {"beta": 0.5, "epsilon": 0.0})
    v_d, g_d, _ = _loss("dpo", {"beta": 0.5})
    assert v_r == pytest.approx(v_d, abs=1e-12)
    torch.testing.assert_close(g_r, g_d)


def test_rdpo_matches_trl_robust_loss_expression():
    """TRL 1.16.0 dpo_trainer.py, loss_type "robust" (lines 1428-1431 of the installed release):
    (-(1 - ls) logsigmoid(beta d) + ls logsigmoid(-beta d)) / (1 - 2 ls)."""
    beta, ls = 0.3, 0.1
    d = torch.tensor(D_W - D_L, dtype=torch.float64)
    trl = (-(1 - ls) * torch.nn.functional.logsigmoid(beta * d) + ls * torch.nn.functional.logsigmoid(-beta * d)) / (1 - 2 * ls)
    value, _, _ = _loss("rdpo", {"beta": beta, "epsilon": ls})
    assert value == pytest.approx(float(trl), abs=1e-12)


def test_slic_hinge_norm_with_reference_by_hand():
    """RSO's hinge-norm: L = max(0, delta - beta (D_w - D_l)); inside the margin dL/ds_w = -beta."""
    beta, delta = 0.5, 1.0
    value, grad, metrics = _loss("slic", {"beta": beta, "delta": delta, "reference": True})
    assert value == pytest.approx(delta - beta * (D_W - D_L), abs=1e-12)  # 0.65
    torch.testing.assert_close(grad, _grad(-beta, beta))
    assert metrics["slic/active"] == 1.0


def test_slic_hf_calibration_without_reference_and_its_regulariser_by_hand():
    """SLiC-HF: L = max(0, delta - beta (s_w - s_l)) + alpha (-s_w / |y_w|); s_w = s_l = -3 here."""
    beta, delta, alpha = 2.0, 0.5, 0.3
    value, grad, _ = _loss("slic", {"beta": beta, "delta": delta, "reference": False, "alpha": alpha})
    assert value == pytest.approx(max(0.0, delta - beta * (S_W - S_L)) + alpha * (-S_W / 2), abs=1e-12)
    torch.testing.assert_close(grad, _grad(-beta - alpha / 2, beta))


def test_slic_outside_the_margin_gives_no_gradient():
    value, grad, metrics = _loss("slic", {"beta": 0.5, "delta": 0.1, "reference": True})  # h = 0.35 > 0.1
    assert value == 0.0 and float(grad.abs().sum()) == 0.0 and metrics["slic/active"] == 0.0


def test_copg_value_and_gradient_by_hand():
    """L = [R_w - R_l - beta (D_w - D_l)]^2; dL/ds_w = -2 beta resid, dL/ds_l = +2 beta resid."""
    beta = 0.5
    resid = (1.0 - 0.0) - beta * (D_W - D_L)  # 0.65
    value, grad, metrics = _loss("copg", {"beta": beta}, rewards=(1.0, 0.0))
    assert value == pytest.approx(resid ** 2, abs=1e-12)
    torch.testing.assert_close(grad, _grad(-2 * beta * resid, 2 * beta * resid))
    assert metrics["copg/residual"] == pytest.approx(abs(resid))


def test_copg_with_a_half_reward_gap_is_beta_squared_times_ipo_on_sums():
    """With R_w - R_l = 1/2: [1/2 - beta h]^2 = beta^2 (h - 1 / (2 beta))^2, h = D_w - D_l (IPO at tau = beta, sequence sums)."""
    beta = 0.25
    value, _, _ = _loss("copg", {"beta": beta}, rewards=(0.75, 0.25))
    h = D_W - D_L
    assert value == pytest.approx(beta ** 2 * (h - 1 / (2 * beta)) ** 2, abs=1e-12)


def test_copg_split_over_micro_batches_adds_up_to_the_pair():
    v_all, g_all, _ = _loss("copg", {"beta": 0.5})
    v_w, g_w, _ = _loss("copg", {"beta": 0.5}, rows_sel=(0,))
    v_l, g_l, _ = _loss("copg", {"beta": 0.5}, rows_sel=(1,))
    assert v_w + v_l == pytest.approx(v_all, abs=1e-12)
    torch.testing.assert_close(g_w + g_l, g_all)


def test_osp_soft_preference_by_hand():
    """L = -p log sigmoid(h) - (1 - p) log sigmoid(-h), p = sigmoid((R_w - R_l) / T);
    dL/dh = -p sigmoid(-h) + (1 - p) sigmoid(h)."""
    beta, temp = 0.5, 0.5
    p = _sigmoid((1.0 - 0.0) / temp)
    h = beta * (D_W - D_L)
    value, grad, metrics = _loss("osp", {"beta": beta, "temperature": temp}, rewards=(1.0, 0.0))
    assert value == pytest.approx(p * _softplus(-h) + (1 - p) * _softplus(h), abs=1e-12)
    dh = -p * _sigmoid(-h) + (1 - p) * _sigmoid(h)
    torch.testing.assert_close(grad, _grad(beta * dh, -beta * dh))
    assert metrics["osp/strength"] == pytest.approx(p)


def test_osp_equal_rewards_pull_the_log_ratios_together():
    """p = 1/2: dL/dh = (sigmoid(h) - sigmoid(-h)) / 2 > 0 for h > 0, so the chosen side is pushed down."""
    beta = 0.5
    h = beta * (D_W - D_L)
    _, grad, _ = _loss("osp", {"beta": beta}, rewards=(1.0, 1.0))
    dh = 0.5 * (_sigmoid(h) - _sigmoid(-h))
    torch.testing.assert_close(grad, _grad(beta * dh, -beta * dh))


def test_reward_reading_terms_say_what_is_missing():
    with pytest.raises(ValueError, match="both sides' rewards"):
        _loss("copg", {"beta": 0.5}, rewards=(1.0, float("nan")))
    logp = torch.zeros(2, 3, requires_grad=True)
    rows = {"pair_index": torch.tensor([0, 0]), "pair_side": torch.tensor([1, 0]),
            "pair_partner_logp": torch.zeros(2), "pair_partner_ref_logp": torch.zeros(2), "pair_partner_len": torch.ones(2) * 3}
    x = TermInputs(logp=logp, mask=torch.ones(2, 3, dtype=torch.bool), advantages=torch.zeros(2),
                   behaviour_logp=logp.detach(), ref_logp=logp.detach(), rows=rows)
    with pytest.raises(ValueError, match="pair_reward"):
        TERMS.get("osp")(x)


@pytest.mark.parametrize("kind,params", [("rdpo", ("beta", "epsilon")), ("slic", ("beta", "delta", "alpha")),
                                         ("copg", ("beta",)), ("osp", ("beta", "temperature"))])
def test_pair_losses_declare_their_ranges_and_read_the_reference(kind, params):
    assert set(params) <= set(TERMS.bounds(kind))
    assert getattr(TERMS.get(kind), "row_loss", False) and "ref_logp" in TERMS.get(kind).needs


@pytest.mark.parametrize("kind", ["rdpo", "slic", "copg", "osp"])
def test_a_micro_batch_without_pairs_gives_zero_loss(kind):
    logp = torch.zeros(2, 3, requires_grad=True)
    x = TermInputs(logp=logp, mask=torch.zeros(2, 3, dtype=torch.bool), advantages=torch.zeros(2),
                   behaviour_logp=logp.detach(), ref_logp=logp.detach())
    out = TERMS.get(kind)(x)
    assert float(out.per_token.detach().abs().sum()) == 0.0 and out.per_token.requires_grad


def test_spin_authors_loss_is_dpo_and_hinge_norm_with_the_demonstration_chosen():
    """uclaml/SPIN, spin/alignment/trainer.py, spin_loss (lines 416-450 at commit
    a12ba808a51c23bb98c7cc892d261e9c2f71ff8e): logits = (pi_real - pi_generated) - (opp_real - opp_generated);
    sigmoid: -logsigmoid(beta logits); hinge: relu(1 - beta logits). With real = the chosen side and
    the opponent = the reference, these are the dpo term and the slic term (reference, delta 1)."""
    beta = 0.5
    logits = (S_W - S_L) - (R_W - R_L)
    v_dpo, _, _ = _loss("dpo", {"beta": beta})
    v_hinge, _, _ = _loss("slic", {"beta": beta, "delta": 1.0, "reference": True})
    assert v_dpo == pytest.approx(_softplus(-beta * logits), abs=1e-12)
    assert v_hinge == pytest.approx(max(0.0, 1 - beta * logits), abs=1e-12)
