"""A-LoL's offline term (mixrl.core.alol): value and gradient by hand, the negative-advantage
filter, the clipped sequence-level weight against the reference, and the row aggregation."""

from __future__ import annotations

import math

import pytest
import torch

from mixrl.core import provenance as prov
from mixrl.core.objective import Objective, TermSpec, compute_objective
from mixrl.core.terms import TERMS, TermInputs

EX = prov.EXPERT
L = math.log


def _case():
    """Three expert rows of at most 2 tokens.
    row 0: A = 0.5, pi/pi_ref = (0.5 * 0.45) / (0.5 * 0.5) = 0.9 -> w = 0.9 (inside [0.8, 1.2]);
    row 1: A = -0.3 -> dropped;
    row 2: A = 1.0, one token, pi/pi_ref = 0.8 / 0.2 = 4 -> w = 1.2 (clipped)."""
    logp = torch.tensor([[L(0.5), L(0.45)], [L(0.3), L(0.3)], [L(0.8), 0.0]], requires_grad=True)
    ref = torch.tensor([[L(0.5), L(0.5)], [L(0.9), L(0.9)], [L(0.2), 0.0]])
    mask = torch.tensor([[True, True], [True, True], [True, False]])
    adv = torch.tensor([0.5, -0.3, 1.0])
    return logp, ref, mask, adv


def test_alol_value_and_gradient_by_hand():
    logp, ref, mask, adv = _case()
    x = TermInputs(logp=logp, mask=mask, advantages=adv, behaviour_logp=logp.detach(), ref_logp=ref)
    out = TERMS.get("alol")(x, clip_eps=0.2)
    per = out.per_token
    assert per[0].tolist() == pytest.approx([-0.45 * L(0.5), -0.45 * L(0.45)])  # -A w log p, A w = 0.5 * 0.9
    assert per[1].tolist() == pytest.approx([0.0, 0.0])  # negative advantage: dropped
    assert per[2, 0].item() == pytest.approx(-1.2 * L(0.8))  # w clipped at 1 + 0.2
    (per * mask).sum().backward()
    assert logp.grad.flatten().tolist() == pytest.approx([-0.45, -0.45, 0.0, 0.0, -1.2, 0.0])
    assert out.metrics["alol/kept"] == pytest.approx(2 / 3)
    assert out.metrics["alol/weight"] == pytest.approx((0.9 + 1.2) / 2)


def test_alol_weight_is_clipped_from_below_too():
    """pi/pi_ref = 0.1 -> w = 1 - 0.2 = 0.8: l = -A 0.8 log p."""
    logp = torch.tensor([[L(0.05)]], requires_grad=True)
    x = TermInputs(logp=logp, mask=torch.ones(1, 1, dtype=torch.bool), advantages=torch.tensor([2.0]),
                   behaviour_logp=logp.detach(), ref_logp=torch.tensor([[L(0.5)]]))
    out = TERMS.get("alol")(x, clip_eps=0.2)
    assert out.per_token.item() == pytest.approx(-1.6 * L(0.05))
    out.per_token.sum().backward()
    assert logp.grad.item() == pytest.approx(-1.6)


def test_alol_objective_is_the_row_mean_of_sequence_losses():
    """seq-mean-token-sum over the 3 expert rows: L = (l_0 + 0 + l_2) / 3, dL/dlogp = -A w / 3."""
    logp, ref, mask, adv = _case()
    obj = Objective([TermSpec("offline", "alol", ("expert",), None, 1.0, "seq-mean-token-sum", {}, {"clip_eps": 0.2})])
    loss, metrics = compute_objective(obj, logp=logp, mask=mask, advantages=adv,
                                      token_source=torch.full((3, 2), EX), ref_logp=ref)
    expect = (-0.45 * (L(0.5) + L(0.45)) - 1.2 * L(0.8)) / 3
    assert loss.item() == pytest.approx(expect, rel=1e-6)
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([-0.15, -0.15, 0.0, 0.0, -0.4, 0.0])
    assert metrics["loss/offline"] == pytest.approx(expect, rel=1e-6)


def test_alol_refuses_a_clip_that_makes_the_weight_zero():
    from mixrl.core.registry import ComponentParamError

    with pytest.raises(ComponentParamError, match="clip_eps"):
        TERMS.check_ranges("alol", {"clip_eps": 1.0}, "algo.terms.offline")
