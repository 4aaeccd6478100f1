"""CAPO (``algo=capo reward=process reward.params.scorer=genprm``): a generative PRM's critiques of the whole solution, voted per step,
become token penalties that reach the group advantage token by token (critic-free). Values by hand.

Paper: "CAPO: Towards Enhancing LLM Reasoning through Generative Credit Assignment" (arXiv 2508.02298).
No authors' code is published; the voting rules are those named in their overview figure
(andyclsr/CAPO @ 95b8f3492234fea145d1e94ef4eb04e9468fa9bc, capo_overview.png: critiques [1,3], [1,2,3],
[1,3], [2,3] voted to [1,3]).
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from omegaconf import OmegaConf

from mixrl.config.compose import compose_config
from mixrl.core import ADVANTAGES
from mixrl.core.step_votes import parse_wrong_steps, vote
from mixrl.errors import ConfigError, RewardError
from mixrl.rewards.registry import build_reward
from mixrl.rewards.protocol import RewardContext
from mixrl.trainer.parts.token_credit import local_token_credit

FIGURE = [{1, 3}, {1, 2, 3}, {1, 3}, {2, 3}]  # the authors' overview figure's four critiques of a 4-step solution


def test_the_figures_critiques_voted_by_each_rule_by_hand():
    # the numbers are step numbers as the question shows them (from 1 here; the figure counts from 0):
    # step 1 named by 3 of 4 critiques, step 2 by 2 of 4, step 3 by 4 of 4, step 4 by none
    assert vote(FIGURE, 4, "majority") == [1.0, 0.0, 1.0, 0.0]  # more than 2 of 4: steps 1 and 3, the figure's [1,3]
    assert vote(FIGURE, 4, "union") == [1.0, 1.0, 1.0, 0.0]
    assert vote(FIGURE, 4, "intersect") == [0.0, 0.0, 1.0, 0.0]
    assert vote(FIGURE, 4, "average") == [0.75, 0.5, 1.0, 0.0]


def test_an_unparsable_critique_abstains_and_a_tie_is_no_majority():
    assert vote([None, {2}, {2}], 3, "majority") == [0.0, 1.0, 0.0]  # 2 of the 2 parsable critiques
    assert vote([{1}, {2}], 2, "majority") == [0.0, 0.0]  # 1 of 2 is not more than half
    assert vote([None, None], 2, "union") == [0.0, 0.0]  # nobody judged: no penalty
    assert parse_wrong_steps("I think Wrong steps: [2, 4, 9]", 4) == {2, 4}  # 9 is not a step of 4
    assert parse_wrong_steps("wrong steps: none", 4) == set()
    assert parse_wrong_steps("step 2 is off", 4) is None


class _CharTok:  # token k is character k: token ends are 1, 2, 3, ...
    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def _critic(replies: dict[str, list[str]]):
    """A stand-in GenPRM: the critiques of each solution (found by its step 2) in turn."""
    asked: list[str] = []
    turn: dict[str, int] = {}

    def ask(texts):
        out = []
        for t in texts:
            asked.append(t)
            key = re.search(r"Step 2: (\S+)", t).group(1)
            k = turn.get(key, 0)
            turn[key] = k + 1
            out.append(replies[key][k])
        return out

    return ask, asked


def test_capo_token_rewards_and_per_token_group_advantage_by_hand():
    """Two rollouts of 1+2+4= (answer 7), steps cut after each space:
    row 0 "3 7 #### 7" (right), critiques none, none, none, [2]: step 2 named once of 4, no majority;
    row 1 "3 8 #### 8" (wrong), critiques [2, 4], [2], unparsable, [2,4]: of the 3 parsable, step 2 by 3, step 4 by 2 (> 1.5).
    Row 1's steps "3 ", "8 ", "#### ", "8" own characters 0-1, 2-3, 4-8, 9: penalties on tokens 2, 3 and 9."""
    fn = build_reward("process", scorer="genprm", separator=" ", scorer_params={"backend": "endpoint", "url": "http://x"},
                      context=RewardContext(tokenizer=_CharTok()))  # the policy's tokenizer, given at construction
    ask, asked = _critic({"7": ["Wrong steps: none"] * 3 + ["Wrong steps: [2]"],
                          "8": ["Wrong steps: [2, 4]", "Wrong steps: [2]", "no idea", "Wrong steps: [2,4]"]})
    fn.fn.scorer.ask = ask
    texts = ["3 7 #### 7", "3 8 #### 8"]
    ids = [[ord(c) for c in t] for t in texts]
    logged = {}
    sums = fn(prompts=["1+2+4="] * 2, completions=texts, completion_ids=ids, answer=["7", "7"],
              log_metric=lambda k, v: logged.__setitem__(k, v))
    dense = fn.last_dense  # the per-token lists; the trainer's reward is each row's sum
    assert sums == [1.0, -3.0]
    assert len(asked) == 8 and asked[0] == asked[3] and "Step 1: 3\nStep 2: 7\nStep 3: ####\nStep 4: 7" in asked[0]
    assert dense[0] == [0.0] * 9 + [1.0]  # the outcome 1 on the last token, no step penalty
    assert dense[1] == [0, 0, -1, -1, 0, 0, 0, 0, 0, -1]  # W_process = 1 on every token of steps 2 and 4; outcome 0
    assert logged["process/unparsable"] == 1.0 and logged["process/wrong_step_frac"] == pytest.approx(2 / 8)

    mask = torch.ones(2, 10, dtype=torch.long)
    credit = local_token_credit([fn], torch.tensor([1.0]), mask)
    assert credit[0].tolist() == [0.0] * 10 and credit[1].tolist() == [0, 0, -1, -1, 0, 0, 0, 0, 0, -1]
    rewards = torch.tensor(sums)
    adv = ADVANTAGES.get("capo")(rewards, torch.tensor([0, 0]), token_credit=credit, mask=mask, eps=1e-6)
    # Q: row 0 all 1 (its outcome); row 1 = (-3 - (-3)) + C_t: 0, or -1 on the 3 wrong tokens. Over the 20 tokens:
    q = [1.0] * 10 + [0, 0, -1, -1, 0, 0, 0, 0, 0, -1]
    mean = sum(q) / 20  # 0.35
    std = math.sqrt(sum((v - mean) ** 2 for v in q) / 19)
    assert adv.flatten().tolist() == pytest.approx([(v - mean) / (std + 1e-6) for v in q], abs=1e-6)
    assert adv[1, 2] < adv[1, 0] < adv[0, 0]  # a wrong step's token is pushed down more than the row's other tokens


@pytest.mark.parametrize("params, match", [
    ({"votes": 0}, "votes=0 must be >= 1"),
    ({"vote": "mode"}, "vote='mode' is not one of"),
    ({"votes": 3, "temperature": 0.0}, "votes would be copies"),
    ({"template": "{prompt} {completion}"}, "no {steps} field"),
])
def test_bad_genprm_settings_are_one_line(params, match):
    with pytest.raises(ConfigError, match=match) as e:
        build_reward("process", scorer="genprm", scorer_params=params)
    assert "\n" not in str(e.value)


def test_the_preset_composes_with_its_reward_and_a_bad_vote_count_is_refused():
    cfg = compose_config(["algo=capo", "reward=process", "reward.params.scorer=genprm"])
    assert cfg.algo.advantage.name == "capo" and cfg.reward.name == "process" and cfg.reward.params.scorer == "genprm"
    scorer = build_reward("process", **OmegaConf.to_container(cfg.reward.params)).fn.scorer
    assert (scorer.votes, scorer.vote, scorer.temperature) == (4, "majority", 0.7)  # the scorer's defaults
    for extra, match in [(["reward.params.scorer_params.votes=0"], "votes=0 must be >= 1"),
                         (["reward.params.scorer_params.vots=3"], "the genprm scorer has no parameter 'vots' \\(did you mean: votes")]:
        with pytest.raises(ConfigError, match=match) as e:
            compose_config(["algo=capo", "reward=process", "reward.params.scorer=genprm", *extra])
        assert "\n" not in str(e.value)
    recipe = compose_config(["recipe=capo/arith-tiny"])
    assert recipe.reward.params.scorer == "genprm" and recipe.reward.params.scorer_params.votes == 4


def test_a_critique_question_over_the_local_judges_context_is_one_line(tiny_bpe_model_path):
    fn = build_reward("process", scorer="genprm", separator=" ", scorer_params={"path": tiny_bpe_model_path, "max_tokens": 120})
    with pytest.raises(RewardError, match="over the judge's 128 positions") as e:
        fn(prompts=["1+2+4="], completions=["3 7 #### 7"], answer=["7"])
    assert "\n" not in str(e.value)


def _arith_critic(text: str) -> str:
    """A GenPRM of the built-in task: a step is wrong when it is a number that is not the next running sum."""
    terms = [int(t) for t in re.search(r"(\d+(?:\+\d+)+)", text).group(1).split("+")]
    steps = re.findall(r"Step (\d+): (.*)", text)
    sums = [sum(terms[:k + 2]) for k in range(len(terms) - 1)]
    wrong = [int(j) for j, s in steps if s.strip().isdigit() and (int(j) > len(sums) or int(s) != sums[int(j) - 1])]
    return f"Wrong steps: {wrong}"


@pytest.mark.slow  # a 2-step training (make test-slow); the mechanism is tested by hand above
def test_capo_toy_recipe_trains_two_steps_with_token_penalties(tiny_bpe_model_path, tmp_path):
    """The toy recipe with a stand-in GenPRM endpoint that checks the running sums: its critiques parse,
    some steps are voted wrong, and the run trains."""
    from typer.testing import CliRunner

    from conftest import FAST
    from judge_stand_in import serve
    from mixrl.cli.main import app

    url, server = serve(_arith_critic)
    try:
        res = CliRunner().invoke(app, ["train", "recipe=capo/arith-tiny", *FAST, f"model.path={tiny_bpe_model_path}",
                                       f"run_dir={tmp_path / 'run'}", "trainer.save_steps=0", "trainer.eval_size=0",
                                       f"+reward.params.scorer_params.url={url}",
                                       "reward.params.scorer_params.template='Problem: {prompt}\n{steps}'",
                                       "reward.params.scorer_params.pattern='(?i)wrong steps: *(\\[[^\\]]*\\])'"])
    finally:
        server.shutdown()
    assert res.exit_code == 0, (res.stdout + res.stderr)[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "process/unparsable" in r]
    assert len(train) == 2 and all(r["process/unparsable"] == 0 and math.isfinite(r["loss"]) for r in train)
    assert any(r["process/wrong_step_frac"] > 0 for r in train)


def test_explain_names_the_vote():
    from typer.testing import CliRunner

    from mixrl.cli.main import app

    res = CliRunner().invoke(app, ["explain", "algo=capo", "reward=process", "reward.params.scorer=genprm",
                                   "reward.params.scorer_params.vote=union"])
    assert res.exit_code == 0, res.stdout[-1500:]
    text = " ".join(res.stdout.split())
    assert "s_j = 1 - [c_j >= 1] (union vote)" in text and "critic-free (advantage capo)" in text
