"""Distillation terms on teacher-scored tokens: values and gradients by hand, and TRL's
generalised JSD (full distributions) as the oracle of the sampled-token estimates."""

from __future__ import annotations

import math

import pytest
import torch

from mixrl.core import provenance as prov
from mixrl.core.distill import jsd_per_token
from mixrl.core.objective import Objective, TermSpec, compute_objective
from mixrl.core.terms import TERMS, TermInputs

ON = prov.ON_POLICY


def _x(logp, teacher, behaviour=None, mask=None):
    return TermInputs(logp=logp, mask=torch.ones_like(logp, dtype=torch.bool) if mask is None else mask,
                      advantages=torch.zeros(logp.shape[0]), behaviour_logp=logp.detach() if behaviour is None else behaviour,
                      teacher_logp=teacher)


# --------------------------------------------------------------------------- teacher_kl (k2 = OPD / KDRL)
def test_teacher_kl_k2_is_the_reverse_kl_gradient_by_hand():
    """k2: l = (log p - log q)^2 / 2, gradient (log p - log q) per token."""
    logp = torch.tensor([[-0.5, -2.0]], requires_grad=True)
    q = torch.tensor([[-1.5, -1.0]])
    out = TERMS.get("teacher_kl")(_x(logp, q))  # default estimator: k2
    assert out.per_token[0].tolist() == pytest.approx([0.5, 0.5])
    out.per_token.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([1.0, -1.0])


def test_kdrl_objective_by_hand_with_the_annealed_beta():
    """KDRL = GRPO policy term + beta_t * teacher_kl(k2), beta linear 0.5 -> 0.1 over 4 steps; at step 2
    beta = 0.3. One row of 2 tokens, A = 1, r = 1 (token-mean): L = -1 + 0.3 * mean(k2)."""
    logp = torch.tensor([[-0.5, -2.0]], requires_grad=True)
    q = torch.tensor([[-1.5, -1.0]])
    obj = Objective(
        [TermSpec("policy", "policy", ("on_policy",), None, 1.0, "token-mean", {}, {"loss": {"name": "ppo_clip"}}),
         TermSpec("distill", "teacher_kl", ("on_policy",), None, "beta", "token-mean", {}, {"estimator": "k2"})],
        coefs={"beta": {"name": "linear", "start": 0.5, "end": 0.1, "steps": 4}},
    )
    loss, metrics = compute_objective(obj, logp=logp, mask=torch.ones(1, 2), advantages=torch.tensor([1.0]),
                                      token_source=torch.full((1, 2), ON), teacher_logp=q, step=2)
    assert metrics["beta"] == pytest.approx(0.3)
    assert loss.item() == pytest.approx(-1.0 + 0.3 * 0.5, rel=1e-6)
    loss.backward()
    # policy: d(-A r)/dlogp = -1 / 2 tokens; distill: 0.3 * (logp - q) / 2
    assert logp.grad[0].tolist() == pytest.approx([-0.5 + 0.3 * 1.0 / 2, -0.5 + 0.3 * -1.0 / 2])


# --------------------------------------------------------------------------- opd_reward (OPD / ExOPD)
def test_opd_reward_advantage_is_lambda_times_the_teacher_log_ratio():
    """A_t = lam (log q - log pi_old); reinforce: l = -A log p, gradient -A."""
    logp = torch.tensor([[-0.5, -2.0]], requires_grad=True)
    q = torch.tensor([[-1.5, -1.0]])
    out = TERMS.get("opd_reward")(_x(logp, q), lam=1.5)
    adv = [1.5 * (-1.5 + 0.5), 1.5 * (-1.0 + 2.0)]  # [-1.5, 1.5]
    assert out.per_token[0].tolist() == pytest.approx([-adv[0] * -0.5, -adv[1] * -2.0])
    out.per_token.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([1.5, -1.5])
    assert out.metrics["opd/advantage"] == pytest.approx(0.0)


def test_opd_reward_at_lambda_1_has_the_gradient_of_the_k2_reverse_kl():
    """G-OPD: OPD is KL-constrained RL with equal weights; on-policy (pi_old = pi_theta) the
    dense-reward policy gradient equals the k2 reverse-KL loss gradient."""
    torch.manual_seed(0)
    base = torch.randn(3, 5)
    q = torch.randn(3, 5)
    a = base.clone().requires_grad_(True)
    TERMS.get("opd_reward")(_x(a, q), lam=1.0).per_token.sum().backward()
    b = base.clone().requires_grad_(True)
    TERMS.get("teacher_kl")(_x(b, q), estimator="k2").per_token.sum().backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-6)


def test_opd_reward_uses_the_ratio_to_the_behaviour_with_ppo_clip():
    """With ppo_clip and r = exp(logp - old) = e^0.5 > 1.2 on a positive advantage: clipped, no gradient."""
    logp = torch.tensor([[0.0]], requires_grad=True)
    old = torch.tensor([[-0.5]])
    q = torch.tensor([[0.5]])  # A = 1 * (0.5 - (-0.5)) = 1
    out = TERMS.get("opd_reward")(_x(logp, q, behaviour=old), loss={"name": "ppo_clip"})
    assert out.per_token.item() == pytest.approx(-1.2)
    out.per_token.sum().backward()
    assert logp.grad.item() == 0.0


# --------------------------------------------------------------------------- teacher_jsd
def test_forward_kl_estimate_by_hand():
    """beta = 0: value w (log q - log p), gradient -w, w = q / p."""
    logp = torch.tensor([[math.log(0.2)]], requires_grad=True)
    q = torch.tensor([[math.log(0.6)]])
    out = TERMS.get("teacher_jsd")(_x(logp, q), beta=0.0)
    assert out.per_token.item() == pytest.approx(3.0 * math.log(3.0))
    out.per_token.sum().backward()
    assert logp.grad.item() == pytest.approx(-3.0)
    capped = jsd_per_token(torch.tensor([[math.log(0.2)]]), q, 0.0, ratio_cap=2.0)
    assert capped.item() == pytest.approx(2.0 * math.log(3.0))


def test_jsd_estimate_by_hand():
    """beta = 0.5, p = 0.2, q = 0.6: m = 0.4; value 0.5*3*log(1.5) + 0.5*log(0.5), gradient 0.5*log(0.5)."""
    logp = torch.tensor([[math.log(0.2)]], requires_grad=True)
    q = torch.tensor([[math.log(0.6)]])
    out = TERMS.get("teacher_jsd")(_x(logp, q), beta=0.5)
    assert out.per_token.item() == pytest.approx(0.5 * 3 * math.log(1.5) + 0.5 * math.log(0.5), rel=1e-6)
    out.per_token.sum().backward()
    assert logp.grad.item() == pytest.approx(0.5 * math.log(0.5), rel=1e-6)


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_jsd_estimate_matches_trls_generalized_jsd_in_expectation(beta):
    """Over a vocabulary of 6 tokens, the expectation under y ~ student of the sampled-token
    value and gradient equals TRL's generalized_jsd_loss on the full distributions (the value
    and its autograd gradient w.r.t. the student's logits)."""
    from trl.experimental.gkd.gkd_trainer import GKDTrainer

    torch.manual_seed(1)
    V = 6
    student_logits = torch.randn(1, 1, V, requires_grad=True)
    teacher_logits = torch.randn(1, 1, V)
    oracle = GKDTrainer.generalized_jsd_loss(student_logits, teacher_logits, beta=beta, reduction="sum")
    oracle_grad, = torch.autograd.grad(oracle, student_logits)

    logits = student_logits.detach().clone().requires_grad_(True)
    logp_all = torch.log_softmax(logits[0, 0], -1)  # [V]
    q_all = torch.log_softmax(teacher_logits[0, 0], -1)
    per_token = jsd_per_token(logp_all.unsqueeze(0), q_all.unsqueeze(0), beta)[0]  # one "sample" per vocabulary entry
    weights = logp_all.detach().exp()  # E_{y ~ p}[.] = sum_y p(y) (.)
    expected = (weights * per_token).sum()
    expected.backward()
    assert expected.item() == pytest.approx(oracle.item(), rel=1e-5, abs=1e-7)
    assert torch.allclose(logits.grad, oracle_grad, atol=1e-6)


def test_jsd_term_in_the_objective_ignores_unselected_nan():
    logp = torch.tensor([[-0.5, -1.0]], requires_grad=True)
    teacher = torch.tensor([[-0.2, float("nan")]])
    obj = Objective([TermSpec("d", "teacher_jsd", ("on_policy",), None, 1.0, "token-mean", {}, {"beta": 1.0})])
    loss, _ = compute_objective(obj, logp=logp, mask=torch.tensor([[1, 0]]), advantages=torch.zeros(1),
                                token_source=torch.full((1, 2), ON), teacher_logp=teacher)
    loss.backward()
    assert loss.item() == pytest.approx(-0.3) and logp.grad[0].tolist() == pytest.approx([-0.3, 0.0])


def test_jsd_beta_out_of_range_is_refused():
    with pytest.raises(ValueError, match="beta"):
        TERMS.get("teacher_jsd")(_x(torch.zeros(1, 1), torch.zeros(1, 1)), beta=1.5)


def test_opd_reward_docstring_states_what_the_default_loss_computes():
    """ExOPD's words and code agree: the default loss is reinforce, l_t = -A_t log p_t (no ratio),
    not -A r. With a behaviour log-prob that differs from logp the two differ, so the value tells:
    logp = -0.5, pi_old = -0.7, q = -1.5, lam = 1.25: A = 1.25 (-1.5 + 0.7) = -1.0;
    -A log p = -0.5 (while -A r would be exp(0.2) = 1.22)."""
    doc = TERMS.get("opd_reward").__doc__
    assert "l_t = -A_t log p_t" in doc and "-A r," not in doc and "(-A r" not in doc
    logp = torch.tensor([[-0.5]], requires_grad=True)
    out = TERMS.get("opd_reward")(_x(logp, torch.tensor([[-1.5]]), behaviour=torch.tensor([[-0.7]])), lam=1.25)
    assert out.metrics["opd/advantage"] == pytest.approx(-1.0)
    assert out.per_token.item() == pytest.approx(-0.5)
    out.per_token.sum().backward()
    assert logp.grad.item() == pytest.approx(1.0)  # -A


# --------------------------------------------------------------------------- gopd_reward (G-OPD / ExOPD, fixed reference)
def _xr(logp, teacher, ref, behaviour):
    return TermInputs(logp=logp, mask=torch.ones_like(logp, dtype=torch.bool), advantages=torch.zeros(logp.shape[0]),
                      behaviour_logp=behaviour, teacher_logp=teacher, ref_logp=ref)


def test_gopd_reward_advantage_and_gradient_by_hand_from_the_papers_reward():
    """G-OPD's per-token reward lam (log pi_T - log pi_ref) - (log pi_old - log pi_ref), by hand:
    token 1: lam 1.25, q -1.0, ref -2.0, old -1.5 -> 1.25 * 1.0 - 0.5 = 0.75; token 2: q -3.0,
    ref -1.0, old -0.5 -> 1.25 * -2.0 - 0.5 = -3.0. reinforce: l_t = -A_t log p_t, gradient -A_t."""
    logp = torch.tensor([[-1.4, -0.6]], requires_grad=True)
    q, ref, old = torch.tensor([[-1.0, -3.0]]), torch.tensor([[-2.0, -1.0]]), torch.tensor([[-1.5, -0.5]])
    out = TERMS.get("gopd_reward")(_xr(logp, q, ref, old), lam=1.25)
    assert out.per_token[0].tolist() == pytest.approx([0.75 * 1.4, -3.0 * 0.6])
    out.per_token.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([-0.75, 3.0])
    assert out.metrics["opd/advantage"] == pytest.approx((0.75 - 3.0) / 2)


def test_gopd_reward_at_lambda_1_is_opd_and_above_1_is_not_a_rescaled_opd():
    """lam = 1: the reference cancels (opd_reward's advantage q - old). lam = 1.25: the advantage
    is not 1.25 (q - old) unless ref = old, i.e. lam extrapolates against the fixed reference
    instead of scaling the step (what opd_reward's pi_old reference does)."""
    logp = torch.tensor([[-1.4, -0.6, -2.0]])
    q, ref, old = torch.tensor([[-1.0, -3.0, -0.2]]), torch.tensor([[-2.0, -1.0, -0.7]]), torch.tensor([[-1.5, -0.5, -2.5]])

    def adv(term, lam, r=ref):
        x = _xr(logp.clone().requires_grad_(True), q, r, old)
        out = TERMS.get(term)(x, lam=lam)
        out.per_token.sum().backward()
        return (-x.logp.grad)[0]  # reinforce: gradient -A_t per token

    assert torch.allclose(adv("gopd_reward", 1.0), q[0] - old[0])
    assert torch.allclose(adv("gopd_reward", 1.0), adv("opd_reward", 1.0))
    assert torch.allclose(adv("gopd_reward", 1.25, r=old), adv("opd_reward", 1.25))  # ref = old: the scaled form
    want = 1.25 * (q[0] - ref[0]) - (old[0] - ref[0])  # [1.25 - 0.5, -2.5 - 0.5, 0.625 + 1.8] = [0.75, -3.0, 2.425]
    assert torch.allclose(adv("gopd_reward", 1.25), want)
    assert not torch.allclose(want, 1.25 * (q[0] - old[0]))
    # extrapolation: where the teacher is above the reference, lam > 1 pushes beyond OPD's target
    assert float(want[0]) > float((q[0] - old[0])[0])


def test_exopd_composes_with_the_fixed_reference_and_computes_reference_logps():
    from mixrl.config.builders import build_objective
    from mixrl.config.compose import compose_config
    from mixrl.trainer.trl_args import _needs_ref_logp

    cfg = compose_config(["algo=exopd"])
    terms = {t.label: t for t in build_objective(cfg).terms}
    assert terms["distill"].kind == "gopd_reward" and terms["distill"].params["lam"] == 1.25
    assert _needs_ref_logp(cfg)  # TRL's beta != 0: reference log-probs of the frozen starting model
