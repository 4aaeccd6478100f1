"""Pair constructors of mixrl.sources.pair_builders (SPIN's demonstration-vs-rollout pairs, RSO's
statistical rejection sampling), the reference reset (algo.kl.reset_every, mixrl.config.ref_reset),
the config refusals of the new pair presets, and two training steps of each preset through the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from mixrl.cli.main import app
from mixrl.config.compose import compose_config
from mixrl.config.ref_reset import ref_reset_args
from mixrl.core import provenance as prov
from mixrl.errors import ConfigError
from mixrl.sources import InjectContext
from mixrl.sources.expert import ExpertSource
from mixrl.sources.pair_builders import RsoPairs, SeraPairs, SpinPairs, rejection_sample
from mixrl.sources.pairs import PAIR_OFF_POLICY, PAIR_ON_POLICY, PairSource

PRESETS = ["rdpo", "slic", "spin", "rso", "copg", "osp", "dno", "sera"]


class _Tok:
    eos_token_id, pad_token_id = 0, 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % 50 + 1 for c in text]}


def _ctx(G=4):
    return InjectContext(
        tokenizer=_Tok(), process_index=0, num_processes=1, num_generations=G, max_completion_length=16,
        global_step=3, micro_step=0, device=torch.device("cpu"),
        tokenize_prompts=lambda ps: [[ord(c) % 50 + 1 for c in p] for p in ps], gather=lambda t: t,
        behaviour_logps=lambda p, c: [[-0.1] * len(x) for x in c],  # the policy now: -0.1 per token
        ref_logps=lambda p, c: [[-0.3] * len(x) for x in c],  # the reference: -0.3 per token
    )


def _batch(rewards, lengths, G=4, completions=None):
    n, width = len(rewards), max(lengths)
    comp = torch.zeros(n, width, dtype=torch.long)
    mask = torch.zeros(n, width, dtype=torch.long)
    for i, L in enumerate(lengths):
        comp[i, :L] = torch.tensor(completions[i]) if completions else torch.arange(1, L + 1) + 10 * i
        mask[i, :L] = 1
    return {
        "prompt_ids": torch.tensor([[0, 7, 8]] * n), "prompt_mask": torch.tensor([[0, 1, 1]] * n),
        "completion_ids": comp, "completion_mask": mask, "advantages": torch.zeros(n),
        "row_source": torch.full((n,), prov.ON_POLICY), "token_source": torch.full((n, width), prov.ON_POLICY),
        "behaviour_logp": torch.full((n, width), float("nan")), "group_id": torch.arange(n) // G,
        "mixrl_reward": torch.tensor(rewards, dtype=torch.float32),
        "ref_per_token_logps": torch.full((n, width), -0.5), "old_per_token_logps": torch.full((n, width), -0.2),
    }


# --------------------------------------------------------------------------- RSO
class _Draws:
    """A stand-in for random.Random whose random() returns the given numbers in order."""

    def __init__(self, us):
        self.us = list(us)

    def random(self):
        return self.us.pop(0)


def test_rejection_sample_accepts_with_probability_exp_of_the_reward_gap():
    # pass 1, r_max = 1: y0 u=.9 < exp(0) accept; y1 u=.2 >= exp(-2)=.135 reject; y2 accept; y3 u=.1 < .135 accept
    assert rejection_sample([1.0, 0.0, 1.0, 0.0], accept=3, beta=0.5, rng=_Draws([0.9, 0.2, 0.5, 0.1])) == [0, 2, 3]
    # pass 1, r_max = .2: y0 u=.5 >= exp(-2) reject, y1 accepted; pass 2 over {y0}, r_max = 0: y0 accepted
    assert rejection_sample([0.0, 0.2], accept=2, beta=0.1, rng=_Draws([0.5, 0.99, 0.7])) == [1, 0]
    # fewer candidates than asked: all of them, the best first in its pass
    assert sorted(rejection_sample([0.0, 1.0], accept=5, beta=0.1, rng=_Draws([0.99, 0.0, 0.5]))) == [0, 1]


def test_rejection_sample_first_draw_follows_the_tilted_distribution():
    """One accepted draw out of [0, 1] with beta = 1: the first pass takes y0 with probability
    e^-1 (then stops); else y1. So P(y0) = e^-1 = pi*(y0) / pi*(y1) * ... checked by frequency."""
    import random

    rng = random.Random(0)
    n = 20000
    first = sum(rejection_sample([0.0, 1.0], accept=1, beta=1.0, rng=rng) == [0] for _ in range(n)) / n
    assert first == pytest.approx(math.exp(-1.0), abs=0.015)


def test_rso_pairs_pair_accepted_draws_in_order_and_carry_rewards():
    # beta huge: every candidate accepted in order -> pairs (0, 1) and (2, 3) of group 0; group 1 all tied
    out = _batch([1, 0, 0, 1, 1, 1, 1, 1], [2, 3, 2, 3, 2, 2, 2, 2])
    inj = RsoPairs(pairs=4, beta=1e9, accept=4)
    new = inj.after_advantages(_ctx(), [], out)
    assert inj.metrics["pairs/on_policy"] == 2.0 and inj.metrics["pairs/rso_tied"] == 2.0
    assert inj.metrics["pairs/rso_accepted"] == 8.0
    assert new["completion_ids"][8, :2].tolist() == out["completion_ids"][0, :2].tolist()  # (y0 > y1): y0 chosen
    assert new["completion_ids"][10, :3].tolist() == out["completion_ids"][3, :3].tolist()  # (y2 < y3): y3 chosen
    assert new["row_source"][8:].tolist() == [PAIR_ON_POLICY] * 4
    assert new["pair_side"][8:].tolist() == [1, 0, 1, 0]
    assert new["pair_reward"][8:].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert new["pair_partner_reward"][8:].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert torch.isnan(new["pair_reward"][:8]).all()


# --------------------------------------------------------------------------- SPIN
def test_spin_pairs_put_the_demonstration_over_a_rollout():
    ctx = _ctx(G=2)
    demo = "12 #### 12"
    demo_ids = ctx.completion_ids(demo)
    # group 0: two rollouts unlike the demo; group 1: both rollouts ARE the demo (skipped); group 2: no demo
    comps = [[1, 2], [3, 4, 5], demo_ids, demo_ids, [6, 7], [8, 9]]
    lengths = [len(c) for c in comps]
    out = _batch([0, 0, 1, 1, 0, 0], lengths, G=2, completions=comps)
    inputs = [{"prompt": "p", "expert": [demo]}] * 4 + [{"prompt": "q", "expert": []}] * 2
    inj = SpinPairs(pairs=4, source=ExpertSource())
    new = inj.after_advantages(ctx, inputs, out)
    assert inj.metrics["pairs/spin"] == 1.0 and inj.metrics["pairs/spin_same_as_demo"] == 1.0
    assert inj.metrics["pairs/spin_no_demo"] == 1.0
    assert new["completion_ids"].shape[0] == 8
    L = len(demo_ids)
    assert new["completion_ids"][6, :L].tolist() == demo_ids  # chosen: the demonstration
    assert new["row_source"][6:].tolist() == [PAIR_OFF_POLICY, PAIR_ON_POLICY]
    rejected = new["completion_ids"][7][new["completion_mask"][7].bool()].tolist()
    assert rejected in ([1, 2], [3, 4, 5])  # rejected: one of the group's own rollouts
    assert torch.isnan(new["behaviour_logp"][6]).all()  # a demonstration: behaviour unknown
    # reference log-probs: the reference model's for the demonstration, the rollout's own (TRL's) for the rollout
    assert new["ref_per_token_logps"][6, :L].tolist() == pytest.approx([-0.3] * L)
    assert new["pair_partner_ref_logp"][7].item() == pytest.approx(-0.3 * L)
    assert new["pair_partner_logp"][6].item() == pytest.approx(-0.1 * len(rejected))


# --------------------------------------------------------------------------- SeRA
def test_sera_pairs_keep_the_largest_implicit_reward_margins_and_self_label_rollouts():
    """Fake policy -0.1 per token; reference -0.3 per token (the reference model) or -0.5 (the rollouts'
    own, from TRL). Implicit reward r_hat = beta (s - s_ref): 0.2 beta per token of a source side,
    0.4 beta per token of a rollout. Source candidates: gaps of 1 and 3 characters (+1 eos each side):
    the 3-character gap has the larger margin and is kept. Rollouts: group 0 lengths 2, 5, 3, 4 ->
    chosen the 5-token one, rejected the 2-token one, whatever their task reward."""
    beta = 0.5
    src = PairSource()
    src.pool = [("1+2=", "ab", "a"), ("2+2=", "abcd", "a")]
    src.sample = lambda rng, n: list(src.pool)  # both candidates, in this order
    out = _batch([1, 0, 1, 1, 0, 0, 0, 0], [2, 5, 3, 4, 2, 2, 2, 2])  # group 1: all lengths equal -> r_hat tie, no pair
    inj = SeraPairs(pairs=2, pool=2, beta=beta, bootstrap=0.5, source=src)
    new = inj.after_advantages(_ctx(), [], out)
    assert inj.metrics["pairs/on_policy"] == 1.0 and inj.metrics["pairs/off_policy"] == 1.0
    assert inj.metrics["pairs/sera_off_margin"] == pytest.approx(beta * 0.2 * 3)
    assert new["completion_ids"][8, :5].tolist() == out["completion_ids"][1, :5].tolist()  # bootstrapped chosen: longest
    assert new["completion_ids"][9, :2].tolist() == out["completion_ids"][0, :2].tolist()
    assert new["pair_reward"][8:10].tolist() == [0.0, 1.0]  # labelled by the implicit reward, not the task reward
    ctx = _ctx()
    assert new["completion_ids"][10, :5].tolist() == ctx.completion_ids("abcd")  # kept source pair: the 3-character gap
    assert new["row_source"][8:].tolist() == [PAIR_ON_POLICY] * 2 + [PAIR_OFF_POLICY] * 2


# --------------------------------------------------------------------------- label noise (rDPO's setting)
def test_pairs_source_flips_labels_at_the_stated_rate():
    import random

    src = PairSource(flip=0.3)
    src.pool = [("1+2=", "3 #### 3", "1 #### 1")]
    picks = src.sample(random.Random(0), 4000)
    flipped = sum(c == "1 #### 1" for _, c, _ in picks) / len(picks)
    assert flipped == pytest.approx(0.3, abs=0.03)
    assert all({c, r} == {"3 #### 3", "1 #### 1"} for _, c, r in picks)
    clean = PairSource()
    clean.pool = [("a", "b", "c"), ("d", "e", "f")]
    # flip 0: the draws are those of the pool alone (the same generator calls as before the option existed)
    rng = random.Random(1)
    expected = [clean.pool[rng.randrange(2)] for _ in range(6)]
    assert clean.sample(random.Random(1), 6) == expected


# --------------------------------------------------------------------------- the reference reset
def test_reference_reset_is_trls_sync_with_alpha_one():
    assert ref_reset_args(compose_config(["algo=spin"])) == {
        "sync_ref_model": True, "ref_model_mixup_alpha": 1.0, "ref_model_sync_steps": 20}
    assert ref_reset_args(compose_config(["algo=simplemix"])) == {}
    from mixrl.explain.render import explain_lines

    rows = dict(explain_lines(compose_config(["algo=dno"])))
    assert "every 20th optimizer step" in rows["reference"]
    assert "reference" not in dict(explain_lines(compose_config(["algo=simplemix"])))


# --------------------------------------------------------------------------- config refusals
@pytest.mark.parametrize("overrides,match", [
    (["algo=rdpo", "algo.terms.rdpo.epsilon=0.5"], "epsilon"),
    (["algo=rdpo", "algo.terms.rdpo.beta=-0.1"], "beta"),
    (["algo=slic", "algo.terms.slic.delta=-1"], "delta"),
    (["algo=osp", "algo.terms.osp.temperature=0"], "temperature"),
    (["algo=copg", "algo.terms.copg.beta=0"], "beta"),
    (["algo=rso", "algo.inject.beta=0"], "beta"),
    (["algo=rso", "algo.inject.accept=1"], "accept"),
    (["algo=rdpo", "+algo.terms.c={name: copg, tokens: [pair_on_policy, pair_off_policy]}"], "both sides' rewards"),
    (["algo=spin", "algo.kl.reset_every=-1"], "reset_every"),
    (["algo=spin", "model.lora.enabled=true"], "lora"),
    (["algo=grpo", "+algo.kl.reset_every=5"], "nothing reads the reference"),
    (["algo=spin", "offpolicy=none"], "offpolicy"),
    (["algo=sera", "algo.inject.bootstrap=1.5"], "bootstrap"),
    (["algo=rdpo", "offpolicy.source.flip=0.5"], "flip"),
    (["algo=sera", "algo.inject.pool=0"], "pool"),
])
def test_out_of_range_pair_settings_are_refused_in_one_line(overrides, match):
    with pytest.raises(ConfigError, match=match) as e:
        compose_config(overrides)
    assert "\n" not in str(e.value)


# --------------------------------------------------------------------------- training
runner = CliRunner()


@pytest.mark.slow
@pytest.mark.parametrize("algo", PRESETS)
def test_pair_preset_trains_two_steps(algo, fast_overrides):
    run_dir = next(o for o in fast_overrides if o.startswith("run_dir=")).split("=", 1)[1]
    extra = ["algo.kl.reset_every=1"] if algo in ("spin", "dno") else []
    if algo == "osp":  # the policy judges its pairs: the character model's 64 positions take no English request
        extra = ["algo.inject.request='{first} {second}'"]
    res = runner.invoke(app, ["train", f"algo={algo}", *fast_overrides, "trainer.eval_size=0", "trainer.learning_rate=1e-3", *extra])
    assert res.exit_code == 0, (res.stdout[-1500:], res.exception)
    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert len(rows) == 2
    term = {"rdpo": "rdpo", "slic": "slic", "spin": "spin", "rso": "rso", "copg": "copg", "osp": "osp", "dno": "dno", "sera": "dpo"}[algo]
    assert all(math.isfinite(r[f"loss/{term}"]) for r in rows)
    if algo in ("spin", "dno"):
        # the reference is reset to the policy after every step: each step starts at margin 0
        margins = [r["dpo/margin"] for r in rows if "dpo/margin" in r]
        assert all(abs(m) < 1e-4 for m in margins)
        assert margins or algo == "dno"  # dno's pairs need a group whose rewards differ (4 small groups may all tie)
