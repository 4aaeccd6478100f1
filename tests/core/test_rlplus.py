"""RL-PLUS's external term (mixrl.core.rlplus): the ratio against the mixture of behaviour
policies and the exploration-weighted advantage, value and gradient by hand."""

from __future__ import annotations

import math

import pytest
import torch

from mixrl.core import provenance as prov
from mixrl.core.objective import Objective, TermSpec, compute_objective
from mixrl.core.terms import TERMS, TermInputs

L = math.log


def _x(logp, old, adv):
    return TermInputs(logp=logp, mask=torch.ones_like(logp, dtype=torch.bool), advantages=adv,
                      behaviour_logp=logp.detach(), old_logp=old)


def test_rlplus_external_value_and_gradient_by_hand():
    """Token 0: p = pi_old = 0.5: r = 0.5 / (0.25 + 0.5) = 2/3, C = 0.5, A = 2: l = -2/3.
    Token 1: p = 0.2, pi_old = 0.8 (the policy moved): r = 0.2 / (0.4 + 0.5) = 2/9, C = 0.8: l = -0.8 * 2 * 2/9.
    The gradient of -C A r with respect to log p is -C A r (r is proportional to p; C and the denominator are constants)."""
    logp = torch.tensor([[L(0.5), L(0.2)]], requires_grad=True)
    out = TERMS.get("rlplus_external")(_x(logp, torch.tensor([[L(0.5), L(0.8)]]), torch.tensor([2.0])),
                                       omega=0.5, external_prob=1.0, gamma=1.0)
    expect = [-0.5 * 2 * (2 / 3), -0.8 * 2 * (2 / 9)]
    assert out.per_token[0].tolist() == pytest.approx(expect)
    out.per_token.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx(expect)


def test_rlplus_gamma_omega_and_external_prob():
    """p = 0.2, pi_old = 0.8, omega = 0.25, pi_e = 0.5, gamma = 2: r = 0.2 / (0.2 + 0.375) = 0.2 / 0.575,
    C = 0.8^2 = 0.64, A = -1: l = 0.64 r (a failed external row pushes its tokens down, most on unlikely ones)."""
    logp = torch.tensor([[L(0.2)]], requires_grad=True)
    out = TERMS.get("rlplus_external")(_x(logp, torch.tensor([[L(0.8)]]), torch.tensor([-1.0])),
                                       omega=0.25, external_prob=0.5, gamma=2.0)
    r = 0.2 / 0.575
    assert out.per_token.item() == pytest.approx(0.64 * r)
    out.per_token.sum().backward()
    assert logp.grad.item() == pytest.approx(0.64 * r)


def test_the_mixture_bounds_the_ratio_where_pi_old_vanishes():
    """pi_old ~ 0: a ratio against pi_old alone would be ~1e9; against the mixture it is p / ((1 - omega) pi_e) <= 2."""
    logp = torch.tensor([[L(0.9)]])
    out = TERMS.get("rlplus_external")(_x(logp, torch.tensor([[L(1e-9)]]), torch.tensor([1.0])), omega=0.5, gamma=0.0)
    assert out.per_token.item() == pytest.approx(-1.8, rel=1e-6)
    assert out.metrics["rlplus/ratio"] == pytest.approx(1.8, rel=1e-6)


def test_rlplus_objective_reads_pi_old_on_expert_tokens():
    """Through compute_objective: old_logp (pi_old) reaches the term on expert tokens (their behaviour
    is unknown, so behaviour_logp is not it). One rollout token (A = 1, r = 1) and one expert token as in
    the first case, token-mean over both: L = (-1 - 2/3 * 0.5 * 1) / 2 with A = 1."""
    logp = torch.tensor([[L(0.5)], [L(0.5)]], requires_grad=True)
    obj = Objective([
        TermSpec("policy", "policy", ("on_policy",), ("on_policy", "expert"), 1.0, "token-mean", {}, {"loss": {"name": "ppo_clip"}}),
        TermSpec("external", "rlplus_external", ("expert",), ("on_policy", "expert"), 1.0, "token-mean", {}, {}),
    ])
    loss, _ = compute_objective(obj, logp=logp, mask=torch.ones(2, 1), advantages=torch.tensor([1.0, 1.0]),
                                token_source=torch.tensor([[prov.ON_POLICY], [prov.EXPERT]]),
                                old_logp=torch.tensor([[L(0.5)], [L(0.5)]]))
    assert loss.item() == pytest.approx((-1.0 - 0.5 * (2 / 3)) / 2)
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([-0.5, -0.5 * (2 / 3) / 2])
