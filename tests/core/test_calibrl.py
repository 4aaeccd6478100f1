"""CalibRL (mixrl.core.calibrl): the expert baseline each row is given, the guided term's values and
gradients by hand from the authors' code (zhh6425/CalibRL @ 0efd799160ec69a3c212e75ba4eb6334c721b8ec,
src/core_algos.py lines 104-126 and 262-271), the stage writing the baseline into a hand-built
mixed batch, and the config's one-line refusals."""

from __future__ import annotations

import math

import pytest
import torch

from mixrl.core import provenance as prov
from mixrl.core.advantage_shaping import SHAPINGS
from mixrl.core.calibrl import expert_baseline
from mixrl.core.objective import Objective, TermSpec, compute_objective
from mixrl.core.terms import TERMS, TermInputs
from mixrl.trainer.parts.advantage_shaping import AdvantageShaping

L = math.log


def test_the_baseline_is_the_groups_expert_row_position_by_position():
    # group 0: rows 0, 1 (expert, 2 tokens of 3); group 1: rows 2, 3 with no expert row
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.1, -0.2, -9.0], [-4.0, -5.0, -6.0], [-7.0, -8.0, -9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]])
    base, has = expert_baseline(logp, mask, torch.tensor([0, 0, 1, 1]), torch.tensor([False, True, False, False]))
    assert base[0].tolist() == pytest.approx([-0.1, -0.2, -9.0]) and has[0].tolist() == [True, True, False]
    assert base[1].tolist() == pytest.approx([-0.1, -0.2, -9.0])  # the expert row itself (never trained by the term)
    assert has[2:].sum() == 0  # no expert in the group: no baseline


def _term(logp, adv, base, passed, mask=None, slope=0.5):
    b = logp.shape[0]
    x = TermInputs(logp=logp, mask=torch.ones_like(logp, dtype=torch.bool) if mask is None else mask,
                   advantages=adv, behaviour_logp=logp.detach(),
                   rows={"calib_logp": base, "calib_has": torch.ones_like(base, dtype=torch.bool), "calib_pass": passed})
    assert b == passed.shape[0]
    return TERMS.get("calibrl")(x, negative_slope=slope)


def test_the_guided_term_is_abs_a_leaky_relu_of_the_signed_gap():
    # row 0 passes (s = -1: input b - logp), row 1 fails (s = +1: input logp - b)
    logp = torch.tensor([[L(0.2), L(0.8)], [L(0.6), L(0.1)]], requires_grad=True)
    base = torch.tensor([[L(0.4), L(0.4)], [L(0.3), L(0.3)]])
    adv = torch.tensor([1.5, -0.5])
    out = _term(logp, adv, base, torch.tensor([True, False]))
    expected = [[1.5 * (L(0.4) - L(0.2)), 1.5 * 0.5 * (L(0.4) - L(0.8))],   # ln 2 > 0: slope 1; -ln 2 < 0: slope 0.5
                [0.5 * (L(0.6) - L(0.3)), 0.5 * 0.5 * (L(0.1) - L(0.3))]]
    assert out.per_token.flatten().tolist() == pytest.approx(sum(expected, []))
    out.per_token.sum().backward()
    # d/d logp: passing row -|A| x (1 or 0.5): pulled up; failing row +|A| x (1 or 0.5): pushed down
    assert logp.grad.flatten().tolist() == pytest.approx([-1.5, -0.75, 0.5, 0.25])


def test_tokens_without_an_expert_token_get_no_loss_and_no_gradient():
    logp = torch.tensor([[L(0.2), L(0.5)]], requires_grad=True)
    x = TermInputs(logp=logp, mask=torch.ones(1, 2, dtype=torch.bool), advantages=torch.tensor([2.0]), behaviour_logp=logp.detach(),
                   rows={"calib_logp": torch.tensor([[L(0.4), 0.0]]), "calib_has": torch.tensor([[True, False]]),
                         "calib_pass": torch.tensor([True])})
    out = TERMS.get("calibrl")(x)
    out.per_token.sum().backward()
    assert out.per_token.flatten().tolist() == pytest.approx([2.0 * (L(0.4) - L(0.2)), 0.0])
    assert logp.grad.flatten().tolist() == pytest.approx([-2.0, 0.0])
    assert out.metrics["calibrl/covered"] == pytest.approx(0.5)


def test_the_term_refuses_a_batch_without_the_baseline():
    logp = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="algo.shaping.name=calibrl"):
        TERMS.get("calibrl")(TermInputs(logp=logp, mask=torch.ones(1, 2, dtype=torch.bool), advantages=torch.ones(1),
                                        behaviour_logp=logp))


class _Forwards:
    batch_size = 4

    def behaviour_logps(self, model, out):
        return out["old_per_token_logps"]


def test_the_stage_keeps_the_advantage_and_writes_the_baseline_into_the_batch():
    """3 rollouts + 1 expert row (2 tokens, the second padding) in one group; rewards 1, 0, 0.05, 1."""
    logp = torch.tensor([[L(0.5), L(0.5)], [L(0.9), L(0.9)], [L(0.2), L(0.1)], [L(0.25), L(0.7)]])
    out = {"completion_mask": torch.tensor([[1, 1], [1, 1], [1, 1], [1, 0]]), "old_per_token_logps": logp,
           "row_source": torch.tensor([prov.ON_POLICY] * 3 + [prov.EXPERT])}
    part = AdvantageShaping("calibrl", {"pass_threshold": 0.1}, offpolicy=False, forwards=_Forwards(), gather=lambda t: t)
    adv = torch.tensor([0.9, -0.5, -0.4, 0.9])
    shaped, _ = part.shape(None, out, advantages=adv, rewards=torch.tensor([1.0, 0.0, 0.05, 1.0]),
                           group_ids=torch.zeros(4, dtype=torch.long), sources=out["row_source"], include=None, rewards_per_func=None)
    assert shaped.tolist() == pytest.approx(adv.tolist())
    assert out["calib_logp"][:3].flatten().tolist() == pytest.approx([L(0.25), 0.0] * 3)  # the expert's padding is masked to 0
    assert out["calib_has"][:3].tolist() == [[True, False]] * 3
    assert out["calib_pass"].tolist() == [True, False, False, True]  # 0.05 is not above 0.1

    # the objective hands the row fields to the term: policy + 0.1 guided, token-mean over the rollouts
    obj = Objective([TermSpec("guided", "calibrl", ("on_policy",), ("on_policy",), weight=0.1)])
    lp = logp.clone().requires_grad_(True)
    ts = out["row_source"][:, None].expand(4, 2).clone()
    loss, _ = compute_objective(obj, logp=lp, mask=out["completion_mask"].bool(), advantages=shaped, token_source=ts,
                                old_logp=logp, row_fields={k: out[k] for k in ("calib_logp", "calib_has", "calib_pass")})
    # 6 rollout tokens; only position 0 has a baseline (ln .25). row 0 passes: input ln.25 - ln.5 < 0 -> 0.5 slope
    # row 1 fails: ln.9 - ln.25 > 0 -> slope 1; row 2 fails: ln.2 - ln.25 < 0 -> slope 0.5
    by_hand = 0.1 / 6 * (0.9 * 0.5 * (L(0.25) - L(0.5)) + 0.5 * (L(0.9) - L(0.25)) + 0.4 * 0.5 * (L(0.2) - L(0.25)))
    assert loss.item() == pytest.approx(by_hand)
    loss.backward()
    assert lp.grad[:, 0].tolist() == pytest.approx([0.1 / 6 * -0.45, 0.1 / 6 * 0.5, 0.1 / 6 * 0.2, 0.0])
    assert lp.grad[:, 1].abs().sum() == 0


def test_the_calibrl_shaping_leaves_the_advantage():
    a = torch.tensor([1.0, -2.0])
    assert SHAPINGS.get("calibrl")(a, pass_threshold=0.1).tolist() == [1.0, -2.0]


# ----------------------------------------------------------------------------- config
def _cfg(overrides):
    from mixrl.config.compose import compose_config

    return compose_config(overrides)


@pytest.mark.parametrize("overrides, words", [
    (["algo=calibrl", "algo.shaping=null"], "algo.shaping.name=calibrl"),
    (["algo=grpo", "algo.shaping={name: calibrl}"], "group_replace"),
    (["algo=calibrl", "algo.terms.guided.negative_slope=2"], "negative_slope"),
])
def test_calibrl_refusals_are_one_line(overrides, words):
    from mixrl.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        _cfg(overrides)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_the_preset_composes_and_explain_shows_the_guided_term():
    from mixrl.explain.render import explain_lines

    cfg = _cfg(["algo=calibrl"])
    assert cfg.algo.terms.guided.weight == 0.1 and cfg.algo.inject.name == "group_replace"
    text = "\n".join(str(v) for _, v in explain_lines(cfg))
    assert "LeakyReLU" in text and "calibrl" in text
