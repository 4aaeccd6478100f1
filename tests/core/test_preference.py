"""The preference terms (mixrl.core.preference) against hand-computed values and gradients.

One pair: a chosen row of 2 tokens and a rejected row of 3 tokens (row width 3), aggregated as
the objective does (seq-mean-token-sum over the population's 2 rows). Every expected number
below is computed with ``math`` from the paper's formula, not with the code under test.
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


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def _batch():
    logp = torch.tensor([[*LP_W, 0.0], LP_L], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[*REF_W, 0.0], REF_L], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    rows = {
        "pair_index": torch.tensor([0, 0]),
        "pair_side": torch.tensor([1, 0]),
        # recorded partner values (used only when the partner is not in the micro-batch)
        "pair_partner_logp": torch.tensor([S_L, S_W], dtype=torch.float64),
        "pair_partner_ref_logp": torch.tensor([R_L, R_W], dtype=torch.float64),
        "pair_partner_len": torch.tensor([3.0, 2.0], dtype=torch.float64),
    }
    return logp, ref, mask, rows


def _loss(kind: str, params: dict, *, rows_sel=(0, 1), num_rows: float = 2.0):
    """The objective's value of one term on the selected rows, and d loss / d logp."""
    logp, ref, mask, rows = _batch()
    sel = torch.zeros_like(mask)
    for r in rows_sel:
        sel[r] = mask[r]
    x = TermInputs(logp=logp, mask=sel, advantages=torch.zeros(2), behaviour_logp=logp.detach(), ref_logp=ref, rows=rows)
    out = TERMS.get(kind)(x, **params)
    value = AGGREGATIONS.get("seq-mean-token-sum")(out.per_token * sel, sel, num_items=num_rows)
    value.backward()
    return float(value.detach()), logp.grad.clone(), out.metrics


def _grad(gw: float, gl: float) -> torch.Tensor:
    """Expected d loss / d logp: gw on each chosen token, gl on each rejected token."""
    return torch.tensor([[gw, gw, 0.0], [gl, gl, gl]], dtype=torch.float64)


def test_dpo_value_and_gradient_by_hand():
    beta = 0.5
    h = beta * ((S_W - R_W) - (S_L - R_L))  # 0.5 * (0.3 + 0.4) = 0.35
    assert h == pytest.approx(0.35)
    value, grad, metrics = _loss("dpo", {"beta": beta})
    assert value == pytest.approx(math.log(1.0 + math.exp(-h)), abs=1e-12)  # 0.533378...
    assert value == pytest.approx(0.5333822, abs=1e-6)
    g = beta * _sigmoid(-h)  # d(-log sigmoid(h))/d s(y_w) = -beta sigmoid(-h)
    torch.testing.assert_close(grad, _grad(-g, g))
    assert metrics["dpo/margin"] == pytest.approx(h)
    assert metrics["dpo/accuracy"] == 1.0


def test_dpo_split_over_micro_batches_adds_up_to_the_pair():
    """The two sides in different micro-batches (partner values recorded at append time):
    values and gradients of the two halves add up to the joint ones."""
    v_all, g_all, _ = _loss("dpo", {"beta": 0.5})
    v_w, g_w, _ = _loss("dpo", {"beta": 0.5}, rows_sel=(0,))
    v_l, g_l, _ = _loss("dpo", {"beta": 0.5}, rows_sel=(1,))
    assert v_w + v_l == pytest.approx(v_all, abs=1e-12)
    torch.testing.assert_close(g_w + g_l, g_all)
    assert float(g_w[1].abs().sum()) == 0.0 and float(g_l[0].abs().sum()) == 0.0


def test_ipo_value_and_gradient_by_hand():
    tau = 0.25
    h = (S_W - R_W) / 2 - (S_L - R_L) / 3  # 0.15 + 0.1333 = 0.28333
    value, grad, _ = _loss("ipo", {"tau": tau})
    target = 1.0 / (2 * tau)  # 2
    assert value == pytest.approx((h - target) ** 2, abs=1e-12)
    d = 2 * (h - target)  # dL/dh
    torch.testing.assert_close(grad, _grad(d / 2, -d / 3))


def test_rpo_adds_the_chosen_nll_by_hand():
    beta, alpha = 0.5, 0.3
    h = beta * ((S_W - R_W) - (S_L - R_L))
    value, grad, metrics = _loss("rpo", {"beta": beta, "alpha": alpha})
    nll = -S_W / 2  # 1.5: per-token NLL of the chosen side
    assert value == pytest.approx(math.log(1.0 + math.exp(-h)) + alpha * nll, abs=1e-12)
    g = beta * _sigmoid(-h)
    torch.testing.assert_close(grad, _grad(-g - alpha / 2, g))
    assert metrics["rpo/nll"] == pytest.approx(nll)


def test_wpo_weight_is_the_detached_length_normalised_pair_probability():
    beta = 0.5
    h = beta * ((S_W - R_W) - (S_L - R_L))
    w = math.exp(S_W / 2) * math.exp(S_L / 3)  # exp(-1.5) * exp(-1.0)
    value, grad, metrics = _loss("wpo", {"beta": beta})
    assert value == pytest.approx(w * math.log(1.0 + math.exp(-h)), abs=1e-12)
    g = w * beta * _sigmoid(-h)  # the weight is a constant: no gradient through it
    torch.testing.assert_close(grad, _grad(-g, g))
    assert metrics["wpo/weight"] == pytest.approx(w)


def test_seq_kl_value_and_reinforce_gradient_by_hand():
    """HyPO's online KL on two sampled rows: value mean_b sum_t (log p - log p_ref), gradient
    KL(y_b) / N on each token of row b (the score-function estimator)."""
    logp, ref, mask, _ = _batch()
    x = TermInputs(logp=logp, mask=mask, advantages=torch.zeros(2), behaviour_logp=logp.detach(), ref_logp=ref)
    out = TERMS.get("seq_kl")(x)
    value = AGGREGATIONS.get("seq-mean-token-sum")(out.per_token * mask, mask, num_items=2.0)
    value.backward()
    k0, k1 = S_W - R_W, S_L - R_L  # 0.3, -0.4
    assert float(value.detach()) == pytest.approx((k0 + k1) / 2, abs=1e-12)
    torch.testing.assert_close(logp.grad, torch.tensor([[k0 / 2, k0 / 2, 0.0], [k1 / 2, k1 / 2, k1 / 2]], dtype=torch.float64))
    assert out.metrics["seq_kl"] == pytest.approx((k0 + k1) / 2)


def test_pair_term_without_pair_fields_says_what_is_missing():
    logp, ref, mask, _ = _batch()
    x = TermInputs(logp=logp, mask=mask, advantages=torch.zeros(2), behaviour_logp=logp.detach(), ref_logp=ref)
    with pytest.raises(ValueError, match="pair_index"):
        TERMS.get("dpo")(x, beta=0.1)


def test_rows_outside_any_pair_get_no_loss():
    """A row with pair_index -1 (a rollout in the same population) contributes nothing, and NaN
    partner fields of such rows never reach the loss."""
    logp, ref, mask, rows = _batch()
    rows = {k: v.clone() for k, v in rows.items()}
    rows["pair_index"][1] = -1
    rows["pair_side"][1] = -1
    rows["pair_partner_logp"][1] = float("nan")
    x = TermInputs(logp=logp, mask=mask, advantages=torch.zeros(2), behaviour_logp=logp.detach(), ref_logp=ref, rows=rows)
    out = TERMS.get("dpo")(x, beta=0.5)
    assert torch.isfinite(out.per_token).all()
    assert float(out.per_token[1].abs().sum()) == 0.0
    # row 0 now takes its partner from the recorded values: the same pair loss as before
    h = 0.5 * ((S_W - R_W) - (S_L - R_L))
    assert float(out.per_token[0].sum()) == pytest.approx(math.log(1.0 + math.exp(-h)), abs=1e-12)


@pytest.mark.parametrize("kind,param", [("dpo", "beta"), ("ipo", "tau"), ("wpo", "beta"), ("rpo", "beta")])
def test_preference_terms_declare_their_ranges(kind, param):
    assert param in TERMS.bounds(kind)
    assert getattr(TERMS.get(kind), "row_loss", False)
    assert "ref_logp" in TERMS.get(kind).needs


@pytest.mark.parametrize("kind", ["dpo", "ipo", "rpo", "wpo"])
def test_a_micro_batch_without_pairs_gives_zero_loss_without_pair_fields(kind):
    """A step whose groups all tied appends no pair (no pair_* fields in the batch): zero loss, no error."""
    logp = torch.zeros(2, 3, requires_grad=True)
    x = TermInputs(logp=logp, mask=torch.zeros(2, 3, dtype=torch.bool), advantages=torch.zeros(2),
                   behaviour_logp=logp.detach(), ref_logp=logp.detach())
    out = TERMS.get(kind)(x)
    assert float(out.per_token.abs().sum()) == 0.0 and out.per_token.requires_grad
