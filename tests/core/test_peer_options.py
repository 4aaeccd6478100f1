"""The peers' loss options (issue 26): values and gradients (d loss / d log p) against hand
computations written from the formulas in plain Python (math, loops), not from mixrl's code.

* CISPO ``trust_mask``: Trinity-RFT's token mask with ``enable_mask_clip`` (MiniMax-M1's M_t);
* SAPO ``detach_gate``: Trinity-RFT's stopped gate;
* ``chord_phi_clamp``: CHORD-phi with Trinity-RFT's ``sft_phi`` cutoff (log p clamped);
* LUFFY's off-policy reshapes + max/min clip (``reshaped`` term) and on-policy reshapes
  (``reshaped_ppo`` loss);
* ``seq-mean-token-sum-norm`` without ``max_len`` in a config.
"""

from __future__ import annotations

import math

import pytest
import torch

from mixrl.config.builders import build_objective
from mixrl.config.compose import compose_config
from mixrl.config.objective import check_objective
from mixrl.core import AGGREGATIONS, POLICY_LOSSES
from mixrl.core.terms import TERMS, TermInputs
from mixrl.errors import ConfigError

# two rows of three tokens; the last token of row 2 is padding
OLD = [[-1.0, -2.0, -0.5], [-0.7, -1.2, -3.0]]
MASK = [[True, True, True], [True, True, False]]


def _loss(name, log_ratios, adv, **params):
    old = torch.tensor(OLD, dtype=torch.float64)
    logp = (old + torch.tensor(log_ratios, dtype=torch.float64)).requires_grad_(True)
    out = POLICY_LOSSES.get(name)(logp, old, torch.tensor(adv, dtype=torch.float64), torch.tensor(MASK), **params)
    out.per_token_loss.sum().backward()
    return out, logp.grad


def _rows(t):
    return [[float(v) for v in row] for row in t.detach().tolist()]


def _approx(got, expected):
    for g_row, e_row in zip(got, expected):
        assert g_row == pytest.approx(e_row, abs=1e-9), (got, expected)


# --------------------------------------------------------------------------- CISPO trust_mask
LR_CISPO = [[0.5, -1.0, 0.0], [0.5, -1.0, 0.0]]  # r = e^0.5 = 1.65 (> 1.28), e^-1 = 0.37 (< 0.8), 1


def _cispo_by_hand(adv, lo, hi, masked):
    values, grads = [], []
    for b in range(2):
        v_row, g_row = [], []
        for t in range(3):
            if not MASK[b][t]:
                v_row.append(0.0)
                g_row.append(0.0)
                continue
            r = math.exp(LR_CISPO[b][t])
            w = min(max(r, lo), hi)
            a = adv[b]
            m = 0.0 if masked and ((a > 0 and r > hi) or (a < 0 and r < lo)) else 1.0
            logp = OLD[b][t] + LR_CISPO[b][t]
            v_row.append(-m * w * a * logp)
            g_row.append(-m * w * a)  # d/dlogp of -m sg(w) A log p
        values.append(v_row)
        grads.append(g_row)
    return values, grads


@pytest.mark.parametrize("trust_mask", [False, True])
def test_cispo_trust_mask_drops_tokens_outside_the_band_in_the_advantage_direction(trust_mask):
    adv = [1.5, -2.0]
    out, grad = _loss("cispo", LR_CISPO, adv, clip_low=0.2, clip_high=0.28, trust_mask=trust_mask)
    values, grads = _cispo_by_hand(adv, 0.8, 1.28, trust_mask)
    _approx(_rows(out.per_token_loss), values)
    _approx(_rows(grad), grads)
    if trust_mask:  # row 1 (A > 0): r = 1.65 > 1.28 dropped; row 2 (A < 0): r = 0.37 < 0.8 dropped
        assert grads[0][0] == 0.0 and grads[1][1] == 0.0 and grads[0][1] != 0.0 and grads[1][0] != 0.0
        assert float(out.metrics["masked_frac"]) == pytest.approx(2 / 5)


def test_cispo_default_is_unchanged_no_mask():
    out_default, g_default = _loss("cispo", LR_CISPO, [1.5, -2.0])
    out_off, g_off = _loss("cispo", LR_CISPO, [1.5, -2.0], trust_mask=False)
    assert torch.equal(g_default, g_off) and bool((g_default[torch.tensor(MASK)] != 0).all())


# --------------------------------------------------------------------------- SAPO detach_gate
def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def test_sapo_detach_gate_is_trinity_form_and_default_is_the_paper_gradient():
    lr = [[0.3, -0.4, 0.0], [0.2, 0.9, 0.0]]
    adv = [2.0, -1.0]
    out_t, grad_t = _loss("sapo", lr, adv, detach_gate=True)
    out_p, grad_p = _loss("sapo", lr, adv)
    for b in range(2):
        for t in range(3):
            if not MASK[b][t]:
                assert grad_t[b, t] == 0.0 and grad_p[b, t] == 0.0
                continue
            a = adv[b]
            tau = 1.0 if a > 0 else 1.05
            r = math.exp(lr[b][t])
            s = _sigmoid(tau * (r - 1.0))
            logp = OLD[b][t] + lr[b][t]
            # Trinity-RFT: -A sg((4/tau) s) log p
            assert float(out_t.per_token_loss[b, t].detach()) == pytest.approx(-a * (4.0 / tau) * s * logp, abs=1e-12)
            assert float(grad_t[b, t]) == pytest.approx(-a * (4.0 / tau) * s, abs=1e-12)
            # paper: -(4/tau) s A, d/dlogp = -A 4 s (1 - s) r
            assert float(out_p.per_token_loss[b, t].detach()) == pytest.approx(-(4.0 / tau) * s * a, abs=1e-12)
            assert float(grad_p[b, t]) == pytest.approx(-a * 4.0 * s * (1.0 - s) * r, abs=1e-12)
    # at r = 1 Trinity's weight is 2 / tau, the paper's 1
    assert float(grad_t[0, 2]) == pytest.approx(-2.0 * 2.0) and float(grad_p[0, 2]) == pytest.approx(-2.0)


# --------------------------------------------------------------------------- CHORD-phi cutoff
def _nll(logps, token_weight):
    logp = torch.tensor([logps], dtype=torch.float64, requires_grad=True)
    x = TermInputs(logp=logp, mask=torch.ones_like(logp, dtype=torch.bool), advantages=torch.zeros(1, dtype=torch.float64),
                   behaviour_logp=logp.detach())
    out = TERMS.get("nll")(x, token_weight=token_weight)
    out.per_token.sum().backward()
    return out.per_token[0].tolist(), logp.grad[0].tolist()


def test_chord_phi_cutoff_zero_and_trinity_clamp_by_hand():
    probs = [0.9, 0.5, 0.2]
    logps = [math.log(p) for p in probs]
    c = 0.6
    v_zero, g_zero = _nll(logps, {"name": "chord_phi", "cutoff": c})
    v_clamp, g_clamp = _nll(logps, {"name": "chord_phi_clamp", "cutoff": c})
    for i, p in enumerate(probs):
        phi = p * (1.0 - p)
        if p > c:
            assert v_zero[i] == 0.0 and g_zero[i] == 0.0
            assert v_clamp[i] == pytest.approx(-phi * math.log(c))  # Trinity: -phi(p) min(log p, log c)
            assert g_clamp[i] == 0.0
        else:
            assert v_zero[i] == pytest.approx(-phi * math.log(p)) and v_clamp[i] == pytest.approx(-phi * math.log(p))
            assert g_zero[i] == pytest.approx(-phi) and g_clamp[i] == pytest.approx(-phi)


# --------------------------------------------------------------------------- LUFFY off-policy reshapes
def _reshaped(logps, adv, **params):
    logp = torch.tensor([logps], dtype=torch.float64, requires_grad=True)
    x = TermInputs(logp=logp, mask=torch.ones_like(logp, dtype=torch.bool), advantages=torch.tensor([adv], dtype=torch.float64),
                   behaviour_logp=torch.zeros_like(logp))
    out = TERMS.get("reshaped")(x, **params)
    out.per_token.sum().backward()
    return out.per_token[0].tolist(), logp.grad[0].tolist()


PROBS = [0.05, 0.3, 0.8]
# f(p) and d f / d log p (= p f'(p)) for each LUFFY off_policy_reshape, by hand
OFF_FORMS = {
    "no_reshape": ({}, lambda p: p, lambda p: p),
    "p_div_p": ({"gamma": 0.5}, lambda p: p / (p + 0.5), lambda p: 0.5 * p / (p + 0.5) ** 2),
    "logp": ({"logp_coef": 0.3}, lambda p: 0.3 * math.log(p), lambda p: 0.3),
    "p_logp": ({"logp_coef": 0.3}, lambda p: p + 0.3 * math.log(p), lambda p: p + 0.3),
    "square_root": ({}, lambda p: math.sqrt(p), lambda p: 0.5 * math.sqrt(p)),
    "pow": ({"pow_exp": 0.25}, lambda p: p ** 0.25, lambda p: 0.25 * p ** 0.25),
}


@pytest.mark.parametrize("reshape", sorted(OFF_FORMS))
def test_luffy_off_policy_reshapes_by_hand(reshape):
    params, f, df = OFF_FORMS[reshape]
    adv = -1.5
    values, grads = _reshaped([math.log(p) for p in PROBS], adv, reshape=reshape, **params)
    assert values == pytest.approx([-adv * f(p) for p in PROBS])
    assert grads == pytest.approx([-adv * df(p) for p in PROBS])


def test_luffy_off_policy_max_and_min_clip_by_hand():
    """f = p clamped to [0.1, 0.5]: p = 0.05 -> 0.1 and p = 0.8 -> 0.5 (constant: zero gradient)."""
    adv = 2.0
    values, grads = _reshaped([math.log(p) for p in PROBS], adv, reshape="no_reshape", max_clip=0.5, min_clip=0.1)
    assert values == pytest.approx([-2.0 * 0.1, -2.0 * 0.3, -2.0 * 0.5])
    assert grads == pytest.approx([0.0, -2.0 * 0.3, 0.0])


def test_reshaped_defaults_equal_the_shaped_term():
    logps = [math.log(p) for p in PROBS]
    v1, g1 = _reshaped(logps, 1.0)
    logp = torch.tensor([logps], dtype=torch.float64, requires_grad=True)
    x = TermInputs(logp=logp, mask=torch.ones_like(logp, dtype=torch.bool), advantages=torch.tensor([1.0], dtype=torch.float64),
                   behaviour_logp=torch.zeros_like(logp))
    out = TERMS.get("shaped")(x)
    out.per_token.sum().backward()
    assert v1 == pytest.approx(out.per_token[0].tolist()) and g1 == pytest.approx(logp.grad[0].tolist())


# --------------------------------------------------------------------------- LUFFY on-policy reshapes
LR_ON = [[0.3, -0.4, 0.02], [-0.5, 0.05, 0.0]]  # no_reshape: r = 1.35 (A > 0) and 0.61 (A < 0) are clipped


def _g(reshape, lr, p, p_old):
    """The reshaped ratio g and d g / d log p, by hand (r = p / p_old, log r = lr)."""
    r = math.exp(lr)
    if reshape == "no_reshape":
        return r, r
    if reshape == "p_div_p":  # gamma 0.1
        f_old = p_old / (p_old + 0.1)
        return (p / (p + 0.1)) / f_old, (0.1 * p / (p + 0.1) ** 2) / f_old
    if reshape == "logp":
        return lr, 1.0
    if reshape == "p_logp":  # logp_coef 0.1
        return r + 0.1 * lr, r + 0.1
    if reshape == "square_root":
        return math.sqrt(r), 0.5 * math.sqrt(r)
    return r ** 0.5, 0.5 * r ** 0.5  # pow, pow_exp 0.5


@pytest.mark.parametrize("reshape", ["no_reshape", "p_div_p", "logp", "p_logp", "square_root", "pow"])
def test_reshaped_ppo_luffy_on_policy_reshapes_by_hand(reshape):
    adv = [1.0, -1.0]
    out, grad = _loss("reshaped_ppo", LR_ON, adv, reshape=reshape)
    n_clipped = 0
    for b in range(2):
        for t in range(3):
            if not MASK[b][t]:
                assert grad[b, t] == 0.0 and out.per_token_loss[b, t] == 0.0
                continue
            lr = LR_ON[b][t]
            p_old = math.exp(OLD[b][t])
            g, dg = _g(reshape, lr, p_old * math.exp(lr), p_old)
            a = adv[b]
            unclipped, clipped = -a * g, -a * min(max(g, 0.8), 1.2)
            assert float(out.per_token_loss[b, t].detach()) == pytest.approx(max(unclipped, clipped), abs=1e-12)
            expected_grad = 0.0 if clipped > unclipped else -a * dg
            assert float(grad[b, t]) == pytest.approx(expected_grad, abs=1e-12)
            n_clipped += clipped > unclipped
    if reshape == "no_reshape":
        assert n_clipped == 2


def test_reshaped_ppo_no_reshape_is_ppo_clip():
    adv = [1.0, -1.0]
    out_r, g_r = _loss("reshaped_ppo", LR_ON, adv)
    out_p, g_p = _loss("ppo_clip", LR_ON, adv)
    assert torch.equal(out_r.per_token_loss, out_p.per_token_loss) and torch.equal(g_r, g_p)


# --------------------------------------------------------------------------- config
def test_sum_norm_without_max_len_divides_by_max_completion_length_by_hand():
    cfg = compose_config(["algo.aggregation.name=seq-mean-token-sum-norm", "trainer.max_completion_length=16"])
    (policy,) = [t for t in build_objective(cfg).terms if t.kind == "policy"]
    assert policy.aggregation == "seq-mean-token-sum-norm" and policy.aggregation_params["max_len"] == 16
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 100.0]])
    value = AGGREGATIONS.get(policy.aggregation)(loss, torch.tensor(MASK), **policy.aggregation_params)
    assert float(value) == pytest.approx(((1 + 2 + 3) / 16 + (4 + 5) / 16) / 2)  # rows' token sums / 16, mean over rows


@pytest.mark.parametrize("overrides, match", [
    (["algo.loss.name=reshaped_ppo", "algo.loss.reshape=p_div_p_0.1"], "reshape must be one of"),
    (["algo=luffy", "algo.terms.offpolicy.name=reshaped", "+algo.terms.offpolicy.reshape=sqrt"], "reshape must be one of"),
    (["algo=chord", "algo.terms.sft.token_weight.name=chord_phi_clamp", "algo.terms.sft.token_weight.cutoff=0"], "cutoff"),
])
def test_bad_peer_option_is_one_config_error(overrides, match):
    with pytest.raises(ConfigError, match=match):
        check_objective(compose_config(overrides))
