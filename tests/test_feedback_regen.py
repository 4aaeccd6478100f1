"""Rollouts regenerated from feedback (Critique-GRPO, R³L): the feedback builders, the
``refine`` injection on a stand-in context, R³L's Positive Amplification against values by
hand and the authors' rule, and the configs."""

from __future__ import annotations

import math

import pytest
import torch

from mixrl.config.builders import build_injection
from mixrl.config.compose import compose_config
from mixrl.core import ADVANTAGES
from mixrl.core import provenance as prov
from mixrl.core.terms import TERMS, TermInputs
from mixrl.errors import ConfigError
from mixrl.sources import InjectContext, Rollouts
from mixrl.sources.feedback import Attempt, Feedback, HintFeedback, IndicativeFeedback, VerifierFeedback, build_feedback, divergence
from mixrl.sources.prefix import PREFIX
from mixrl.sources.refine_all import keep_best
from mixrl.sources.with_feedback import REFINED, RefineFromFeedback, plan_pairs, refine_context


# ----------------------------------------------------------------------------- feedback builders
def _attempt(text, answer="19", reference="8 10 19 #### 19"):
    return Attempt(prompt="3+5+2+9=", completion=text, completion_ids=[ord(c) for c in text], reward=0.0,
                   answer=answer, reference=reference, row={})


def test_verifier_feedback_names_the_given_and_expected_answers_or_that_none_was_found():
    fb = VerifierFeedback()
    assert fb(_attempt("8 10 18 #### 18")).text == "The answer 18 is wrong; the expected answer is 19."
    assert fb(_attempt("8 10 18")).text == "No final answer was found; the expected answer is 19."
    assert fb(_attempt("#### 3", answer="x #### 4")).text == "The answer 3 is wrong; the expected answer is 4."  # a GSM8K gold
    assert fb(_attempt("#### 3", answer=None)) is None  # nothing to compare with: no feedback
    assert VerifierFeedback(wrong="#### {expected}")(_attempt("#### 3")).text == "#### 19"
    assert IndicativeFeedback()(_attempt("1")).text == "The answer is wrong."
    assert HintFeedback(fraction=0.5)(_attempt("1")).text == "A correct solution begins: 8 10 19 "  # round(0.5 x 15) = 8 characters
    assert HintFeedback()(_attempt("1", reference=None)) is None
    with pytest.raises(ConfigError, match="unknown placeholder"):
        VerifierFeedback(wrong="{given} {answer}")


def test_a_custom_builder_is_loaded_by_path_and_may_return_a_string_or_a_pivot(tmp_path):
    (tmp_path / "judge.py").write_text("from mixrl.sources.feedback import Feedback\n"
                                       "def critique(a):\n    return Feedback('look again', pivot=2)\n")
    fn = build_feedback(f"{tmp_path}/judge.py:critique", {})
    assert fn(_attempt("8 1")) == Feedback("look again", 2)
    with pytest.raises(ConfigError, match="is not a feedback builder"):
        build_feedback("judge", {})


def test_divergence_and_pairs():
    assert divergence([1, 2, 3, 4], [1, 2, 5]) == 2 and divergence([9], [1]) == 0 and divergence([1, 2], [1, 2, 3]) == 2
    assert plan_pairs([0, 2, 3], 1) == [(0, 3)]  # attempt 0 refined into the last failed slot
    assert plan_pairs([0, 1, 2, 3], 4) == [(0, 3), (1, 2)]  # never over an attempt that is itself refined
    assert plan_pairs([5], 1) == []  # one failure: nothing to fill
    assert refine_context([{"role": "user", "content": "q"}], "a", "c", "{prompt}|{attempt}|{feedback}")[0]["content"] == "q|a|c"


# ----------------------------------------------------------------------------- the injection
class _Tok:
    eos_token_id, pad_token_id = 0, 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if i)


def _ids(s):
    return [ord(c) for c in s]


def _run(inj, rows, completions, new="#### 19"):
    seen, logs = {}, {}

    def generate(prompts):
        seen["prompts"] = prompts
        return [_ids(new) for _ in prompts], None

    def score(inputs, comps):
        return torch.tensor([[1.0 if "#### 19" in "".join(chr(i) for i in c) else 0.0] for c in comps])

    ctx = InjectContext(tokenizer=_Tok(), process_index=0, num_processes=1, num_generations=4, max_completion_length=32,
                        global_step=0, micro_step=0, device=torch.device("cpu"),
                        tokenize_prompts=lambda ps: [_ids(p) for p in ps], gather=lambda t: t,
                        generate=generate, score=score, log=lambda k, v: logs.setdefault(k, v),
                        behaviour_logps=lambda p, c: [[-0.25 * len(pp)] * len(cc) for pp, cc in zip(p, c)])
    r = Rollouts([_ids(c) for c in completions], None, [prov.ON_POLICY] * len(completions), prompt_ids=[[1]] * len(completions))
    return inj.after_generation(ctx, rows, r), seen, logs


ROW = {"prompt": "3+5+2+9=", "answer": "19", "expert": ["8 10 19 #### 19"]}


def test_refine_regenerates_from_the_critique_into_another_failed_slot_under_the_original_prompt():
    """Critique-GRPO: group of 4 with 3 failures; the first failed attempt (slot 1) gets the
    verifier's critique and its refinement fills the last failed slot (3); slot 1 stays."""
    inj = RefineFromFeedback(template="{prompt}|{attempt}|{feedback}|")
    comps = ["8 10 19 #### 19", "8 10 18 #### 18", "8 1", "7 #### 7"]
    r, seen, logs = _run(inj, [ROW] * 4, comps)
    ctx_text = "3+5+2+9=|8 10 18 #### 18|The answer 18 is wrong; the expected answer is 19.|"
    assert seen["prompts"] == [_ids(ctx_text)]
    assert r.completion_ids[3] == _ids("#### 19") and r.completion_ids[:3] == [_ids(c) for c in comps[:3]]
    assert r.token_source[3] == [REFINED] * 7 and r.token_source[1] is None  # refine: the attempt keeps every token
    assert r.behaviour_logp[3] == [-0.25 * len(ctx_text)] * 7  # recorded under the feedback context
    assert r.prompt_ids == [[1]] * 4 and r.guided == [0, 0, 0, 2] and r.discarded_tokens == [len(comps[3])]
    assert logs["refine/rows"] == 1.0 and logs["refine/success"] == 1.0 and logs["refine/first_pass_success"] == 0.25


def test_retry_restarts_at_the_divergence_and_neither_row_trains_the_shared_prefix():
    """R³L: the attempt "8 10 18 ..." leaves the reference "8 10 19 ..." at character 5; the
    retry keeps those 5 tokens, samples the rest after them, and the 5 tokens are ``prefix`` in
    the retry AND in the attempt (Pivotal Credit)."""
    inj = RefineFromFeedback(mode="retry", pivot="divergence", template="{prompt}{feedback}", feedback="indicative", text="!")
    comps = ["8 10 18 #### 18", "9", "8 10 19 #### 19", "7"]
    r, seen, _ = _run(inj, [ROW] * 4, comps, new="9 #### 19")
    assert seen["prompts"] == [_ids("3+5+2+9=!") + _ids("8 10 1")]  # context, then the kept prefix
    assert r.completion_ids[3] == _ids("8 10 19 #### 19")
    assert r.token_source[3] == [PREFIX] * 6 + [REFINED] * 9
    assert r.token_source[0] == [PREFIX] * 6 + [prov.ON_POLICY] * 9
    assert r.token_source[1] is None and r.completion_ids[1] == _ids("9")  # slot 1 was not used: attempt 0 -> slot 3


def test_retry_pivots_start_and_feedback_and_groups_with_one_failure_are_left_alone():
    inj = RefineFromFeedback(mode="retry", pivot="start", template="{prompt}{feedback}", feedback="indicative", text="!")
    r, seen, _ = _run(inj, [ROW] * 4, ["8 10 18", "x", "8 10 19 #### 19", "8 10 19 #### 19"])
    assert seen["prompts"] == [_ids("3+5+2+9=!")] and r.token_source[1] == [REFINED] * 7 and r.token_source[0] is None
    r, seen, _ = _run(inj, [ROW] * 4, ["8 10 18", "8 10 19 #### 19", "8 10 19 #### 19", "8 10 19 #### 19"])
    assert seen["prompts"] == [] and r.token_source == [None] * 4  # every process still called generate
    with pytest.raises(ConfigError, match="mode"):
        RefineFromFeedback(mode="x")
    with pytest.raises(ConfigError, match="must contain"):
        RefineFromFeedback(template="{prompt}")


# ----------------------------------------------------------------------------- R³L's advantage
def _adv(rewards, groups, **kw):
    return ADVANTAGES.get("positive_amplified")(torch.tensor(rewards), torch.tensor(groups), **kw).tolist()


def test_positive_amplification_by_hand_and_as_the_authors_opmd_reweight_adv():
    # group 0: [1, 0, 0, 0.5] mean 0.375; group 1: [0.2, 0.6] mean 0.4
    out = _adv([1.0, 0.0, 0.0, 0.5, 0.2, 0.6], [0, 0, 0, 0, 1, 1])
    exp = [1.0, -0.375, -0.375, 3 * 0.125, 0.2 - 0.4, 3 * 0.2]
    assert out == pytest.approx(exp)
    # the authors' loop (shiweijiezero/R3L @ d503f6c, opmd_advantage.py, OPMDReweightAdvGroupAdvantage), verbatim rule
    def authors(rs):
        base = sum(rs) / len(rs)
        out = []
        for r in rs:
            s = r - base
            s = 1.0 if r >= 1.0 else (s * 3 if s >= 0 else s)
            out.append(s)
        return out
    assert out == pytest.approx(authors([1.0, 0.0, 0.0, 0.5]) + authors([0.2, 0.6]))
    # std=true: grpo_reweight_adv, (r - mean) / (std + eps) before the same rule
    g = [0.0, 0.5, 0.25]
    m = sum(g) / 3
    s = math.sqrt(sum((x - m) ** 2 for x in g) / 2)
    assert _adv(g, [0, 0, 0], std=True) == pytest.approx([(x - m) / (s + 1e-6) * (3 if x >= m else 1) for x in g])
    assert _adv([0.0, 0.0], [0, 0], amplify=2.0, success_advantage=0.5) == [0.0, 0.0]


def test_the_shaped_term_on_refined_tokens_value_and_gradient_by_hand():
    """Critique-GRPO's shaping on refinement tokens, -A p/(p + gamma): d/dlogp = -A gamma p / (p + gamma)^2."""
    logp = torch.tensor([[-0.5, -2.0]], requires_grad=True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    out = TERMS.get("shaped")(TermInputs(logp=logp, mask=mask, advantages=torch.tensor([0.75]),
                                         behaviour_logp=torch.zeros(1, 2)), gamma=0.1).per_token
    p = logp.detach().exp()
    assert torch.allclose(out.detach(), -0.75 * p / (p + 0.1))
    out.sum().backward()
    assert torch.allclose(logp.grad, -0.75 * 0.1 * p / (p + 0.1) ** 2, atol=1e-6)

# ----------------------------------------------------------------------------- configs
def test_configs_compose_explain_their_tokens_and_refuse_bad_settings():
    cg = compose_config(["algo=critique_grpo"])
    assert build_injection(cg).provenances == ("refined",)
    r3 = compose_config(["algo=r3l"])
    assert build_injection(r3).provenances == ("refined", "prefix", "reflection") and r3.algo.advantage.name == "positive_amplified"
    assert cg.algo.inject.refine == "all"  # the authors' (tests below); failed: mixrl's earlier rule
    with pytest.raises(ConfigError, match="per_group"):  # refine=all: the kept refinement's slots, below G = 8
        compose_config(["algo=critique_grpo", "algo.inject.per_group=8"])
    with pytest.raises(ConfigError, match="per_group"):  # refine=failed: each refinement needs 2 failed slots
        compose_config(["algo=critique_grpo", "algo.inject.refine=failed", "algo.inject.per_group=5"])
    with pytest.raises(ConfigError, match="refine=failed"):
        compose_config(["algo=critique_grpo", "algo.inject.mode=retry"])
    with pytest.raises(ConfigError, match="failed or all"):
        compose_config(["algo=critique_grpo", "algo.inject.refine=some"])
    with pytest.raises(ConfigError, match="feedback=self"):  # a self-critique asks for the error of a right attempt too
        compose_config(["algo=critique_grpo", "algo.inject.feedback=self"])
    with pytest.raises(ConfigError, match="refined"):  # refinements must be trained
        compose_config(["algo=r3l", "algo.terms.policy.tokens=[on_policy]"])
    with pytest.raises(ConfigError, match="feedback"):
        compose_config(["algo=r3l", "algo.inject.feedback=nonsense"])
    assert "The answer" in " ".join(build_injection(cg).texts())


def test_a_group_split_across_processes_is_paired_within_each_process_up_to_per_group():
    from mixrl.sources.with_feedback import plan_group

    assert plan_group([[0, 1, 2, 3], [4, 5, 6, 7]], 1) == [(0, 3)]  # one refinement per group, on the first process
    assert plan_group([[0, 1, 2, 3], [4, 5, 6, 7]], 4) == [(0, 3), (1, 2), (4, 7), (5, 6)]
    assert plan_group([[3], [4, 6]], 2) == [(4, 6)]  # a lone failure on a process pairs with nothing


# ----------------------------------------------------------------------------- refine: all (the authors')
# zhangxy-2019/critique-GRPO @ e8f03a20b49511e10e71f361c70e46aae3ae8753,
# verl/verl/critique_grpo/critique_vllm_rollout_spmd.py: every response gets a critique, right ones
# too (lines 350-387; critique_prompts.py:120-125), one refinement each (438-447); per question the
# first refinement scored 1, else the highest-scored (process_refinement_groups, lines 61-97) fills
# the first n_prefix slots (549-581, 599-605). Expected values below are worked out by hand.
def _score_text(t):
    return 1.0 if "#### 19" in t else (0.5 if "9" in t else 0.0)


def _run_all(inj, comps, refinements, G=4):
    """One process; the policy answers each regeneration context with refinements[attempt text]."""
    seen, logs = {"prompts": []}, {}
    text = lambda ids: "".join(chr(i) for i in ids if i)  # noqa: E731

    def generate(prompts):
        seen["prompts"] += [text(p) for p in prompts]
        return [_ids(refinements[text(p).split("|")[1]]) for p in prompts], None

    ctx = InjectContext(tokenizer=_Tok(), process_index=0, num_processes=1, num_generations=G, max_completion_length=32,
                        global_step=0, micro_step=0, device=torch.device("cpu"),
                        tokenize_prompts=lambda ps: [_ids(p) for p in ps], gather=lambda t: t, generate=generate,
                        score=lambda inputs, cs: torch.tensor([[_score_text(text(c))] for c in cs]),
                        log=lambda k, v: logs.setdefault(k, v),
                        behaviour_logps=lambda p, c: [[-0.25 * len(pp)] * len(cc) for pp, cc in zip(p, c)])
    r = Rollouts([_ids(c) for c in comps], None, [prov.ON_POLICY] * len(comps), prompt_ids=[[1]] * len(comps))
    return inj.after_generation(ctx, [ROW] * len(comps), r), seen, logs


COMPS = ["8 10 19 #### 19", "8 10 18 #### 18", "8 1", "7 #### 7"]  # slot 0 right (reward 1), the others 0


def test_refine_all_critiques_every_rollout_and_keeps_the_first_right_refinement_in_slot_0():
    """Every rollout, the right one too, is refined; the refinements score 0, 0, 1, 1 (attempts 0-3), so
    the first scored 1 (attempt 2's) replaces slot 0's initial response; the other slots keep theirs."""
    inj = RefineFromFeedback(refine="all", template="{prompt}|{attempt}|{feedback}|")
    refs = {COMPS[0]: "#### 18", COMPS[1]: "#### 17", COMPS[2]: "#### 19", COMPS[3]: "x #### 19"}
    r, seen, logs = _run_all(inj, COMPS, refs)
    assert seen["prompts"] == [
        "3+5+2+9=|8 10 19 #### 19|The answer 19 is right; the expected answer is 19.|",  # a right attempt: "right"
        "3+5+2+9=|8 10 18 #### 18|The answer 18 is wrong; the expected answer is 19.|",
        "3+5+2+9=|8 1|No final answer was found; the expected answer is 19.|",
        "3+5+2+9=|7 #### 7|The answer 7 is wrong; the expected answer is 19.|"]
    assert r.completion_ids[0] == _ids("#### 19") and r.completion_ids[1:] == [_ids(c) for c in COMPS[1:]]
    assert r.token_source == [[REFINED] * 7, None, None, None] and r.guided == [2, 0, 0, 0]
    assert r.behaviour_logp[0] == [-0.25 * len(seen["prompts"][2])] * 7  # under attempt 2's feedback context
    assert r.prompt_ids == [[1]] * 4  # trained under the original prompt
    # generated but not kept: refinements of attempts 0, 1, 3 (7, 7, 9 tokens) and slot 0's initial response (15)
    assert sorted(r.discarded_tokens) == [7, 7, 9, 15]
    assert logs["refine/rows"] == 1.0 and logs["refine/generated"] == 4.0 and logs["refine/success"] == 1.0
    assert logs["refine/first_pass_success"] == 0.25


def test_refine_all_keeps_the_best_refinement_when_none_is_right_the_first_of_equal_scores():
    """Refinements scored 0, 0.5, 0.5, 0 (a '9' and no '#### 19': 0.5): none is right, so the
    highest-scored is kept, the first of the two at 0.5 (attempt 1's, as Python's max); it is kept
    although wrong. per_group=2: it fills slots 0 and 1 (the authors' n_prefix copies)."""
    inj = RefineFromFeedback(refine="all", per_group=2, template="{prompt}|{attempt}|{feedback}|")
    refs = {COMPS[0]: "#### 18", COMPS[1]: "9 #### 1", COMPS[2]: "99 #### 1", COMPS[3]: "#### 7"}
    r, _, logs = _run_all(inj, COMPS, refs)
    assert r.completion_ids[:2] == [_ids("9 #### 1")] * 2 and r.completion_ids[2:] == [_ids(c) for c in COMPS[2:]]
    assert r.token_source[:2] == [[REFINED] * 8] * 2 and r.guided == [2, 2, 0, 0]
    assert logs["refine/rows"] == 2.0 and logs["refine/success"] == 0.0


def test_keep_best_by_hand():
    # two groups of 4: group 0's scores [0, 1, 1, 0.5] -> row 1; group 1 has refinements only at 5 and 6
    # ([., 0.2, 0.7, .]) -> row 6; slots: the first per_group eligible ones (row 4 is not eligible)
    has = [True] * 4 + [False, True, True, False]
    scores = [0.0, 1.0, 1.0, 0.5, -1, 0.2, 0.7, -1]
    eligible = [True] * 4 + [False, True, True, True]
    assert keep_best(has, scores, eligible, 4, 1, 1.0) == {0: (1, [0]), 1: (6, [5])}
    assert keep_best(has, scores, eligible, 4, 2, 1.0) == {0: (1, [0, 1]), 1: (6, [5, 6])}
    assert keep_best([False] * 4, [0.0] * 4, [True] * 4, 4, 1, 1.0) == {}  # no refinement: the group is left alone


def test_refine_all_across_two_processes_moves_the_kept_refinement_to_the_group_s_first_slot():
    """A group of 4 split over 2 processes (rows 0-1 on process 0, 2-3 on process 1): the only right
    refinement is attempt 2's, made on process 1; it travels (tokens and behaviour log-probs) to slot 0
    on process 0. Each process runs in a thread; gather concatenates the processes' tensors in order."""
    import threading

    barrier, box = threading.Barrier(2), {}
    refs = {COMPS[0]: "#### 18", COMPS[1]: "#### 17", COMPS[2]: "#### 19", COMPS[3]: "#### 1"}
    text = lambda ids: "".join(chr(i) for i in ids if i)  # noqa: E731
    out, calls = {}, {0: 0, 1: 0}

    def gather(rank, t):
        key = (calls[rank], rank)
        calls[rank] += 1
        box[key] = t
        barrier.wait()
        both = torch.cat([box[(key[0], 0)], box[(key[0], 1)]])
        barrier.wait()
        return both

    def run(rank):
        ctx = InjectContext(tokenizer=_Tok(), process_index=rank, num_processes=2, num_generations=4, max_completion_length=32,
                            global_step=0, micro_step=0, device=torch.device("cpu"),
                            tokenize_prompts=lambda ps: [_ids(p) for p in ps], gather=lambda t: gather(rank, t),
                            generate=lambda ps: ([_ids(refs[text(p).split("|")[1]]) for p in ps], None),
                            score=lambda inputs, cs: gather(rank, torch.tensor([[_score_text(text(c))] for c in cs])),
                            behaviour_logps=lambda p, c: [[-0.5] * len(cc) for cc in c])
        mine = COMPS[2 * rank:2 * rank + 2]
        r = Rollouts([_ids(c) for c in mine], None, [prov.ON_POLICY] * 2, prompt_ids=[[1]] * 2)
        inj = RefineFromFeedback(refine="all", template="{prompt}|{attempt}|{feedback}|")
        out[rank] = inj.after_generation(ctx, [ROW] * 2, r)

    threads = [threading.Thread(target=run, args=(k,)) for k in (0, 1)]
    [t.start() for t in threads]
    [t.join(timeout=30) for t in threads]
    assert out[0].completion_ids == [_ids("#### 19"), _ids(COMPS[1])]
    assert out[0].token_source[0] == [REFINED] * 7 and out[0].behaviour_logp[0] == [-0.5] * 7
    assert out[1].completion_ids == [_ids(c) for c in COMPS[2:]] and out[1].guided == [0, 0]
    # not kept: process 0's two refinements (7, 7) and slot 0's initial response (15); process 1's "#### 1" (6);
    # the kept "#### 19" is in the batch (slot 0), so no process counts it as discarded
    assert sorted(out[0].discarded_tokens) == [7, 7, 15] and out[1].discarded_tokens == [6]


def test_the_verifier_and_indicative_critiques_of_a_right_attempt():
    right = _attempt("8 10 19 #### 19")
    right.correct = True
    assert VerifierFeedback()(right).text == "The answer 19 is right; the expected answer is 19."
    assert VerifierFeedback(right="correct, the ground truth is {expected}.")(right).text == "correct, the ground truth is 19."
    assert IndicativeFeedback()(right).text == "The answer is right."
    # the right sentences enter texts() (the character check) only where right attempts are critiqued
    assert not any("right" in t for t in RefineFromFeedback().texts())
    assert any("right" in t for t in RefineFromFeedback(refine="all").texts())
