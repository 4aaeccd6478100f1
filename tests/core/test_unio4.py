"""Uni-O4's offline term vs hand computations: PPO's clipped objective on the selected tokens with
the reference log-prob (the BC policy) as the denominator, never the behaviour log-prob; the
presets compose into bc -> offline -> online stages; bad settings are one-line ConfigErrors."""

import math

import pytest
import torch

from mixrl.config.compose import compose_config, compose_stages
from mixrl.core import TERMS
from mixrl.core.terms import TermInputs
from mixrl.errors import ConfigError

REF = [[-1.0, -2.0, -0.5], [-0.7, -1.2, -0.9]]
LR = [[0.1, 0.4, -0.3], [0.5, -0.3, 0.0]]  # log r = log pi_theta - log pi_b
MASK = [[True, True, True], [True, True, False]]
ADV = [0.5, -1.5]


def run(lr=LR, adv=ADV, **params):
    ref = torch.tensor(REF, dtype=torch.float64)
    logp = (ref + torch.tensor(lr, dtype=torch.float64)).detach().requires_grad_(True)
    x = TermInputs(logp=logp, mask=torch.tensor(MASK), advantages=torch.tensor(adv, dtype=torch.float64),
                   behaviour_logp=torch.full_like(ref, -5.0), ref_logp=ref)  # a behaviour far away: must not be read
    out = TERMS.get("unio4_offline")(x, **params)
    out.per_token.sum().backward()
    return out, logp.grad


def expected(lr, adv, lo, hi):
    """l = max(-A r, -A clip(r, 1 - lo, 1 + hi)); d l / d logp = -A r where the unclipped branch is active, else 0."""
    loss, grad = [], []
    for row, a, m in zip(lr, adv, MASK):
        lrow, grow = [], []
        for v, keep in zip(row, m):
            r = math.exp(v)
            l1, l2 = -a * r, -a * min(max(r, 1 - lo), 1 + hi)
            lrow.append(max(l1, l2) if keep else 0.0)
            grow.append(-a * r if keep and l1 >= l2 else 0.0)
        loss.append(lrow)
        grad.append(grow)
    return loss, grad


@pytest.mark.parametrize("params, lo, hi", [({}, 0.2, 0.2), ({"loss": {"name": "ppo_clip", "clip_low": 0.1, "clip_high": 0.45}}, 0.1, 0.45)])
def test_clipped_objective_against_the_bc_policy(params, lo, hi):
    out, grad = run(**params)
    exp_loss, exp_grad = expected(LR, ADV, lo, hi)
    for got, exp in ((out.per_token.detach().tolist(), exp_loss), (grad.tolist(), exp_grad)):
        for a, b in zip(got, exp):
            assert a == pytest.approx(b, abs=1e-12), (got, exp)
    # by hand for the default clip: row 0 (A = 0.5) token 1 has r = e^0.4 > 1.2, clipped (no gradient);
    # row 1 (A = -1.5) token 0 has r = e^0.5 > 1.2 and A < 0: unclipped, l = 1.5 e^0.5
    if not params:
        assert exp_grad[0][1] == 0.0 and exp_loss[0][1] == pytest.approx(-0.5 * 1.2)
        assert exp_loss[1][0] == pytest.approx(1.5 * math.exp(0.5)) and exp_grad[1][0] == pytest.approx(1.5 * math.exp(0.5))
    clipped = sum(1 for row_l, row_g, m in zip(exp_loss, exp_grad, MASK) for g, k in zip(row_g, m) if k and g == 0.0)
    assert out.metrics["unio4/clip_frac"] == pytest.approx(clipped / 5)


def test_at_the_bc_policy_the_ratio_is_one_and_the_gradient_is_minus_a():
    out, grad = run(lr=[[0.0] * 3] * 2)
    assert grad.tolist() == [[-0.5, -0.5, -0.5], [1.5, 1.5, 0.0]]
    assert out.metrics["unio4/ratio/mean"] == pytest.approx(1.0)


def test_the_term_needs_reference_log_probs_not_a_behaviour():
    fn = TERMS.get("unio4_offline")
    assert fn.needs == ("ref_logp",)
    assert not getattr(fn, "needs_behaviour", False)  # it trains on expert tokens, whose behaviour is unknown


def test_preset_stages_bc_offline_online():
    cfg = compose_config(["algo=unio4"])
    stages = compose_stages(cfg, ["algo=unio4"])
    assert [(n, c.algo.name) for n, c in stages] == [("bc", "sft"), ("offline", "unio4_offline"), ("online", "ppo")]
    offline = stages[1][1].algo
    assert offline.terms.offline.name == "unio4_offline" and list(offline.terms.offline.tokens) == ["expert"]
    assert offline.terms.offline.loss.name == stages[2][1].algo.loss.name == "ppo_clip"  # the same objective in both phases
    assert offline.advantage.name == "dr_grpo" and offline.advantage_include_offpolicy is False


@pytest.mark.parametrize("overrides, start", [
    (["algo=unio4_offline", "algo.terms.offline.loss.clip_low=2"], "algo.terms.offline.loss.clip_low=2 is out of range"),
    (["algo=unio4_offline", "algo.terms.offline.loss.name=nope"], "unknown policy loss 'nope' for algo.terms.offline.loss.name"),
    (["algo=unio4_offline", "algo.terms.offline.tokens=[on_policy]"], "algo.inject=group_replace adds 'expert' tokens but no term trains on them"),
])
def test_bad_setting_is_one_line(overrides, start):
    with pytest.raises(ConfigError) as e:
        compose_config(overrides)
    assert str(e.value).startswith(start), str(e.value)
    assert "\n" not in str(e.value).strip()


def test_a_micro_batch_without_offline_tokens_reports_no_metrics():
    ref = torch.tensor(REF, dtype=torch.float64)
    x = TermInputs(logp=ref.clone(), mask=torch.zeros(2, 3, dtype=torch.bool), advantages=torch.tensor(ADV, dtype=torch.float64),
                   behaviour_logp=ref, ref_logp=ref)
    out = TERMS.get("unio4_offline")(x)
    assert out.metrics == {} and out.per_token.abs().sum() == 0
