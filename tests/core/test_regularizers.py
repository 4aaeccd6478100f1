"""KL estimators (direction, values, gradients) and the entropy bonus, by hand."""

import math

import pytest
import torch

from mixrl.core import KL_ESTIMATORS, entropy_bonus, kl_penalty, teacher_kl

LOGP = [-0.5, -2.0, -1.0]
REF = [-1.0, -1.5, -1.0]


def est(name, logp=LOGP, ref=REF):
    lp = torch.tensor([logp], dtype=torch.float64, requires_grad=True)
    out = kl_penalty(lp, torch.tensor([ref], dtype=torch.float64), estimator=name)
    out.sum().backward()
    return out[0].tolist(), lp.grad[0].tolist()


def test_k1_k2_k3_values_and_gradients():
    xs = [r - l for l, r in zip(LOGP, REF)]  # x = ref_logp - logp
    v, g = est("k1")
    assert v == pytest.approx([-x for x in xs]) and g == pytest.approx([1.0] * 3)
    v, g = est("k2")
    assert v == pytest.approx([0.5 * x * x for x in xs]) and g == pytest.approx([-x for x in xs])
    v, g = est("k3")
    assert v == pytest.approx([math.exp(x) - 1 - x for x in xs])
    assert g == pytest.approx([1 - math.exp(x) for x in xs])  # d/dlogp of e^x - 1 - x, dx = -dlogp
    assert all(val >= 0 for val in v)


def test_direction_expectation_under_policy_is_kl_policy_to_ref():
    """E_{y ~ pi_theta}[k] = KL(pi_theta || pi_ref) exactly for k1 and k3 (categorical)."""
    pi = [0.9, 0.08, 0.02]
    ref = [0.3, 0.3, 0.4]
    kl = sum(p * math.log(p / q) for p, q in zip(pi, ref))
    reverse = sum(q * math.log(q / p) for p, q in zip(pi, ref))
    assert abs(kl - reverse) > 0.05  # the two directions differ for this pair
    logp = [math.log(p) for p in pi]
    logr = [math.log(q) for q in ref]
    for name in ("k1", "k3"):
        v, _ = est(name, logp, logr)
        assert sum(p * k for p, k in zip(pi, v)) == pytest.approx(kl), name


def test_k3_clamped():
    # verl's low_var_kl: x = ref - logp clamped to [-20, 20], then k3 clamped to [-10, 10]
    v, _ = est("k3_clamped", [0.0] * 6, [30.0, -30.0, -15.0, -9.0, 2.0, -1.0])
    assert v == pytest.approx([
        10.0,  # x = 20: e^20 - 21 > 10 -> 10
        10.0,  # x = -20: e^-20 + 19 > 10 -> 10 (was e^-10 + 9 with the old +-10 clamp)
        10.0,  # x = -15 unclamped: e^-15 + 14 > 10 -> 10
        math.exp(-9) - 1 + 9,  # x = -9: 8.0001..., below the result clamp
        math.exp(2) - 1 - 2,  # x = 2: 4.389..., unchanged
        math.exp(-1) - 1 + 1,  # x = -1 unchanged
    ])
    v3, _ = est("k3")
    vc, _ = est("k3_clamped")
    assert v3 == pytest.approx(vc)


def test_teacher_kl_is_reverse_kl_k1_by_default():
    lp = torch.tensor([[-0.5, -2.0]])
    t = torch.tensor([[-1.0, -0.1]])
    assert teacher_kl(lp, t)[0].tolist() == pytest.approx([0.5, -1.9])
    assert torch.allclose(teacher_kl(lp, t, estimator="k3"), KL_ESTIMATORS.get("k3")(lp, t))


def test_reference_gets_no_gradient():
    ref = torch.tensor([REF], requires_grad=True)
    logp = torch.tensor([LOGP], requires_grad=True)
    for name in KL_ESTIMATORS.names():
        kl_penalty(logp, ref, estimator=name).sum().backward()
    assert ref.grad is None and logp.grad is not None


def test_unknown_estimator():
    with pytest.raises(KeyError) as e:
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), estimator="k4")
    assert str(e.value).startswith("unknown KL estimator 'k4'")


def test_entropy_bonus_is_negative_coef_times_token_mean():
    ent = torch.tensor([[1.0, 2.0, 9.0], [3.0, 99.0, 99.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = entropy_bonus(ent, mask, coef=0.01)
    assert out.item() == pytest.approx(-0.01 * (1 + 2 + 3) / 3)
    out.backward()
    assert ent.grad.flatten().tolist() == pytest.approx([-0.01 / 3] * 2 + [0.0, -0.01 / 3, 0.0, 0.0])
    assert entropy_bonus(ent, mask, coef=0.01, num_items=6).item() == pytest.approx(-0.01)
    empty = entropy_bonus(ent, torch.zeros(2, 3), coef=0.01)
    assert empty.item() == 0.0 and not math.isnan(empty.item())
