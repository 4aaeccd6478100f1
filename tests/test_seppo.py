"""SePPO (mixrl.sources.seppo, the seppo term of mixrl.core.preference_losses): the flipped DPO loss
by hand (values and the pair's gradient), the checkpoints (saved, kept, drawn, loaded into the
reference model), the pairs, refusals, and two training steps of the preset."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from mixrl.cli.main import app
from mixrl.config.compose import compose_config
from mixrl.core.preference_losses import seppo
from mixrl.core.terms import TermInputs
from mixrl.errors import ConfigError
from mixrl.sources.expert import ExpertSource
from mixrl.sources.pairs import PAIR_OFF_POLICY
from mixrl.sources.seppo import SeppoPairs
from tests.test_pair_builders import _batch, _ctx

V = 60


def _pair_inputs(lp_w, lp_l, ref_w, ref_l):
    """Two rows (chosen, rejected) of one pair with 2 tokens each; the partner fields as the injection writes them."""
    logp = torch.tensor([lp_w, lp_l], dtype=torch.float32).requires_grad_(True)
    ref = torch.tensor([ref_w, ref_l], dtype=torch.float32)
    s, sr = logp.detach().sum(-1), ref.sum(-1)
    rows = {"pair_index": torch.tensor([0, 0]), "pair_side": torch.tensor([1, 0]),
            "pair_partner_logp": torch.stack([s[1], s[0]]), "pair_partner_ref_logp": torch.stack([sr[1], sr[0]]),
            "pair_partner_len": torch.tensor([2.0, 2.0])}
    return logp, TermInputs(logp=logp, mask=torch.ones(2, 2, dtype=torch.bool), advantages=torch.zeros(2),
                            behaviour_logp=logp.detach(), ref_logp=ref, rows=rows)


@pytest.mark.parametrize("flip", ["sign", "indicator", "none"])
@pytest.mark.parametrize("ahead", [True, False])
def test_seppo_loss_and_gradient_by_hand(flip, ahead):
    beta = 0.5
    lp_w, lp_l = [-0.2, -0.4], [-0.7, -0.1]
    ref_w = [-0.5, -0.5] if ahead else [-0.1, -0.1]  # Delta(y_w) = -0.6 + 1.0 = 0.4 > 0, or -0.6 + 0.2 = -0.4 < 0
    ref_l = [-0.3, -0.3]
    dw, dl = sum(lp_w) - sum(ref_w), sum(lp_l) - sum(ref_l)
    c = {"sign": 1.0 if ahead else -1.0, "indicator": 1.0 if ahead else 0.0, "none": 1.0}[flip]
    expected = math.log(1 + math.exp(-beta * (dw - c * dl)))
    logp, x = _pair_inputs(lp_w, lp_l, ref_w, ref_l)
    out = seppo(x, beta=beta, flip=flip)
    rows = out.per_token.sum(-1)
    assert rows.tolist() == pytest.approx([expected, expected], rel=1e-5)
    rows.sum().backward()
    # each row carries twice its own side's gradient (the pair terms' 2L - sg(L)): dL/dlogp_t = -beta sigmoid(-h) (1, -c)
    g = -beta * (1 / (1 + math.exp(beta * (dw - c * dl))))
    assert logp.grad[0].tolist() == pytest.approx([2 * g] * 2, rel=1e-5)
    assert logp.grad[1].tolist() == pytest.approx([-2 * c * g] * 2, rel=1e-5, abs=1e-9)
    if flip != "none":
        assert out.metrics["seppo/flipped"] == (0.0 if ahead else 1.0)


class _LM(torch.nn.Module):
    """Next-token logits from one parameter vector, the same at every position."""

    def __init__(self, logits):
        super().__init__()
        self.z = torch.nn.Parameter(torch.tensor(logits, dtype=torch.float32))

    def forward(self, input_ids, attention_mask=None):
        b, t = input_ids.shape
        return SimpleNamespace(logits=self.z.expand(b, t, V))


def _eos_first(v=-5.0):
    z = [v] * V
    z[0] = 30.0
    return z


def test_checkpoints_are_saved_kept_drawn_and_loaded():
    inj = SeppoPairs(pairs=2, save_every=10, keep=2, source=ExpertSource())
    policy = _LM(_eos_first(-1.0))
    for step, value in [(0, -1.0), (5, -2.0), (10, -3.0), (20, -4.0), (30, -5.0)]:
        with torch.no_grad():
            policy.z[1:] = value
        inj._keep_checkpoint(policy, step)
    assert sorted(inj.checkpoints) == [0, 20, 30]  # the initial one, then the newest 2 (10 dropped; 5 never saved)
    assert inj.checkpoints[20]["z"][1].item() == -4.0
    ref = _LM(_eos_first(0.0))
    inj.load_into(ref, inj.checkpoints[0])
    assert ref.z[1].item() == -1.0 and ref.z[0].item() == 30.0
    draws = {inj._draw(SimpleNamespace(global_step=s)) for s in range(40)}
    assert draws == {0, 20, 30}
    assert inj._draw(SimpleNamespace(global_step=7)) == inj._draw(SimpleNamespace(global_step=7))  # every process alike
    # the state round-trips
    other = SeppoPairs(pairs=2, source=ExpertSource())
    other.load_state_dict(inj.state_dict())
    assert sorted(other.checkpoints) == [0, 20, 30]


def test_pairs_put_the_demonstration_over_the_checkpoints_sample():
    ctx = _ctx(G=2)
    policy, ref = _LM(_eos_first(-1.0)), _LM(_eos_first(0.0))
    ctx.policy, ctx.ref_model = policy, ref
    demo = "12 #### 12"
    demo_ids = ctx.completion_ids(demo)
    out = _batch([0, 1, 0, 0], [2, 3, 2, 2], G=2)
    inputs = [{"prompt": "p", "expert": [demo]}] * 2 + [{"prompt": "q", "expert": []}] * 2
    inj = SeppoPairs(pairs=2, save_every=10, source=ExpertSource())
    new = inj.after_advantages(ctx, inputs, out)
    assert inj.metrics["pairs/seppo"] == 1.0 and inj.metrics["pairs/seppo_no_demo"] == 1.0
    assert inj.metrics["seppo/reference_step"] == 3.0 and sorted(inj.checkpoints) == [3]  # the first call saves the policy now
    assert ref.z[1].item() == -1.0  # the reference model holds the drawn checkpoint (the policy's weights)
    L = len(demo_ids)
    assert new["completion_ids"][4, :L].tolist() == demo_ids
    assert new["completion_ids"][5][new["completion_mask"][5].bool()].tolist() == [0]  # the checkpoint writes eos at once
    assert new["row_source"][4:].tolist() == [PAIR_OFF_POLICY, PAIR_OFF_POLICY]
    assert new["ref_per_token_logps"][4, :L].tolist() == pytest.approx([-0.3] * L)  # ctx.ref_logps after the load


def test_seppo_without_a_reference_model_says_so():
    with pytest.raises(RuntimeError, match="reference model"):
        SeppoPairs(source=ExpertSource()).after_advantages(_ctx(G=2), [], _batch([0, 1], [2, 2], G=2))


@pytest.mark.parametrize("overrides, match", [
    (["algo=seppo", "algo.terms.seppo.flip=maybe"], "flip"),
    (["algo=seppo", "algo.terms.seppo.beta=0"], "beta"),
    (["algo=seppo", "algo.inject.save_every=0"], "save_every"),
    (["algo=seppo", "model.lora.enabled=true"], "lora"),
])
def test_out_of_range_seppo_settings_are_refused_in_one_line(overrides, match):
    with pytest.raises(ConfigError, match=match) as e:
        compose_config(overrides)
    assert "\n" not in str(e.value)


runner = CliRunner()


@pytest.mark.slow
def test_seppo_preset_trains_two_steps(fast_overrides):
    run_dir = next(o for o in fast_overrides if o.startswith("run_dir=")).split("=", 1)[1]
    res = runner.invoke(app, ["train", "algo=seppo", *fast_overrides, "trainer.eval_size=0", "algo.inject.save_every=1"])
    assert res.exit_code == 0, (res.stdout[-1500:], res.exception)
    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert len(rows) == 2
    assert all(math.isfinite(r["loss/seppo"]) for r in rows)
    assert [r["seppo/checkpoints"] for r in rows] == [1.0, 2.0]
