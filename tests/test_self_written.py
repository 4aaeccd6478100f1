"""The policy writes its own context inside the step (issue 52): the builders' handle on the
policy (:mod:`mixrl.trainer.parts.policy_calls`), SAGE's self-hints (``hint: self``) and the
self-critique of a failed attempt (``feedback: self``), on a stand-in context with values by hand.

SAGE (BaohaoLiao/SAGE @ 8722c1a3aa5bfe5578df8aaf302741a9715a56a2, recipe/hint/hint_trainer.py): only
groups with no correct rollout are hinted (lines 690-719), the hint is sampled by the policy from the
problem and its solution and decoded to text (196-265: it never enters the training batch, so its
tokens are not trained), levels 1..3 are tried while the group fails (763-819), and the regenerated
group is trained under the hinted prompt (run_rollout re-tokenises it, 608-678).
"""

from __future__ import annotations

import contextlib
import json
import math
import random

import pytest
import torch

from mixrl.config.builders import build_injection
from mixrl.config.compose import compose_config
from mixrl.core import ADVANTAGES
from mixrl.errors import ConfigError, UserFunctionError
from mixrl.sources import InjectContext, Rollouts
from mixrl.core import provenance as prov
from mixrl.sources.feedback import Attempt, SelfCritique, call_builder
from mixrl.sources.hint import HintOnFailure
from mixrl.sources.self_hint import in_last_user
from mixrl.sources.with_feedback import REFINED, RefineFromFeedback
from mixrl.sources.with_verification import VERIFICATION, SelfVerify, spread, verification_reward
from mixrl.trainer.parts.policy_calls import PolicyCalls


from char_tokens import CharTokenizer as _Tok  # tests/char_tokens.py (tests/ is on sys.path under pytest)
from char_tokens import char_ids as _ids
from char_tokens import char_text as _text


def _lp(prompts, comps):
    """A stand-in behaviour forward: -0.01 x (context length) per token."""
    return [[-0.01 * len(p)] * len(c) for p, c in zip(prompts, comps)]


class _Source:
    def __init__(self, sols):
        self.sols = sols

    def for_prompt(self, row):
        return self.sols


def _ctx(answer, *, G=4, max_positions=None, log=None):
    """A stand-in context on one process: ``answer(prompt_text) -> completion text`` is what the
    policy samples; every generation and behaviour forward is recorded."""
    seen = {"generate": [], "forward": []}

    def generate(prompts):
        seen["generate"].append([_text(p) for p in prompts])
        return [_ids(answer(_text(p))) for p in prompts], None

    def behaviour(prompts, comps):
        seen["forward"].append((list(prompts), list(comps)))
        return _lp(prompts, comps)

    tok = _Tok()
    tokenize = lambda ps: [_ids(p if isinstance(p, str) else "".join(m["content"] for m in p)) for p in ps]  # noqa: E731
    ctx = InjectContext(tokenizer=tok, process_index=0, num_processes=1, num_generations=G, max_completion_length=8,
                        global_step=0, micro_step=0, device=torch.device("cpu"), tokenize_prompts=tokenize,
                        gather=lambda t: t, generate=generate, behaviour_logps=behaviour, max_positions=max_positions,
                        score=lambda inputs, comps: torch.tensor([[1.0 if _text(c) == "#19" else 0.0] for c in comps]),
                        log=(lambda k, v: log.__setitem__(k, v)) if log is not None else None)
    ctx.policy_calls = lambda who: PolicyCalls(who=who, tokenizer=tok, tokenize_prompts=tokenize, generate=generate,
                                               behaviour_logps=behaviour, max_new_tokens=8, max_positions=max_positions)
    return ctx, seen


def _rollouts(comps):
    return Rollouts([_ids(c) for c in comps], None, [prov.ON_POLICY] * len(comps), prompt_ids=[_ids("9+10=")] * len(comps))


ROW = {"prompt": "9+10=", "answer": "19"}


# ----------------------------------------------------------------------------- the handle
def test_policy_calls_write_record_behaviour_and_sync_with_the_process_that_called_most():
    ctx, seen = _ctx(lambda p: "abcdefghijk")
    calls = PolicyCalls(who="algo.inject.feedback='x'", tokenizer=_Tok(), tokenize_prompts=ctx.tokenize_prompts,
                        generate=ctx.generate, behaviour_logps=ctx.behaviour_logps, max_new_tokens=8, max_positions=20,
                        limit=lambda n: contextlib.nullcontext(seen.setdefault("limit", n)))
    w = calls.write("req?", max_new_tokens=5)
    assert (w.text, w.context_ids, w.ids) == ("abcde", _ids("req?"), _ids("abcde"))  # cut to 5 tokens
    assert seen["limit"] == 5 and w.behaviour_logp == pytest.approx([-0.04] * 5)  # recorded under the request (4 tokens)
    assert seen["forward"] == [([_ids("req?")], [_ids("abcde")])]
    assert calls.metrics("x") == {"x/self_written_calls": 1.0, "x/self_written_tokens": 5.0}
    # another process called the policy 3 times: this one joins 2 empty generations and forwards
    calls.sync(lambda t: torch.tensor([1, 3]))
    assert seen["generate"][1:] == [[], []] and seen["forward"][1:] == [([], []), ([], [])]
    with pytest.raises(UserFunctionError, match=r"^algo.inject.feedback='x' asked the policy to write 8 tokens after a request of 14 tokens.*20 positions") as e:
        calls.write("a long request")
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- SAGE
def test_sage_self_hint_regenerates_a_failed_group_under_the_hinted_prompt_levels_in_turn():
    """Group of 4, all wrong. Level 1: the policy writes hint "h1" from the problem and its solution;
    the 4 rows regenerate with "9+10= h1" and all still fail. Level 2: hint "h2", row 0 answers "#19".
    The rows are ordinary rollouts of the hinted prompt: prompt_ids = "9+10= h2", every completion
    token on_policy (the hint is not in the completion, not trained), no stored behaviour (pi_old is
    the policy under the hinted prompt), GRPO advantage over the regenerated group by hand."""
    state = {"solved": False}

    def answer(p):
        if p.endswith("hint:"):  # the hint request "... L<level> hint:"
            return "h" + p[-7]
        if p == "9+10= h2" and not state["solved"]:  # the first row regenerated with the level-2 hint
            state["solved"] = True
            return "#19"
        return "#7"
    logs = {}
    ctx, seen = _ctx(answer, log=logs)
    inj = HintOnFailure(hint="self", levels=3, request="{prompt} {solution} L{level} hint:", template="{prompt} {hint}",
                        train_under="hinted", hint_tokens=4, source=_Source(["10+9=19"]))
    r = inj.after_generation(ctx, [ROW] * 4, _rollouts(["#1", "#2", "#3", "#4"]))
    gens = seen["generate"]
    assert gens[0] == ["9+10= 10+9=19 L1 hint:"]  # one hint for the group, from the problem and its solution
    assert gens[1] == ["9+10= h1"] * 4  # the whole group again, the hint after the problem
    assert gens[2] == ["9+10= 10+9=19 L2 hint:"] and gens[3] == ["9+10= h2"] * 4
    assert len(gens) == 4  # level 3 is not asked: the group has a correct rollout
    assert [_text(c) for c in r.completion_ids] == ["#19", "#7", "#7", "#7"]
    assert r.prompt_ids == [_ids("9+10= h2")] * 4 and r.token_source == [None] * 4 and r.behaviour_logp == [None] * 4
    assert r.guided == [2] * 4 and r.discarded_tokens == [2] * 4 + [2] * 4
    # the hint was recorded with its behaviour log-probs under the request (22 tokens)
    assert seen["forward"][1] == ([_ids("9+10= 10+9=19 L2 hint:")], [_ids("h2")])
    assert logs["hint/self_written_tokens"] == 4.0 and logs["hint/rounds"] == 2.0  # "h1" and "h2"; 2 levels
    # advantage: GRPO over the regenerated group, A = (r - 1/4) / (std_unbiased + 1e-6), std = 0.5
    A = ADVANTAGES.get("grpo")(torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.tensor([0, 0, 0, 0]))
    assert A.tolist() == pytest.approx([0.75 / (0.5 + 1e-6), -0.25 / (0.5 + 1e-6), -0.25 / (0.5 + 1e-6), -0.25 / (0.5 + 1e-6)])


def test_sage_leaves_groups_with_a_correct_rollout_alone_and_refuses_bad_settings():
    ctx, seen = _ctx(lambda p: "#7")
    inj = HintOnFailure(hint="self", request="{prompt} {solution} hint:", template="{prompt} {hint}", source=_Source(["s"]))
    r = inj.after_generation(ctx, [ROW] * 4, _rollouts(["#19", "#1", "#2", "#3"]))
    # no group failed (read from the gathered rewards, the same on every process): no hint, no generation
    assert seen["generate"] == [] and r.prompt_ids == [_ids("9+10=")] * 4 and r.guided == [0] * 4
    with pytest.raises(ConfigError, match="placement=prompt"):
        HintOnFailure(hint="self", placement="prefix")
    with pytest.raises(ConfigError, match="unknown placeholder"):
        HintOnFailure(hint="self", request="{prompt} {answer}")
    with pytest.raises(ConfigError, match="levels"):
        HintOnFailure(hint="self", levels=0)


def test_sage_a_hinted_prompt_with_no_room_for_the_completion_is_one_line():
    ctx, _ = _ctx(lambda p: "hhhh", max_positions=17)  # the request (10) + the hint (4) fit; "9+10= hhhh" (10) + 8 do not
    inj = HintOnFailure(hint="self", request="{prompt}hint:", template="{prompt} {hint}", hint_tokens=4, source=_Source(["s"]))
    with pytest.raises(UserFunctionError, match=r"^algo.inject.hint='self': the prompt with the policy's hint is 10 tokens.*17 positions"):
        inj.after_generation(ctx, [ROW] * 4, _rollouts(["#1", "#2", "#3", "#4"]))


def test_the_sage_preset_and_toy_recipe_compose_and_train_the_hinted_rows_as_rollouts():
    cfg = compose_config(["algo=sage"])
    inj = build_injection(cfg)
    assert (inj.hint, inj.fractions, inj.train_under, inj.max_success, inj.per_group) == ("self", [1.0, 2.0, 3.0], "hinted", 0.0, None)
    assert inj.provenances == () and list(cfg.algo.terms.policy.tokens) == ["on_policy"]
    assert (cfg.algo.loss.clip_low, cfg.algo.loss.clip_high, cfg.algo.advantage.name) == (0.2, 0.28, "grpo")
    toy = compose_config(["recipe=sage/arith-tiny"])
    assert toy.model.name == "tiny-bpe" and toy.algo.inject.hint_tokens == 16


# ----------------------------------------------------------------------------- self-critique
def test_self_critique_is_written_by_the_policy_and_the_refinement_trains_under_the_original_prompt():
    """feedback: self: the policy critiques the failed attempt (slot 1) from the request; the
    refinement, sampled in the critique context, fills slot 3 under the original prompt, tokens refined,
    behaviour recorded under the refinement context; the critique itself is context, not trained."""
    ctx, seen = _ctx(lambda p: "bad" if p.endswith("?") else "#19")
    inj = RefineFromFeedback(feedback="self", request="{prompt}|{attempt}|{expected}?", template="{prompt}|{feedback}|")
    r = inj.after_generation(ctx, [ROW] * 4, _rollouts(["#19", "#18", "#1", "#2"]))
    assert seen["generate"] == [["9+10=|#18|19?"], ["9+10=|bad|"]]
    assert _text(r.completion_ids[3]) == "#19" and r.token_source[3] == [REFINED] * 3
    assert r.prompt_ids[3] == _ids("9+10=") and r.behaviour_logp[3] == pytest.approx([-0.01 * len("9+10=|bad|")] * 3)
    assert r.completion_ids[1] == _ids("#18") and r.token_source[1] is None  # the attempt stays


def test_refine_all_offers_the_policy_to_a_custom_builder_and_refuses_the_self_critique():
    """refine: all (Critique-GRPO's every-rollout refinement): a module:function builder gets the
    policy's handle for every attempt, the right one too (attempt.correct); the four refinements
    score 1, so the first (attempt 0's) fills slot 0. feedback: self asks for an attempt's error,
    which a right attempt has not: refused at construction."""
    ctx, seen = _ctx(lambda p: "bad" if p.endswith("?") else "#19")
    inj = RefineFromFeedback(refine="all", template="{prompt}|{feedback}|")
    told = []

    def judge(a):
        told.append(a.correct)
        return a.policy.write(a.completion + "?").text

    inj.builder, inj.feedback_name = judge, "j.py:f"
    r = inj.after_generation(ctx, [ROW] * 4, _rollouts(["#19", "#18", "#1", "#2"]))
    assert seen["generate"] == [["#19?"], ["#18?"], ["#1?"], ["#2?"], ["9+10=|bad|"] * 4] and told == [True, False, False, False]
    assert _text(r.completion_ids[0]) == "#19" and r.token_source[0] == [REFINED] * 3 and r.guided == [2, 0, 0, 0]
    with pytest.raises(ConfigError, match="refine=all .*feedback=self"):
        RefineFromFeedback(refine="all", feedback="self")


def test_a_custom_builder_may_call_the_policy_and_its_errors_are_one_line():
    ctx, seen = _ctx(lambda p: "crit")
    calls = ctx.policy_calls("algo.inject.feedback='judge.py:fn'")
    att = Attempt(prompt="9+10=", completion="#18", completion_ids=_ids("#18"), reward=0.0, answer="19", reference=None,
                  row=ROW, policy=calls)
    fb = call_builder(lambda a: a.policy.write("why " + a.completion).text.upper(), "x", att)
    assert fb.text == "CRIT" and seen["generate"] == [["why #18"]]
    with pytest.raises(UserFunctionError, match=r"returned .*not feedback; it must return Feedback"):
        call_builder(lambda a: 3, "algo.inject.feedback='j.py:f'", att)
    with pytest.raises(UserFunctionError, match=r"raised RuntimeError: feedback: self needs the policy"):
        call_builder(SelfCritique(), "algo.inject.feedback='self'", Attempt("p", "c", [1], 0.0, "1", None, {}))
    with pytest.raises(ConfigError, match=r"\{attempt\}"):
        SelfCritique(request="{prompt} critique:")
    assert in_last_user([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}], "{prompt}!{x}", x=1)[1] == \
        {"role": "user", "content": "Q!1"}


# ----------------------------------------------------------------------------- end to end
def test_sage_toy_recipe_trains_two_steps_with_the_policy_writing_hints(tiny_bpe_model_path, tmp_path):
    """Level-4 problems (beyond the barely warm-started model): every group fails, the policy writes
    a hint per group and level, the groups are generated again with it, and training goes on."""
    from typer.testing import CliRunner

    from mixrl.cli.main import app
    from conftest import FAST

    res = CliRunner().invoke(app, ["train", "recipe=sage/arith-tiny", *FAST, f"model.path={tiny_bpe_model_path}",
                                   f"run_dir={tmp_path / 'run'}", "data.levels=[4]", "trainer.save_steps=0"])
    assert res.exit_code == 0, res.stdout[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "hint/rounds" in r]
    assert len(train) == 2 and all(r["hint/groups"] > 0 and r["hint/self_written_tokens"] > 0 for r in train)


# ----------------------------------------------------------------------------- RISE
def test_rise_verification_reward_and_the_authors_spread_by_hand():
    vr = lambda t, s: verification_reward(t, s, "####", 1.0, -0.5, -1.0)  # noqa: E731
    assert (vr("ok #### 1", 1.0), vr("#### 1.0", 1.0), vr("#### -0.5", 1.0), vr("#### 0", 0.0), vr("no rating", 0.0),
            vr("#### x", 0.0)) == (1.0, 1.0, -0.5, 1.0, -1.0, -1.0)
    rng = random.Random(0)
    picks = spread([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]], 4, rng)  # 4 // 3 = 1 each, the first group one more
    assert len(picks) == 4 and sum(p < 4 for p in picks) == 2 and sum(4 <= p < 8 for p in picks) == 1


def test_rise_appends_the_policys_verifications_with_their_reward_and_group_advantage():
    """2 groups of 4: group 0's solutions are right (score 1), group 1's wrong (score 0);
    solutions=2 -> one solution per group, verifications=3 -> the policy writes "#### 1",
    "#### 0" and "none" for each. Rewards: group 0 [1, -0.5, -1], group 1 [-0.5, 1, -1];
    A = (r - mean) / (std + 1e-6) per solution; rows appended under the request, provenance
    verification, behaviour log-probs recorded under the request."""
    ans = ["#### 1", "#### 0", "none"]
    ctx, seen = _ctx(lambda p: "")
    tok = _Tok()
    tokenize = ctx.tokenize_prompts

    def generate(prompts):
        seen["generate"].append([_text(p) for p in prompts])
        return [_ids(ans[j % 3]) for j in range(len(prompts))], None

    ctx.generate = generate
    ctx.policy_calls = lambda who: PolicyCalls(who=who, tokenizer=tok, tokenize_prompts=tokenize, generate=generate,
                                               behaviour_logps=_lp, max_new_tokens=8)
    comps = ["#19", "#19", "#19", "#19", "#7", "#8", "#9", "#6"]
    rows = [{"prompt": "9+10="}] * 4 + [{"prompt": "1+2="}] * 4
    inj = SelfVerify(solutions=2, verifications=3, request="{prompt}{solution}?")
    ctx.primary_rewards = torch.tensor([1.0] * 4 + [0.0] * 4)
    inj.after_rewards(ctx, rows, torch.zeros(8))
    C = max(len(c) for c in comps)
    out = {"prompt_ids": torch.ones(8, 2, dtype=torch.long), "prompt_mask": torch.ones(8, 2, dtype=torch.long),
           "completion_ids": torch.tensor([_ids(c) + [0] * (C - len(c)) for c in comps]),
           "completion_mask": torch.tensor([[1] * len(c) + [0] * (C - len(c)) for c in comps]),
           "token_source": torch.zeros(8, C, dtype=torch.long), "advantages": torch.zeros(8),
           "row_source": torch.full((8,), prov.ON_POLICY), "group_id": torch.tensor([0] * 4 + [1] * 4),
           "behaviour_logp": torch.full((8, C), float("nan"))}
    new = inj.after_advantages(ctx, rows, out)
    req0 = seen["generate"][0]
    assert len(req0) == 6 and req0[:3] == ["9+10=#19?"] * 3 and req0[3] in (["1+2=#7?", "1+2=#8?", "1+2=#9?", "1+2=#6?"])
    assert new["row_source"][8:].tolist() == [VERIFICATION] * 6 and new["group_id"][8:].tolist() == [-1] * 6
    r0, r1 = [1.0, -0.5, -1.0], [-0.5, 1.0, -1.0]

    def grpo(r):
        m = sum(r) / 3
        s = math.sqrt(sum((x - m) ** 2 for x in r) / 2)
        return [(x - m) / (s + 1e-6) for x in r]

    assert new["advantages"][8:].tolist() == pytest.approx(grpo(r0) + grpo(r1))
    assert new["advantages"][:8].tolist() == [0.0] * 8  # the solutions keep theirs
    assert new["completion_ids"][8][:6].tolist() == _ids("#### 1") and new["prompt_ids"][8][-9:].tolist() == _ids("9+10=#19?")
    assert new["behaviour_logp"][8][:6].tolist() == pytest.approx([-0.09] * 6)  # recorded under the 9-token request
    assert new["behaviour_logp"][10][:4].tolist() == pytest.approx([-0.09] * 4) and math.isnan(new["behaviour_logp"][10][4])
    assert inj.metrics["verify/right"] == pytest.approx(2 / 6) and inj.metrics["verify/missing"] == pytest.approx(2 / 6)


def test_the_rise_preset_composes_and_refuses_bad_settings():
    cfg = compose_config(["algo=rise"])
    inj = build_injection(cfg)
    assert (inj.solutions, inj.verifications, inj.right, inj.wrong, inj.missing) == (16, 8, 1.0, -0.5, -1.0)
    assert list(cfg.algo.terms.policy.tokens) == ["on_policy", "verification"]
    with pytest.raises(ConfigError, match="solutions=100000 is more than"):
        compose_config(["algo=rise", "algo.inject.solutions=100000"])
    with pytest.raises(ConfigError, match=r"must contain \{solution\}"):
        compose_config(["algo=rise", "algo.inject.request='{prompt} rate:'"])
    with pytest.raises(ConfigError, match="verification"):  # the verifications must be trained
        compose_config(["algo=rise", "algo.terms.policy.tokens=[on_policy]"])


def test_rise_toy_recipe_trains_two_steps_with_the_policys_verifications(tiny_bpe_model_path, tmp_path):
    from typer.testing import CliRunner

    from conftest import FAST
    from mixrl.cli.main import app

    res = CliRunner().invoke(app, ["train", "recipe=rise/arith-tiny", *FAST, f"model.path={tiny_bpe_model_path}",
                                   f"run_dir={tmp_path / 'run'}", "trainer.save_steps=0", "trainer.eval_size=0"])
    assert res.exit_code == 0, res.stdout[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "verify/reward" in r]
    # 4 solutions x 4 verifications appended each step, every reward one of 1 / -0.5 / -1
    assert len(train) == 2 and all(r["verification/rows"] == 16 and -1.0 <= r["verify/reward"] <= 1.0 for r in train)


# ----------------------------------------------------------------------------- R3L's trained reflections
def _r3l(retry_answer):
    def answer(p):
        if p.endswith("?"):  # a reflection request "<prompt>|<attempt>?"
            return "success" if p.endswith("#19?") else "fix"
        return retry_answer if p == "9+10=|fix|" else "#7"
    return answer


def _out(comps):
    C = max(len(c) for c in comps)
    n = len(comps)
    return {"prompt_ids": torch.ones(n, 2, dtype=torch.long), "prompt_mask": torch.ones(n, 2, dtype=torch.long),
            "completion_ids": torch.tensor([_ids(c) + [0] * (C - len(c)) for c in comps]),
            "completion_mask": torch.tensor([[1] * len(c) + [0] * (C - len(c)) for c in comps]),
            "token_source": torch.zeros(n, C, dtype=torch.long), "advantages": torch.zeros(n),
            "row_source": torch.full((n,), prov.ON_POLICY), "group_id": torch.zeros(n, dtype=torch.long),
            "behaviour_logp": torch.full((n, C), float("nan"))}


def test_r3l_reflections_that_rate_a_correct_attempt_perfect_or_guide_a_successful_retry_are_trained_with_a_1():
    """Group of 4: "#19" right, "#18", "#1", "#2" wrong. The policy reflects on the correct attempt
    ("9+10=|#19?" -> "success": rated perfect, kept) and on the failed attempt 1 ("9+10=|#18?" ->
    "fix"), whose retry in the context "9+10=|fix|" answers "#19" (right, better than the attempt: kept).
    Both reflections are appended as rows of their request with advantage 1, provenance reflection."""
    ctx, seen = _ctx(_r3l("#19"))
    inj = RefineFromFeedback(mode="retry", pivot="start", feedback="self", request="{prompt}|{attempt}?",
                             template="{prompt}|{feedback}|", train_reflections=4, reflect_correct=True, perfect="success",
                             critique_tokens=8)
    comps = ["#19", "#18", "#1", "#2"]
    r = inj.after_generation(ctx, [ROW] * 4, _rollouts(comps))
    assert seen["generate"][:2] == [["9+10=|#18?"], ["9+10=|#19?"]]  # the failed attempt's reflection, then the correct one's
    assert seen["generate"][2] == ["9+10=|fix|"] and _text(r.completion_ids[3]) == "#19"  # the retry, guided by the reflection
    new = inj.after_advantages(ctx, [ROW] * 4, _out([_text(c) for c in r.completion_ids]))
    assert new["row_source"][4:].tolist() == [prov.code("reflection")] * 2
    assert new["advantages"][4:].tolist() == [1.0, 1.0] and new["advantages"][:4].tolist() == [0.0] * 4
    assert [_text(new["completion_ids"][i].tolist()) for i in (4, 5)] == ["success", "fix"]
    assert new["prompt_ids"][4][-len("9+10=|#19?"):].tolist() == _ids("9+10=|#19?")
    assert new["behaviour_logp"][5][:3].tolist() == pytest.approx([-0.1] * 3)  # recorded under the 10-token request
    assert inj.metrics == {"refine/reflections_trained": 2.0}
    assert inj.provenances == ("refined", "prefix", "reflection") and inj.extra_rows_per_step(16, 2) == 4


def test_r3l_a_reflection_whose_retry_fails_is_not_trained_and_bad_settings_are_one_line():
    ctx, _ = _ctx(_r3l("#7"))
    inj = RefineFromFeedback(mode="retry", pivot="start", feedback="self", request="{prompt}|{attempt}?",
                             template="{prompt}|{feedback}|", train_reflections=2, critique_tokens=8)
    r = inj.after_generation(ctx, [ROW] * 4, _rollouts(["#19", "#18", "#1", "#2"]))
    new = inj.after_advantages(ctx, [ROW] * 4, _out([_text(c) for c in r.completion_ids]))
    assert len(new["row_source"]) == 4 and inj.metrics == {"refine/reflections_trained": 0.0}
    with pytest.raises(ConfigError, match="is not written by the policy"):
        RefineFromFeedback(feedback="verifier", train_reflections=2)
    with pytest.raises(ConfigError, match="set algo.inject.train_reflections > 0"):
        RefineFromFeedback(feedback="self", reflect_correct=True)
    with pytest.raises(ConfigError, match="must be a multiple of 4"):
        inj.extra_rows_per_step(16, 4)
    cfg = compose_config(["algo=r3l"])
    r3 = build_injection(cfg)
    assert (r3.feedback_name, r3.reflections.cap, r3.reflections.correct) == ("self", 8, True)
    assert "reflection" in list(cfg.algo.terms.policy.tokens)
    old = compose_config(["algo=r3l", "algo.inject.feedback=verifier", "algo.inject.train_reflections=0",
                          "algo.inject.reflect_correct=false", "algo.terms.policy.tokens=[on_policy,refined]"])
    assert build_injection(old).provenances == ("refined", "prefix")  # the earlier preset, by override


def test_trained_self_written_rows_longer_than_the_completion_budget_are_one_line():
    ctx, _ = _ctx(lambda p: "x")  # max_completion_length 8
    inj = RefineFromFeedback(feedback="self", request="{prompt}{attempt}?", train_reflections=2, critique_tokens=9)
    with pytest.raises(ConfigError, match=r"^algo.inject.critique_tokens=9 is more than trainer.max_completion_length=8"):
        inj.after_generation(ctx, [ROW] * 4, _rollouts(["#1", "#2", "#3", "#4"]))
    with pytest.raises(ConfigError, match=r"^algo.inject.verify_tokens=9 is more than trainer.max_completion_length=8"):
        SelfVerify(solutions=1, verifications=1, request="{prompt}{solution}", verify_tokens=9).after_advantages(ctx, [ROW], {})
