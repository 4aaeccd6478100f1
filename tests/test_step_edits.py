"""Corrections written into a rollout (issue 52), on hand-built batches with values by hand.

SCOPE ("Recycling Failures: Salvaging Exploration in RLVR via Fine-Grained Off-Policy Guidance", arXiv
2602.24110; no code of the authors found): a step scorer finds the first wrong step of a failed
rollout; the policy's correct prefix is kept (on_policy), the step is replaced by the reference's
(rectified, no behaviour probability), the policy continues (on_policy); the row takes the failed
rollout's slot.

EditGRPO (taokz/EditGRPO @ 5decc57a61bec99fc907489fcdc735fd9a71ba66): G/2 sources edited into G/2 other
slots of the group (verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py:655-706), one operation per
rollout, old log-probs recomputed after the edit (verl/trainer/ray_trainer.py:696-699: ratio 1 at
first), GRPO with std, PPO clip, token-mean, KL loss 0.01.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from mixrl.config.builders import build_injection, build_objective
from mixrl.config.compose import compose_config
from mixrl.core import provenance as prov
from mixrl.core.objective import compute_objective
from mixrl.core.process_rewards import first_wrong_step, reference_step_scores, step_spans
from mixrl.errors import ConfigError
from mixrl.rewards.process import process_reward
from mixrl.sources import InjectContext, Rollouts
from mixrl.sources.edits import EDITED, SentenceEdit, edit_steps
from mixrl.sources.step_rectify import RECTIFIED, StepRectify, kept_tokens

ON = prov.ON_POLICY
REF = "8 10 19 #### 19"  # the worked solution of 8+2+9= (running sums), steps cut at ' '
PROMPT = "8+2+9="
L = math.log


from char_tokens import CharTokenizer as _Tok  # tests/char_tokens.py (tests/ is on sys.path under pytest)
from char_tokens import char_ids as _ids
from char_tokens import char_text as _text


class _Source:
    requires_expert_column = False

    def for_prompt(self, row):
        return [REF]


def _ctx(continuation, *, G=4, L_max=16, log=None, logprobs=False):
    """One process; the policy continues any context with ``continuation``; the reward is 1 for a
    completion that ends with '#### 19'; every generation and behaviour forward is recorded."""
    seen = {"generate": [], "forward": []}

    def generate(prompts):
        seen["generate"].append([_text(p) for p in prompts])
        ids = [_ids(continuation) + [0] for _ in prompts]
        return ids, ([[-0.5] * len(x) for x in ids] if logprobs else None)

    def behaviour(prompts, comps):
        seen["forward"].append(([_text(p) for p in prompts], [_text(c) for c in comps]))
        return [[-0.01 * len(p)] * len(c) for p, c in zip(prompts, comps)]

    ctx = InjectContext(tokenizer=_Tok(), process_index=0, num_processes=1, num_generations=G, max_completion_length=L_max,
                        global_step=3, micro_step=0, device=torch.device("cpu"), tokenize_prompts=lambda ps: [_ids(p) for p in ps],
                        gather=lambda t: t, generate=generate, behaviour_logps=behaviour,
                        score=lambda inputs, comps: torch.tensor([[1.0 if _text(c).endswith("#### 19") else 0.0] for c in comps]),
                        log=(lambda k, v: log.__setitem__(k, v)) if log is not None else None)
    return ctx, seen


def _rollouts(comps, logprobs=False):
    ids = [_ids(c) + [0] for c in comps]
    return Rollouts(ids, [[-0.1] * len(x) for x in ids] if logprobs else None, [ON] * len(comps),
                    prompt_ids=[_ids(PROMPT)] * len(comps))


ROWS = [{"prompt": PROMPT, "answer": "19"}] * 8


# ----------------------------------------------------------------------------- the step scorer
def test_reference_step_scorer_and_the_first_wrong_step_by_hand():
    text = "8 11 20 #### 20"
    spans = step_spans(text, " ")
    assert [text[a:b] for a, b in spans] == ["8 ", "11 ", "20 ", "#### ", "20"]
    assert reference_step_scores(text, spans, REF, " ") == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert first_wrong_step([1.0, 0.0, 0.0, 1.0, 0.0]) == 1 and first_wrong_step([1.0, 0.7], 0.5) is None
    extra = "8 10 19 #### 19 5"  # a step past the reference's last one is wrong
    assert reference_step_scores(extra, step_spans(extra, " "), REF, " ") == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0]
    # reward=process with scorer=reference reads the expert column: step_weight (s - 1) summed (no token ids)
    r = process_reward(scorer="reference", separator=" ", verifier="none")
    assert r(prompts=[PROMPT, PROMPT], completions=[text, REF], expert=[[REF], [REF]]) == [-3.0, 0.0]
    with pytest.raises(ConfigError, match="scorer=reference takes no scorer_params"):
        process_reward(scorer="reference", scorer_params={"url": "http://x"})
    cfg = compose_config(["reward=process", "reward.params.scorer=reference", "reward.params.separator=' '"])
    assert cfg.reward.params.scorer == "reference"


def test_kept_tokens_stop_before_the_wrong_step():
    assert kept_tokens(_Tok(), _ids("8 11 20"), 2) == (2, 2)
    assert kept_tokens(_Tok(), _ids("8 11 20"), 0) == (0, 0)


# ----------------------------------------------------------------------------- SCOPE
def test_scope_keeps_the_prefix_rectifies_the_first_wrong_step_and_the_policy_continues():
    """Group 0: slot 0 right, slot 1 wrong from step 1 ("11"), slot 3 wrong at step 4; per_group=1
    rectifies only slot 1: kept "8 " (2 on_policy tokens), written "10 " (3 rectified), the policy
    continues "19 #### 19"+eos after prompt + "8 10 " (11 on_policy tokens, exactly the room left of 16).
    Group 1: slot 0 (row 4) wrong at its last step: kept "8 10 19 #### " (13), written "19" (2), one
    position left: the continuation is cut to its first token."""
    log = {}
    ctx, seen = _ctx("19 #### 19", log=log, logprobs=True)
    comps = [REF, "8 11 20 #### 20", REF, "8 10 19 #### 18", "8 10 19 #### 18", REF, REF, REF]
    r = _rollouts(comps, logprobs=True)
    inj = StepRectify(scorer="reference", separator=" ", per_group=1, source=_Source())
    out = inj.after_generation(ctx, ROWS, r)
    assert seen["generate"] == [[PROMPT + "8 10 ", PROMPT + "8 10 19 #### 19"]]
    assert out.completion_ids[1] == _ids("8 10 19 #### 19") + [0]
    assert out.token_source[1] == [ON] * 2 + [RECTIFIED] * 3 + [ON] * 11
    assert out.logprobs[1] == [-0.1] * 2 + [None] * 3 + [-0.5] * 11  # the engine's, where a policy sampled
    assert out.completion_ids[4] == _ids("8 10 19 #### 19") + [ord("1")]  # cut to 16
    assert out.token_source[4] == [ON] * 13 + [RECTIFIED] * 2 + [ON]
    assert out.completion_ids[3] == _ids(comps[3]) + [0] and out.token_source[3] is None  # per_group: only the first
    assert out.guided == [0, 1, 0, 0, 1, 0, 0, 0] and out.discarded_tokens == [16, 16]
    assert out.behaviour_logp[1] is None  # on-policy tokens: the row's own forward; rectified: none exists
    assert log["scope/candidates"] == 2 and log["scope/rectified"] == 2 and log["scope/first_wrong_step"] == 2.5
    ctx.primary_rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    inj.after_rewards(ctx, ROWS, torch.zeros(8))
    assert log["scope/success"] == 0.5  # row 1 right after the rectification, row 4 (cut) not

    every = StepRectify(scorer="reference", separator=" ", per_group=None, source=_Source())
    ctx2, seen2 = _ctx("19 #### 19")
    every.after_generation(ctx2, ROWS, _rollouts(comps))
    assert len(seen2["generate"][0]) == 3  # rows 1, 3 and 4


def test_scope_self_corrector_asks_the_policy_to_rewrite_the_step_and_keeps_its_first_step():
    """corrector=self: the policy is asked (request with {prompt}, {previous}, {step}) and writes "10 99 ";
    its first step "10 " is the rectified step; the policy then continues as before."""
    from mixrl.trainer.parts.policy_calls import PolicyCalls

    ctx, seen = _ctx("19 #### 19")
    asked = []

    def write_gen(prompts):
        asked.extend(_text(p) for p in prompts)
        return [_ids("10 99 ") for _ in prompts], None

    ctx.policy_calls = lambda who: PolicyCalls(who=who, tokenizer=_Tok(), tokenize_prompts=ctx.tokenize_prompts,
                                               generate=write_gen, behaviour_logps=ctx.behaviour_logps, max_new_tokens=8)
    inj = StepRectify(scorer="reference", separator=" ", per_group=1, corrector="self",
                      request="{prompt}|{previous}|{step}|", source=_Source())
    out = inj.after_generation(ctx, ROWS[:4], _rollouts([REF, "8 11 20 #### 20", REF, REF]))
    assert asked == [PROMPT + "|8 |11 |"] and inj.metrics["scope/self_written_tokens"] == 6
    assert seen["generate"] == [[PROMPT + "8 10 "]]
    assert out.completion_ids[1] == _ids("8 10 19 #### 19") + [0]
    assert out.token_source[1] == [ON] * 2 + [RECTIFIED] * 3 + [ON] * 11
    with pytest.raises(ConfigError, match="corrector='teacher' is not one of reference, self"):
        compose_config(["algo=scope", "algo.inject.corrector=teacher"])
    with pytest.raises(ConfigError, match=r"unknown placeholder \{answer\}"):
        compose_config(["algo=scope", "algo.inject.corrector=self", "algo.inject.request='{answer}'"])


def test_scope_scores_every_candidate_in_one_scorer_call_and_applies_the_threshold():
    """A judge-like scorer (stand-in): one call for both failed rows, with the gold answer (not the
    reference) as what it reads; scores [0.9, 0.4, ...] with threshold 0.5 put the first wrong step at 1,
    [0.9, 0.6, 0.45, ...] at 2."""
    inj = StepRectify(scorer="reference", separator=" ", per_group=None, source=_Source())
    inj.scorer_name = "judge"
    calls = []

    def scores(prompts, texts, spans, answers, log):
        calls.append((list(texts), list(answers)))
        return [[0.9, 0.4, 0.9, 0.9, 0.9], [0.9, 0.6, 0.45, 0.9, 0.9]]

    inj.steps.step_scores = scores
    found = inj.locate(_ctx("")[0], [(1, ROWS[1], _ids("8 11 20 #### 20")), (3, ROWS[3], _ids("8 10 20 #### 20"))])
    assert calls == [(["8 11 20 #### 20", "8 10 20 #### 20"], ["19", "19"])]
    assert [(i, f["j"], f["k"], f["step"], f["ref"]) for i, f in found] == [(1, 1, 2, "11 ", "10 "), (3, 2, 5, "20 ", "19 ")]


def test_scope_preset_loss_trains_each_part_with_its_term_by_hand():
    """One rectified row, A = 0.5: kept prefix and continuation (on_policy) take the clipped ratio
    to pi_old, the rectified step takes -A p / (p + 0.1) (no ratio); token-mean over the 5 tokens.
    On-policy ratios 1.1, 0.7, 1.3: max(-A r, -A clip(r, 0.8, 1.2)) = -0.55, -0.35, -0.6; rectified
    p = 0.4, 0.9: -0.4, -0.45. Loss = -2.35 / 5. Gradient on the first rectified token:
    d/dlogp (-A p / (p + g)) / 5 = -A g p / (p + g)^2 / 5 = -0.016; the clipped token (r = 1.3) gets none."""
    cfg = compose_config(["algo=scope"])
    assert cfg.algo.terms.rectified.name == "shaped" and list(cfg.algo.terms.policy.tokens) == ["on_policy"]
    old = torch.tensor([[-1.0, -1.0, 0.0, 0.0, -1.0]])
    logp = torch.tensor([[-1 + L(1.1), -1 + L(0.7), L(0.4), L(0.9), -1 + L(1.3)]], requires_grad=True)
    src = torch.tensor([[ON, ON, RECTIFIED, RECTIFIED, ON]])
    loss, _ = compute_objective(build_objective(cfg), logp=logp, mask=torch.ones(1, 5), advantages=torch.tensor([0.5]),
                                token_source=src, old_logp=old, behaviour_logp=torch.full((1, 5), float("nan")))
    assert float(loss.detach()) == pytest.approx((-0.55 - 0.35 - 0.6 - 0.4 - 0.45) / 5)
    loss.backward()
    assert float(logp.grad[0, 2]) == pytest.approx(-0.5 * 0.1 * 0.4 / 0.5 ** 2 / 5)
    assert float(logp.grad[0, 4]) == 0.0  # r = 1.3 > 1.2 with A > 0: clipped, no gradient
    assert float(logp.grad[0, 1]) == pytest.approx(-0.5 * 0.7 / 5)  # r = 0.7, A > 0: unclipped, -A r / 5


def test_scope_refusals_are_one_line():
    with pytest.raises(ConfigError, match="'exact' is not a step scorer"):
        compose_config(["algo=scope", "algo.inject.scorer=exact"])
    with pytest.raises(ConfigError, match="per_group=9 must be between 1 and num_generations=8"):
        compose_config(["algo=scope", "algo.inject.per_group=9"])
    with pytest.raises(ConfigError, match="rectified"):  # the rectified step must be trained by some term
        compose_config(["algo=scope", "~algo.terms.rectified"])
    with pytest.raises(ConfigError, match=r"step_tokens=32 leaves no room .* trainer.max_completion_length=32"):
        compose_config(["algo=scope", "algo.inject.step_tokens=32"])  # at config time, before any run directory
    inj = StepRectify(scorer="reference", separator=" ", step_tokens=16, source=_Source())
    ctx, _ = _ctx("x")
    with pytest.raises(ConfigError, match=r"step_tokens=16 leaves no room .* trainer.max_completion_length=16"):
        inj.after_generation(ctx, ROWS, _rollouts([REF] * 8))  # and again in the step (a context built elsewhere)
    cfg = compose_config(["algo=scope"])
    inj = build_injection(cfg)
    assert (inj.per_group, inj.steps.separator, inj.scorer_name) == (1, "\n\n", "reference")


# ----------------------------------------------------------------------------- EditGRPO
def test_edit_steps_replace_then_delete_by_hand():
    assert edit_steps("8 11 20 #### 20", REF, " ", 1) == ("8 10 20 #### 20", 2, 1)
    assert edit_steps("8 11 20 #### 20", REF, " ", 2) == ("8 10 19 #### 20", 2, 2)
    assert edit_steps("8 10 19 #### 19 5", REF, " ", 1) == ("8 10 19 #### 19 ", 16, 1)  # past the reference: deleted
    assert edit_steps(REF, REF, " ", 1) == (REF, len(REF), 0)


def test_edit_pairs_are_the_authors_half_and_half():
    inj = SentenceEdit(separator=" ")
    for G, k in ((5, 2), (4, 2), (2, 1)):
        pairs = inj.pairs(7, 0, 3, G)
        src, tgt = [s for s, _ in pairs], [t for _, t in pairs]
        assert len(pairs) == k and not set(src) & set(tgt) and set(src + tgt) <= set(range(G))
        assert pairs == inj.pairs(7, 0, 3, G)  # the same draw on every process


def test_edit_places_the_edited_copy_in_another_slot_with_its_provenance_and_behaviour():
    """G = 4, per_group = 1: every slot wrong at step 1 in group 0 ("8 11 20 #### 20" and variants).
    The source's copy, edited once ("8 10 20 #### 20" + eos), replaces the target's rollout: its first 2
    tokens on_policy, the 14 after edited, the policy's log-probs recorded under the prompt (6 tokens:
    -0.06 each). The source itself and the other slots are unchanged."""
    log = {}
    ctx, seen = _ctx("", log=log)
    comps = ["8 11 20 #### 20", "8 12 21 #### 21", "8 13 22 #### 22", "8 14 23 #### 23"] + [REF] * 4
    r = _rollouts(comps)
    inj = SentenceEdit(per_group=1, separator=" ", source=_Source())
    (s0, t0), = inj.pairs(ctx.global_step, ctx.micro_step, 0, 4)
    out = inj.after_generation(ctx, ROWS, r)
    edited = "8 10" + comps[s0][4:]
    assert out.completion_ids[t0] == _ids(edited) + [0]
    assert out.token_source[t0] == [ON] * 2 + [EDITED] * (len(edited) + 1 - 2)
    assert out.behaviour_logp[t0] == pytest.approx([-0.06] * (len(edited) + 1))
    assert seen["forward"] == [([PROMPT], [edited])]
    assert out.completion_ids[s0] == _ids(comps[s0]) + [0] and out.token_source[s0] is None
    assert [i for i in range(8) if out.guided[i]] == [t0]  # group 1's sources are right: nothing changes
    assert log == {"edit/rows": 1.0, "edit/ops": 1.0}
    ctx.primary_rewards = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    ctx.primary_rewards[t0] = 0.5
    inj.after_rewards(ctx, ROWS, torch.zeros(8))
    assert log["edit/reward"] == 0.5  # the edited row's own reward


def test_edit_grpo_preset_loss_by_hand():
    """Tokens [on, on, edited, edited], A = -1. Edited tokens' behaviour = the policy at placement: at the
    first update r = 1 and l = -A = 1 each; after it moved (r = 1.5, 0.6): max(-A r, -A clip(r)) = 1.5, 0.8.
    token-mean over 4: (1 + 1 + 1.5 + 0.8) / 4. The KL (0.01, k3) reads the on_policy tokens only: the
    reference equals the policy there, so it adds 0 whatever the edited tokens' reference log-probs."""
    cfg = compose_config(["algo=edit_grpo"])
    assert (cfg.algo.num_generations, cfg.algo.kl.coef, cfg.algo.advantage.name) == (5, 0.01, "grpo")
    logp = torch.tensor([[-1.0, -2.0, -1 + L(1.5), -1 + L(0.6)]])
    beh = torch.tensor([[float("nan"), float("nan"), -1.0, -1.0]])
    src = torch.tensor([[ON, ON, EDITED, EDITED]])
    ref = torch.tensor([[-1.0, -2.0, -5.0, -5.0]])
    obj = build_objective(cfg)
    loss, _ = compute_objective(obj, logp=logp, mask=torch.ones(1, 4), advantages=torch.tensor([-1.0]), token_source=src,
                                old_logp=logp.clone(), behaviour_logp=beh, ref_logp=ref)
    assert float(loss) == pytest.approx((1 + 1 + 1.5 + 0.8) / 4)
    first, _ = compute_objective(obj, logp=torch.tensor([[-1.0, -2.0, -1.0, -1.0]]), mask=torch.ones(1, 4),
                                 advantages=torch.tensor([-1.0]), token_source=src, old_logp=logp.clone(),
                                 behaviour_logp=beh, ref_logp=torch.tensor([[-1.0, -2.0, -1.0, -1.0]]))
    assert float(first) == pytest.approx(1.0)


def test_edit_refusals_are_one_line():
    with pytest.raises(ConfigError, match=r"per_group=3 must be between 1 and num_generations // 2 = 2"):
        compose_config(["algo=edit_grpo", "algo.inject.per_group=3"])
    with pytest.raises(ConfigError, match="needs algo.num_generations >= 2"):  # (grpo refuses G = 1 before it)
        SentenceEdit(geometry=SimpleNamespace(num_generations=1))
    with pytest.raises(ConfigError, match="ops must be >= 1"):
        compose_config(["algo=edit_grpo", "algo.inject.ops=0"])
    with pytest.raises(ConfigError, match="edited"):  # the edited tokens must be trained
        compose_config(["algo=edit_grpo", "algo.terms.policy.tokens=[on_policy]"])


# ----------------------------------------------------------------------------- end to end
@pytest.mark.slow  # a 2-step training (make test-slow); the mechanism is tested by hand above
@pytest.mark.parametrize("recipe,key", [("scope/arith-tiny", "scope/rectified"), ("edit_grpo/arith-tiny", "edit/rows")])
def test_toy_recipes_train_two_steps(recipe, key, tiny_model_path, tmp_path):
    """Level-3 problems (mostly beyond the barely warm-started model): rollouts fail, are rectified /
    edited, and training goes on."""
    from typer.testing import CliRunner

    from mixrl.cli.main import app
    from conftest import FAST

    res = CliRunner().invoke(app, ["train", f"recipe={recipe}", *FAST, f"model.path={tiny_model_path}",
                                   f"run_dir={tmp_path / 'run'}", "data.levels=[3]", "trainer.save_steps=0"])
    assert res.exit_code == 0, res.stdout[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if key in r]
    assert len(train) == 2 and sum(r[key] for r in train) > 0
