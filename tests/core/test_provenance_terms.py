"""Per-token provenance, behaviour log-probs and knobs in the objective, against hand values.

A row may mix provenances (a demonstration prefix followed by the policy's continuation);
each term sees only the tokens it selects, a ratio is taken against the behaviour the
token's provenance declares (the rollout's old log-prob, or a recorded one), and values at
tokens a term does not select (NaN included) never reach the loss or the gradient.
"""

from __future__ import annotations

import math

import pytest
import torch

from mixrl.core import provenance as prov
from mixrl.core.objective import Objective, TermSpec, compute_objective, parse_weight_ref

STORED = prov.register_provenance(
    "test_stored", behaviour="stored", description="test: sampled by another policy whose log-probs were recorded"
).code
ON, EXP = prov.ON_POLICY, prov.EXPERT
PPO = {"name": "ppo_clip", "clip_low": 0.2, "clip_high": 0.2}


def _ppo(lp, old, a, eps=0.2):
    r = math.exp(lp - old)
    unclipped, clipped = r * a, min(max(r, 1 - eps), 1 + eps) * a
    return -min(unclipped, clipped), (-a * r if unclipped <= clipped else 0.0)


def test_mixed_row_prefix_tokens_get_exactly_their_terms_gradient():
    """Row = 2 expert prefix tokens + 2 on-policy continuation tokens. Policy term on the
    continuation (ratios against its old log-probs), NLL on the prefix with weight 0.5."""
    logp = torch.tensor([[-0.4, -1.1, -0.2, -0.9]], requires_grad=True)
    old = torch.tensor([[float("nan"), float("nan"), -0.35, -0.9]])  # no behaviour log-prob for the prefix
    src = torch.tensor([[EXP, EXP, ON, ON]])
    mask = torch.ones(1, 4)
    adv = torch.tensor([1.0])
    obj = Objective([
        TermSpec("policy", "policy", ("on_policy",), None, 1.0, "token-mean", {}, {"loss": PPO}),
        TermSpec("prefix", "nll", ("expert",), None, 0.5, "token-mean", {}, {}),
    ])
    loss, metrics = compute_objective(obj, logp=logp, mask=mask, advantages=adv, token_source=src, old_logp=old)
    pol = [_ppo(-0.2, -0.35, 1.0), _ppo(-0.9, -0.9, 1.0)]
    nll = (0.4 + 1.1) / 2
    assert loss.item() == pytest.approx((pol[0][0] + pol[1][0]) / 2 + 0.5 * nll, rel=1e-6)
    loss.backward()
    assert logp.grad[0, 0].item() == pytest.approx(-0.5 / 2)  # d(0.5 * -logp / 2)
    assert logp.grad[0, 1].item() == pytest.approx(-0.5 / 2)
    assert logp.grad[0, 2].item() == pytest.approx(pol[0][1] / 2, rel=1e-6)
    assert logp.grad[0, 3].item() == pytest.approx(pol[1][1] / 2, rel=1e-6)
    assert torch.isfinite(loss) and metrics["expert/row_frac"] == 1.0


def test_prefix_tokens_not_selected_get_zero_gradient():
    logp = torch.tensor([[-0.4, -1.1, -0.2]], requires_grad=True)
    src = torch.tensor([[EXP, EXP, ON]])
    obj = Objective([TermSpec("policy", "policy", ("on_policy",), None, 1.0, "token-mean", {}, {"loss": PPO})])
    loss, _ = compute_objective(obj, logp=logp, mask=torch.ones(1, 3), advantages=torch.tensor([2.0]), token_source=src,
                                old_logp=torch.full((1, 3), float("nan")).index_fill(1, torch.tensor([2]), -0.2))
    loss.backward()
    assert logp.grad[0, :2].tolist() == [0.0, 0.0]
    assert logp.grad[0, 2].item() == pytest.approx(-2.0)  # r = 1: d(-A r)/dlogp = -A


def test_stored_behaviour_is_the_ratio_denominator():
    """A stored provenance's ratio is taken against its recorded log-prob, not old_logp."""
    logp = torch.tensor([[-0.5, -1.0]], requires_grad=True)
    old = torch.tensor([[-0.5, -1.0]])  # the current policy's own: r would be 1
    beh = torch.tensor([[-0.6, -1.02]])  # recorded when a stale policy sampled the row
    obj = Objective([TermSpec("replay", "policy", ("test_stored",), None, 1.0, "token-mean", {}, {"loss": PPO})])
    loss, _ = compute_objective(obj, logp=logp, mask=torch.ones(1, 2), advantages=torch.tensor([1.0]),
                                token_source=torch.tensor([[STORED, STORED]]), old_logp=old, behaviour_logp=beh)
    expected = [_ppo(-0.5, -0.6, 1.0), _ppo(-1.0, -1.02, 1.0)]
    assert loss.item() == pytest.approx((expected[0][0] + expected[1][0]) / 2, rel=1e-6)
    loss.backward()
    assert logp.grad[0, 0].item() == pytest.approx(expected[0][1] / 2, rel=1e-6)  # r = e^0.1 > 1.2? no: 1.105, unclipped
    assert logp.grad[0, 1].item() == pytest.approx(expected[1][1] / 2, rel=1e-6)


def test_nan_reference_and_old_logprobs_outside_a_terms_tokens_do_not_leak():
    """Appended expert rows carry NaN old/ref log-probs (nobody computed them): the KL and
    policy terms on rollout tokens stay finite and give the expert row no gradient from them."""
    logp = torch.tensor([[-0.3, -0.8], [-0.5, -0.7]], requires_grad=True)
    nan = float("nan")
    old = torch.tensor([[-0.3, -0.8], [nan, nan]])
    ref = torch.tensor([[-0.4, -0.6], [nan, nan]])
    src = torch.tensor([[ON, ON], [EXP, EXP]])
    obj = Objective([
        TermSpec("policy", "policy", ("on_policy",), None, 1.0, "token-mean", {}, {"loss": PPO}),
        TermSpec("kl", "kl", ("on_policy",), None, 0.1, "token-mean", {}, {"estimator": "k3"}),
    ])
    loss, metrics = compute_objective(obj, logp=logp, mask=torch.ones(2, 2), advantages=torch.tensor([1.0, 0.0]),
                                      token_source=src, old_logp=old, ref_logp=ref)
    loss.backward()
    assert torch.isfinite(loss) and math.isfinite(metrics["kl"])
    assert logp.grad[1].tolist() == [0.0, 0.0]
    k3 = [math.exp(r - lp) - (r - lp) - 1 for r, lp in ((-0.4, -0.3), (-0.6, -0.8))]
    assert metrics["loss/kl"] == pytest.approx(sum(k3) / 2, rel=1e-5)


def test_knobs_override_coefficients_and_policy_loss_parameters():
    logp = torch.tensor([[-0.1, -0.2]], requires_grad=True)
    old = torch.tensor([[-0.5, -0.2]])  # r = e^0.4 = 1.49 on token 0
    ent = torch.tensor([[1.0, 3.0]])
    obj = Objective(
        [TermSpec("policy", "policy", ("on_policy",), None, 1.0, "token-mean", {}, {"loss": PPO}),
         TermSpec("entropy_bonus", "entropy", ("on_policy",), None, "-entropy_coef", "token-mean", {}, {})],
        {"entropy_coef": 0.0},
    )
    kw = dict(logp=logp, mask=torch.ones(1, 2), advantages=torch.tensor([1.0]), old_logp=old, entropies=ent)
    base, m0 = compute_objective(obj, **kw)
    knobbed, m1 = compute_objective(obj, knobs={"entropy_coef": 0.25, "loss.clip_high": 1.0}, **kw)
    # clip_high 0.2: token 0 clipped at 1.2; clip_high 1.0: unclipped 1.4918
    assert base.item() == pytest.approx(-(1.2 + 1.0) / 2, rel=1e-6)
    assert knobbed.item() == pytest.approx(-(math.exp(0.4) + 1.0) / 2 - 0.25 * 2.0, rel=1e-6)
    assert m1["entropy_coef"] == 0.25 and m0["entropy_coef"] == 0.0


def test_weight_references():
    assert parse_weight_ref("mu") == ("+", "mu")
    assert parse_weight_ref("1 - mu") == ("1-", "mu")
    assert parse_weight_ref("-entropy_coef") == ("-", "entropy_coef")
    with pytest.raises(ValueError):
        parse_weight_ref("2*mu")
    obj = Objective([TermSpec("a", "nll", ("expert",), None, "1-mu")], {"mu": {"name": "linear", "start": 0.0, "end": 1.0, "steps": 10}})
    assert obj.weight(obj.terms[0], 4) == pytest.approx(0.6)
    with pytest.raises(KeyError):
        Objective([TermSpec("a", "nll", ("expert",), None, "beta")]).weight(TermSpec("a", "nll", ("expert",), None, "beta"), 0)


def test_seq_mean_aggregation_of_a_mixed_row_splits_linearly():
    """With a shared population, two terms on parts of one row add up to the aggregate of
    the whole row (aggregations are linear in the loss for a fixed mask)."""
    logp = torch.tensor([[-0.4, -1.1, -0.2, 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0]])
    src = torch.tensor([[EXP, EXP, ON, ON]])
    both = ("on_policy", "expert")
    split = Objective([
        TermSpec("a", "nll", ("on_policy",), both, 1.0, "seq-mean-token-mean", {}, {}),
        TermSpec("b", "nll", ("expert",), both, 1.0, "seq-mean-token-mean", {}, {}),
    ])
    whole = Objective([TermSpec("c", "nll", both, None, 1.0, "seq-mean-token-mean", {}, {})])
    a, _ = compute_objective(split, logp=logp, mask=mask, advantages=torch.zeros(1), token_source=src)
    b, _ = compute_objective(whole, logp=logp, mask=mask, advantages=torch.zeros(1), token_source=src)
    assert a.item() == pytest.approx(b.item(), rel=1e-7)
    assert a.item() == pytest.approx((0.4 + 1.1 + 0.2) / 3, rel=1e-6)


def test_teacher_kl_term_by_hand():
    """Reverse KL to a teacher carried per token, k1 = logp - teacher_logp (OPD / KDRL); tokens
    whose teacher log-prob is unknown (NaN) outside the term's selection do not leak."""
    logp = torch.tensor([[-0.5, -1.0, -2.0]], requires_grad=True)
    teacher = torch.tensor([[-0.2, -1.5, float("nan")]])
    src = torch.tensor([[ON, ON, EXP]])
    obj = Objective([TermSpec("distill", "teacher_kl", ("on_policy",), None, 0.5, "token-mean", {}, {"estimator": "k1"})])
    loss, _ = compute_objective(obj, logp=logp, mask=torch.ones(1, 3), advantages=torch.zeros(1),
                                token_source=src, teacher_logp=teacher)
    assert loss.item() == pytest.approx(0.5 * ((-0.5 + 0.2) + (-1.0 + 1.5)) / 2, rel=1e-6)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([0.25, 0.25, 0.0])  # d(0.5 * k1 / 2) = 0.25 per selected token
