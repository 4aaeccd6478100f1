"""OSP's self-judged pairs (``algo=osp``): the policy being trained judges the preference strength of its
own pairs (``algo.inject.name=self_judged_pairs``), and the soft-preference cross-entropy trains toward
it (``osp`` with ``strength: self``). Values by hand on a stand-in context.

Paper: "Online Self-Preferring Language Models" (arXiv 2405.14103); no authors' code was found, the
comparison request and the two-label probability are mixrl's reading (mixrl/sources/self_judged_pairs.py).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from mixrl.config.compose import compose_config
from mixrl.core import provenance as prov
from mixrl.core.aggregation import AGGREGATIONS
from mixrl.core.terms import TERMS, TermInputs
from mixrl.errors import ConfigError, UserFunctionError
from mixrl.sources import InjectContext
from mixrl.sources.pairs import GroupPairs
from mixrl.sources.self_judged_pairs import SelfJudgedPairs, strength


def _sig(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


class _Tok:  # one token per character, id = code point
    eos_token_id, pad_token_id = 0, 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if i)


def _text(ids) -> str:
    return "".join(chr(i) for i in ids)


class _Policy:
    """The policy now, as the injection sees it: a judgement request ending in "|A>B" with answer "1" (or "2")
    gets the log-prob LP[(A, B)][0] (or [1]); any other completion -0.1 per token."""

    LP = {("77", "78"): (-0.2, -1.4), ("78", "77"): (-0.9, -0.6)}

    def __init__(self):
        self.judged: list[str] = []

    def __call__(self, prompts, completions):
        out = []
        for p, c in zip(prompts, completions):
            text = _text(p)
            if text.startswith("J:") and len(c) == 1:
                self.judged.append(text)
                first, second = text[2:].split("|")
                out.append([self.LP[(first, second)][0 if chr(c[0]) == "1" else 1]])
            else:
                out.append([-0.1] * len(c))
        return out


def _ctx(policy, max_positions=None):
    return InjectContext(
        tokenizer=_Tok(), process_index=0, num_processes=1, num_generations=2, max_completion_length=8,
        global_step=1, micro_step=0, device=torch.device("cpu"),
        tokenize_prompts=lambda ps: [[ord(c) for c in p] for p in ps], gather=lambda t: t,
        behaviour_logps=policy, ref_logps=lambda p, c: [[-0.3] * len(x) for x in c], max_positions=max_positions,
    )


def _batch():
    """One group of 2 rollouts of prompt "5+2=": "77" (reward 1) and "78" (reward 0)."""
    comp = torch.tensor([[ord("7"), ord("7")], [ord("7"), ord("8")]])
    return {
        "prompt_ids": torch.tensor([[ord(c) for c in "5+2="]] * 2), "prompt_mask": torch.ones(2, 4, dtype=torch.long),
        "completion_ids": comp, "completion_mask": torch.ones(2, 2, dtype=torch.long), "advantages": torch.zeros(2),
        "row_source": torch.full((2,), prov.ON_POLICY), "token_source": torch.full((2, 2), prov.ON_POLICY),
        "behaviour_logp": torch.full((2, 2), float("nan")), "group_id": torch.tensor([0, 0]),
        "mixrl_reward": torch.tensor([1.0, 0.0]),
        "ref_per_token_logps": torch.full((2, 2), -0.5), "old_per_token_logps": torch.full((2, 2), -0.2),
    }


INPUTS = [{"prompt": "5+2="}, {"prompt": "5+2="}]


def test_the_strength_is_the_policys_two_label_probability_averaged_over_both_orders():
    policy = _Policy()
    inj = SelfJudgedPairs(pairs=1, request="J:{first}|{second}")
    out = inj.after_advantages(_ctx(policy), INPUTS, _batch())
    # y_w = "77" shown first: sigmoid(-0.2 - (-1.4)); shown second: sigmoid(log pi("2") - log pi("1")) = sigmoid(-0.6 - (-0.9))
    p = (_sig(1.2) + _sig(0.3)) / 2
    assert strength([-0.2, -1.4, -0.9, -0.6], True) == pytest.approx(p)
    assert strength([-0.2, -1.4], False) == pytest.approx(_sig(1.2))
    assert policy.judged == ["J:77|78", "J:77|78", "J:78|77", "J:78|77"]  # each order asked for both labels
    assert out["pair_side"].tolist() == [-1, -1, 1, 0]  # the chosen "77", then the rejected "78", appended
    s = out["pair_strength"].tolist()
    assert math.isnan(s[0]) and math.isnan(s[1]) and s[2:] == pytest.approx([p, p])  # both rows of the pair
    assert out["pair_reward"].tolist()[2:] == [1.0, 0.0]  # the run's reward is still carried (strength=reward reads it)
    assert inj.metrics["pairs/self_strength"] == pytest.approx(p)


def test_one_order_and_the_same_pairs_as_group_pairs():
    policy = _Policy()
    one = SelfJudgedPairs(pairs=1, request="J:{first}|{second}", both_orders=False).after_advantages(_ctx(policy), INPUTS, _batch())
    assert one["pair_strength"].tolist()[2:] == pytest.approx([_sig(1.2)] * 2) and policy.judged == ["J:77|78"] * 2
    plain = GroupPairs(pairs=1).after_advantages(_ctx(_Policy()), INPUTS, _batch())
    for key in ("completion_ids", "pair_side", "pair_reward", "pair_partner_reward", "pair_partner_logp", "pair_partner_ref_logp"):
        assert torch.allclose(one[key].double(), plain[key].double(), equal_nan=True), key  # strength=reward on these rows is the old osp exactly


def test_a_judgement_request_over_the_policys_context_is_one_line():
    inj = SelfJudgedPairs(pairs=1, request="J:{first}|{second}")
    with pytest.raises(UserFunctionError, match="over the policy's 6 positions") as e:
        inj.after_advantages(_ctx(_Policy(), max_positions=6), INPUTS, _batch())
    assert "\n" not in str(e.value)


def _osp(params, strength_value):
    """The osp term on one pair (chosen 2 tokens, rejected 3) with the stated pair_strength."""
    lp_w, lp_l, ref_w, ref_l = [-1.0, -2.0], [-0.5, -1.5, -1.0], [-1.2, -2.1], [-0.4, -1.0, -1.2]
    logp = torch.tensor([[*lp_w, 0.0], lp_l], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    rows = {"pair_index": torch.tensor([0, 0]), "pair_side": torch.tensor([1, 0]),
            "pair_partner_logp": torch.tensor([sum(lp_l), sum(lp_w)], dtype=torch.float64),
            "pair_partner_ref_logp": torch.tensor([sum(ref_l), sum(ref_w)], dtype=torch.float64),
            "pair_partner_len": torch.tensor([3.0, 2.0], dtype=torch.float64),
            "pair_reward": torch.tensor([1.0, 0.0]), "pair_partner_reward": torch.tensor([0.0, 1.0]),
            "pair_strength": torch.tensor([strength_value, strength_value])}
    ref = torch.tensor([[*ref_w, 0.0], ref_l], dtype=torch.float64)
    x = TermInputs(logp=logp, mask=mask, advantages=torch.zeros(2), behaviour_logp=logp.detach(), ref_logp=ref, rows=rows)
    out = TERMS.get("osp")(x, **params)
    value = AGGREGATIONS.get("seq-mean-token-sum")(out.per_token * mask, mask, num_items=2.0)
    value.backward()
    return float(value.detach()), logp.grad.clone(), out.metrics


def test_osp_with_the_self_judged_strength_by_hand():
    beta, p = 0.1, 0.3  # the policy judged the reward's chosen side worse: p < 1/2 pulls toward the rejected side
    h = beta * ((-3.0 - -3.3) - (-3.0 - -2.6))  # beta [Delta(y_w) - Delta(y_l)] = 0.1 (0.3 + 0.4)
    value, grad, metrics = _osp({"beta": beta, "strength": "self"}, p)
    assert value == pytest.approx(-p * math.log(_sig(h)) - (1 - p) * math.log(_sig(-h)))
    g = beta * (_sig(h) - p)  # dL/dh beta, on each chosen token; minus that on each rejected token
    assert grad.flatten().tolist() == pytest.approx([g, g, 0.0, -g, -g, -g])
    assert metrics["osp/strength"] == pytest.approx(p)
    # strength=reward ignores pair_strength: p = sigmoid((1 - 0) / 1)
    value_r, _, metrics_r = _osp({"beta": beta}, p)
    pr = _sig(1.0)
    assert value_r == pytest.approx(-pr * math.log(_sig(h)) - (1 - pr) * math.log(_sig(-h))) and metrics_r["osp/strength"] == pytest.approx(pr)


def test_the_preset_judges_its_own_pairs_and_bad_settings_are_one_line():
    cfg = compose_config(["algo=osp"])
    assert cfg.algo.inject.name == "self_judged_pairs" and cfg.algo.terms.osp.strength == "self"
    old = compose_config(["algo=osp", "algo.terms.osp.strength=reward"])  # the old reading: one override
    assert old.algo.terms.osp.strength == "reward"
    for overrides, match in [
        (["algo=osp", "algo.terms.osp.strength=judge"], "strength must be one of reward, self"),
        (["algo=osp", "algo.inject.name=group_pairs"], "only algo.inject.name=self_judged_pairs writes"),
        (["algo=osp", "algo.inject.request='{prompt} {first}'"], "must contain {first} and {second}"),
        (["algo=osp", "algo.inject.labels=[a,a]"], "two different non-empty answers"),
        (["algo=osp", "algo.inject.pairs=0"], "pairs"),
    ]:
        with pytest.raises(ConfigError, match=match) as e:
            compose_config(overrides)
        assert "\n" not in str(e.value)


@pytest.mark.slow  # a 2-step training (make test-slow); the mechanism is tested by hand above
def test_osp_toy_recipe_trains_two_steps_on_self_judged_strengths(tiny_bpe_model_path, tmp_path):
    from typer.testing import CliRunner

    from conftest import FAST
    from mixrl.cli.main import app

    res = CliRunner().invoke(app, ["train", "recipe=osp/arith-tiny", *FAST, f"model.path={tiny_bpe_model_path}",
                                   f"run_dir={tmp_path / 'run'}", "trainer.save_steps=0", "trainer.eval_size=0",
                                   "data.levels=[1]", "algo.num_generations=8"])  # easy problems, 8 tries: groups with a right and a wrong rollout
    assert res.exit_code == 0, (res.stdout + res.stderr)[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "pairs/on_policy" in r]
    assert len(train) == 2 and all(math.isfinite(r["loss/osp"]) for r in train)
    judged = [r["pairs/self_strength"] for r in train if "pairs/self_strength" in r]
    assert judged and all(0.0 < s < 1.0 for s in judged)  # a probability the policy gave, not a reward gap's
