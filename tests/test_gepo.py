"""GEPO (mixrl.core.gepo, mixrl.sources.gepo): the set loss by hand from the description of
"On-Policy Optimization with Group Equivalent Preference for Multi-Programming Language Understanding"
(arXiv 2505.12723, section 3.2), the per-row split whose gradients add up to the set's, the sets the
injection forms, refusals, and two training steps of the preset."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from mixrl.cli.main import app
from mixrl.config.compose import compose_config
from mixrl.core import provenance as prov
from mixrl.core.gepo import gepo, gepo_set_loss
from mixrl.core.terms import TermInputs
from mixrl.errors import ConfigError
from mixrl.sources import InjectContext
from mixrl.sources.gepo import GepoSets


def test_set_loss_by_hand():
    w, lo = torch.tensor([0.5, 0.3]), torch.tensor([-0.2])
    # r = 0.1 Delta: winners 0.05, 0.03 (mean 0.04, population variance 0.0001), loser -0.02
    by_hand = math.log(1 + math.exp(-0.06)) + 1.0 * 0.0001
    assert gepo_set_loss(w, lo, beta=0.1, lam=1.0).item() == pytest.approx(by_hand, rel=1e-6)
    assert gepo_set_loss(w, lo, beta=0.1, lam=0.0).item() == pytest.approx(math.log(1 + math.exp(-0.06)), rel=1e-6)


def _fields(deltas, sides, set_ids):
    """The set fields of rows with these Delta = s - s_ref values, as the injection writes them."""
    out = {k: [] for k in ("pair_set", "pair_set_side", "pair_set_w_sum", "pair_set_l_sum", "pair_set_w_sq", "pair_set_n", "pair_set_m")}
    for i, s in enumerate(set_ids):
        members = [j for j, t in enumerate(set_ids) if t == s and s >= 0]
        w = [deltas[j] for j in members if sides[j] == 1]
        lo = [deltas[j] for j in members if sides[j] == 0]
        out["pair_set"].append(s)
        out["pair_set_side"].append(sides[i])
        out["pair_set_w_sum"].append(sum(w))
        out["pair_set_l_sum"].append(sum(lo))
        out["pair_set_w_sq"].append(sum(d * d for d in w))
        out["pair_set_n"].append(float(len(w)))
        out["pair_set_m"].append(float(len(lo)))
    return {k: torch.tensor(v, dtype=torch.long if k in ("pair_set", "pair_set_side") else torch.float32) for k, v in out.items()}


def _rows():
    torch.manual_seed(1)
    logp0 = -torch.rand(5, 3) - 0.2
    ref = -torch.rand(5, 3) - 0.2
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]])
    sides, sets = [1, 1, 0, 0, -1], [0, 0, 0, 0, -1]  # one set of 2 winners and 2 losers, one row outside
    delta = ((logp0 - ref) * mask).sum(-1).tolist()
    return logp0, ref, mask, sides, sets, delta


def test_rows_add_up_to_the_sets_value_and_gradient_even_split_across_micro_batches():
    beta, lam = 0.1, 1.0
    logp0, ref, mask, sides, sets, delta = _rows()
    fields = _fields(delta, sides, sets)
    # reference: the set loss on live Delta
    lt = logp0.clone().requires_grad_(True)
    d = ((lt - ref) * mask).sum(-1)
    ref_loss = gepo_set_loss(d[[0, 1]], d[[2, 3]], beta=beta, lam=lam)
    ref_loss.backward()
    G = 4
    # the term, all rows in one micro-batch: each row's token sum is L_set in value, and the rows'
    # gradients add up to G times the set's gradient (the seq-mean-token-sum over rows then divides by the rows)
    lp = logp0.clone().requires_grad_(True)
    x = TermInputs(logp=lp, mask=mask.bool(), advantages=torch.zeros(5), behaviour_logp=lp.detach(), ref_logp=ref, rows=fields)
    out = gepo(x, beta=beta, lam=lam)
    row_values = out.per_token.sum(-1)
    assert row_values[:4].tolist() == pytest.approx([ref_loss.item()] * 4, rel=1e-5)
    assert row_values[4].item() == 0.0
    row_values.sum().backward()
    assert torch.allclose(lp.grad, G * lt.grad, atol=1e-6)
    # the same rows split over two micro-batches: the summed gradient is unchanged
    grads = torch.zeros_like(logp0)
    for part in ([0, 2], [1, 3, 4]):
        lp2 = logp0[part].clone().requires_grad_(True)
        sub = {k: v[part] for k, v in fields.items()}
        o = gepo(TermInputs(logp=lp2, mask=mask[part].bool(), advantages=torch.zeros(len(part)),
                            behaviour_logp=lp2.detach(), ref_logp=ref[part], rows=sub), beta=beta, lam=lam)
        o.per_token.sum().backward()
        grads[part] = lp2.grad
    assert torch.allclose(grads, G * lt.grad, atol=1e-6)


class _Tok:
    eos_token_id, pad_token_id = 0, 0


def test_injection_forms_sets_from_mixed_groups_only():
    G = 3
    rewards = [1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.5]  # group 0 mixed, group 1 all right, group 2 all wrong (0.5 < 1)
    n, width = len(rewards), 2
    out = {
        "prompt_ids": torch.tensor([[7, 8]] * n), "prompt_mask": torch.ones(n, 2, dtype=torch.long),
        "completion_ids": torch.arange(1, 2 * n + 1).view(n, 2), "completion_mask": torch.ones(n, width, dtype=torch.long),
        "row_source": torch.full((n,), prov.ON_POLICY), "group_id": torch.arange(n) // G,
        "mixrl_reward": torch.tensor(rewards), "ref_per_token_logps": torch.full((n, width), -0.5),
        "advantages": torch.zeros(n),
    }
    ctx = InjectContext(tokenizer=_Tok(), process_index=0, num_processes=1, num_generations=G, max_completion_length=4,
                        global_step=0, micro_step=0, device=torch.device("cpu"), tokenize_prompts=None, gather=lambda t: t,
                        behaviour_logps=lambda p, c: [[-0.1 * (x[0] % 3 + 1)] * len(x) for x in c])
    inj = GepoSets(win_at=1.0)
    res = inj.after_advantages(ctx, [{}] * n, out)
    assert res["pair_set"].tolist() == [0, 0, 0] + [-1] * 6
    assert res["pair_set_side"].tolist() == [1, 0, 1] + [-1] * 6
    # Delta = 2 tokens x (policy - ref): rows 0, 1, 2 have first tokens 1, 3, 5 -> policy -0.2, -0.1, -0.3 per token
    d = [2 * (-0.2 + 0.5), 2 * (-0.1 + 0.5), 2 * (-0.3 + 0.5)]
    assert res["pair_set_w_sum"][0].item() == pytest.approx(d[0] + d[2], abs=1e-6)
    assert res["pair_set_l_sum"][1].item() == pytest.approx(d[1], abs=1e-6)
    assert res["pair_set_w_sq"][2].item() == pytest.approx(d[0] ** 2 + d[2] ** 2, abs=1e-6)
    assert res["pair_set_n"][0].item() == 2.0 and res["pair_set_m"][0].item() == 1.0
    assert inj.metrics == {"gepo/sets": 1.0, "gepo/groups": 3.0}


@pytest.mark.parametrize("overrides, match", [
    (["algo=gepo", "algo.terms.gepo.beta=0"], "beta"),
    (["algo=gepo", "algo.terms.gepo.lam=-1"], "lam"),
])
def test_out_of_range_gepo_settings_are_refused_in_one_line(overrides, match):
    with pytest.raises(ConfigError, match=match) as e:
        compose_config(overrides)
    assert "\n" not in str(e.value)


runner = CliRunner()


@pytest.mark.slow
def test_gepo_preset_trains_two_steps(fast_overrides):
    run_dir = next(o for o in fast_overrides if o.startswith("run_dir=")).split("=", 1)[1]
    res = runner.invoke(app, ["train", "algo=gepo", *fast_overrides, "trainer.eval_size=0"])
    assert res.exit_code == 0, (res.stdout[-1500:], res.exception)
    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert len(rows) == 2
    assert all(math.isfinite(r["loss/gepo"]) and r["gepo/groups"] >= 1 for r in rows)
