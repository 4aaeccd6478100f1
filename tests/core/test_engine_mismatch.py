"""The engine-mismatch weight (mixrl.core.engine_mismatch): hand-computed values for every
mode, no gradient, metrics, and its place in the objective (only engine-corrected terms,
only policy-sampled tokens)."""

from __future__ import annotations

import math

import pytest
import torch

from mixrl.core import provenance as prov
from mixrl.core.engine_mismatch import EngineCorrection, engine_mismatch_weight, mismatch_metrics
from mixrl.core.objective import Objective, TermSpec, compute_objective

NAN = float("nan")
# two rows, three tokens; row 1's last token is padding, row 0's middle token has no engine log-prob
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -9.0]], dtype=torch.float64)
ENG = torch.tensor([[-1.5, NAN, -0.2], [-0.1, -2.0, 0.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
# d = old - eng on the mask, 0 where the engine gave none:  row 0: 0.5, 0, -0.3   row 1: -0.2, 0.8, (0)
D = [[0.5, 0.0, -0.3], [-0.2, 0.8, 0.0]]


def _exp(rows):
    return torch.tensor([[math.exp(x) for x in r] for r in rows], dtype=torch.float64)


def test_token_truncate_by_hand():
    w = engine_mismatch_weight(OLD, ENG, MASK, mode="token_truncate", c_min=0.8, c_max=2.0)
    want = _exp(D).clamp(0.8, 2.0)  # e^0.5 = 1.6487, e^-0.3 = 0.7408 -> 0.8, e^0.8 = 2.2255 -> 2.0
    assert w.shape == (2, 3)
    torch.testing.assert_close(w, want, atol=1e-6, rtol=0)
    assert w[0, 2].item() == pytest.approx(0.8) and w[1, 1].item() == pytest.approx(2.0)
    assert w[0, 1].item() == 1.0  # no engine log-prob: no correction


def test_token_mask_by_hand():
    w = engine_mismatch_weight(OLD, ENG, MASK, mode="token_mask", c_min=0.8, c_max=2.0)
    want = torch.tensor([[math.exp(0.5), 1.0, 0.0], [math.exp(-0.2), 0.0, 1.0]], dtype=torch.float64)
    torch.testing.assert_close(w, want, atol=1e-6, rtol=0)


def test_sequence_modes_by_hand():
    # row sums: 0.2 and 0.6 -> rho = 1.2214, 1.8221
    t = engine_mismatch_weight(OLD, ENG, MASK, mode="sequence_truncate", c_min=None, c_max=1.5)
    assert t.shape == (2, 1)
    torch.testing.assert_close(t, torch.tensor([[math.exp(0.2)], [1.5]], dtype=torch.float64), atol=1e-6, rtol=0)
    m = engine_mismatch_weight(OLD, ENG, MASK, mode="sequence_mask")  # TRL's defaults: C_max 3, no C_min
    torch.testing.assert_close(m, torch.tensor([[math.exp(0.2)], [math.exp(0.6)]], dtype=torch.float64), atol=1e-6, rtol=0)
    m = engine_mismatch_weight(OLD, ENG, MASK, mode="sequence_mask", c_min=1.3, c_max=3.0)
    torch.testing.assert_close(m, torch.tensor([[0.0], [math.exp(0.6)]], dtype=torch.float64), atol=1e-6, rtol=0)


def test_weight_carries_no_gradient():
    old = OLD.clone().requires_grad_(True)
    eng = ENG.clone().requires_grad_(True)
    for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
        w = engine_mismatch_weight(old, eng, MASK, mode=mode)
        assert not w.requires_grad and w.grad_fn is None


@pytest.mark.parametrize("mode,c_min,c_max,msg", [
    ("token", None, 3.0, "mode must be one of"),
    ("token_truncate", None, None, "needs at least one of"),
    ("sequence_mask", 2.0, 1.0, "must be less than"),
    ("token_mask", -1.0, 3.0, ">= 0"),
])
def test_bad_bounds_refused(mode, c_min, c_max, msg):
    with pytest.raises(ValueError, match=msg):
        EngineCorrection(mode, c_min, c_max)


def test_mask_modes_without_bounds_are_plain_importance_sampling():
    w = engine_mismatch_weight(OLD, ENG, MASK, mode="token_mask", c_min=None, c_max=None)
    torch.testing.assert_close(w, _exp(D), atol=1e-6, rtol=0)


def test_metrics_by_hand():
    m = mismatch_metrics(OLD, ENG, MASK, mode="token_truncate", c_min=0.8, c_max=2.0)
    # |d| on the 4 tokens with an engine log-prob: 0.5, 0.3, 0.2, 0.8
    assert m["engine/logp_diff/mean"] == pytest.approx(0.45, abs=1e-9)
    assert m["engine/logp_diff/max"] == pytest.approx(0.8, abs=1e-9)
    assert m["engine/ratio/min"] == pytest.approx(math.exp(-0.3), abs=1e-9)
    assert m["engine/ratio/max"] == pytest.approx(math.exp(0.8), abs=1e-9)
    assert m["engine/ratio/median"] == pytest.approx((math.exp(-0.2) + math.exp(0.5)) / 2, abs=1e-9)
    assert m["engine/truncated_frac"] == pytest.approx(0.5)  # e^-0.3 < 0.8, e^0.8 > 2
    s = mismatch_metrics(OLD, ENG, MASK, mode="sequence_mask", c_min=None, c_max=1.5)
    assert s["engine/masked_frac"] == pytest.approx(0.5)  # rows: e^0.2 kept, e^0.6 masked
    assert s["engine/ratio/max"] == pytest.approx(math.exp(0.6), abs=1e-9)
    assert mismatch_metrics(OLD, torch.full_like(ENG, NAN), MASK) == {}


def _objective(correction):
    return Objective([
        TermSpec("policy", "policy", ("on_policy",), params={"loss": {"name": "ppo_clip"}}),
        TermSpec("kl", "kl", ("on_policy",), weight=0.5),
    ], engine_correction=correction)


def test_objective_weights_the_policy_term_only_on_policy_tokens():
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(2, 3, generator=g, dtype=torch.float64) - 0.1).requires_grad_(True)
    adv = torch.tensor([1.0, -0.5], dtype=torch.float64)
    ref = logp.detach() - 0.1
    src = torch.tensor([[prov.ON_POLICY] * 3, [prov.ON_POLICY, prov.ON_POLICY, prov.EXPERT]])
    corr = EngineCorrection("token_truncate", 0.8, 2.0)
    kw = dict(logp=logp, mask=MASK, advantages=adv, token_source=src, old_logp=OLD, ref_logp=ref)
    with_w, m1 = compute_objective(_objective(corr), engine_logp=ENG, **kw)
    without, m0 = compute_objective(_objective(None), engine_logp=ENG, **kw)
    # by hand: ppo_clip's per-token loss -r A (r = exp(logp - old)) times w, token-mean over the 5 tokens
    w = _exp(D).clamp(0.8, 2.0)
    r = (logp.detach() - OLD).exp()
    clipped = torch.minimum(r * adv[:, None], r.clamp(0.8, 1.2) * adv[:, None])
    want_policy = float((-clipped * w)[MASK].sum() / 5)
    assert m1["loss/policy"] == pytest.approx(want_policy, abs=1e-9)
    assert m1["loss/kl"] == pytest.approx(m0["loss/kl"], abs=0)  # the KL term is not corrected (as in TRL)
    assert abs(m1["loss/policy"] - m0["loss/policy"]) > 1e-3
    # no engine log-probs (vLLM off): nothing changes
    same, _ = compute_objective(_objective(corr), **kw)
    assert float(same) == float(without)
    grad_w = torch.autograd.grad(with_w, logp)[0]
    grad_0 = torch.autograd.grad(compute_objective(_objective(None), engine_logp=ENG, **kw)[0], logp)[0]
    assert not torch.allclose(grad_w, grad_0)


def test_tokens_the_policy_did_not_sample_keep_weight_one():
    from mixrl.core.objective import _engine_weight

    src = torch.tensor([[prov.ON_POLICY] * 3, [prov.ON_POLICY, prov.EXPERT, prov.EXPERT]])
    valid = torch.ones(2, 3, dtype=torch.bool)
    old = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]], dtype=torch.float64)
    eng = torch.tensor([[-1.5, -1.5, -1.5], [-1.5, -9.0, -9.0]], dtype=torch.float64)  # expert tokens: huge "ratio"
    w = _engine_weight(EngineCorrection("token_truncate", None, 3.0), old, eng, valid, src)
    torch.testing.assert_close(w, torch.tensor([[math.exp(0.5)] * 3, [math.exp(0.5), 1.0, 1.0]], dtype=torch.float64))
    # sequence level: the expert tokens do not enter row 1's sum either
    w = _engine_weight(EngineCorrection("sequence_truncate", None, 100.0), old, eng, valid, src)
    torch.testing.assert_close(w, torch.tensor([[math.exp(1.5)] * 3, [math.exp(0.5), 1.0, 1.0]], dtype=torch.float64))
    assert _engine_weight(None, old, eng, valid, src) is None
    assert _engine_weight(EngineCorrection(), old, None, valid, src) is None
