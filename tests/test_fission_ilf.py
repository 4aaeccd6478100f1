"""New training instances from the policy's failures (issue 52): Fission-GRPO (``inject: fission``)
and ILF (``inject: select_refinement``), on a stand-in context with values by hand.

Fission-GRPO ("Robust Tool Use via Fission-GRPO: Learning to Recover from Execution Errors", arXiv
2601.15625; no code released: zxzadm/Fission-GRPO @ a969d2fe9d3b74c2146b568768d1c241d2427295 is a
README): a failed rollout plus feedback is a new prompt x_corr = [x; y_err; f] with G' recovery
rollouts of its own, trained under x_corr with the group-normalised advantage of that group.

ILF ("Training Language Models with Language Feedback at Scale", arXiv 2303.16755;
JeremyAlain/imitation_learning_from_language_feedback @ 4dc2094cb8779c5b693663af56ee6e8c5426aee4):
N refinements from (x, y, f) (experiments/generate_refinements.py), the first best-scored one
selected (reward_model/score_refinements.py:198, np.argmax), fine-tuned on under x alone.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from mixrl.config.builders import build_injection, build_objective
from mixrl.config.compose import compose_config
from mixrl.core import provenance as prov
from mixrl.core.objective import compute_objective
from mixrl.errors import ConfigError, UserFunctionError
from mixrl.sources import InjectContext
from mixrl.sources.failed_attempts import pick_failed, whole_units
from mixrl.sources.fission import RECOVERY, Fission
from mixrl.sources.select_refinement import SELECTED, SelectRefinement, select_best
from mixrl.trainer.parts.policy_calls import PolicyCalls


from char_tokens import CharTokenizer as _Tok  # tests/char_tokens.py (tests/ is on sys.path under pytest)
from char_tokens import char_ids as _ids
from char_tokens import char_text as _text


def _ctx(written: list[str], *, max_positions=None):
    """One process; the policy writes the texts of ``written`` in turn; a completion is rewarded 1
    when it is "#" + the row's answer; every generation is recorded."""
    seen = {"generate": []}
    queue = iter(written)

    def generate(prompts):
        seen["generate"].append([_text(p) for p in prompts])
        return [_ids(next(queue)) for _ in prompts], None

    def behaviour(prompts, comps):  # a stand-in forward: -0.01 x (context length) per token
        return [[-0.01 * len(p)] * len(c) for p, c in zip(prompts, comps)]

    tok = _Tok()
    tokenize = lambda ps: [_ids(p) for p in ps]  # noqa: E731
    ctx = InjectContext(tokenizer=tok, process_index=0, num_processes=1, num_generations=4, max_completion_length=8,
                        global_step=0, micro_step=0, device=torch.device("cpu"), tokenize_prompts=tokenize,
                        gather=lambda t: t, generate=generate, behaviour_logps=behaviour, max_positions=max_positions,
                        rewards=lambda rows, comps: torch.tensor([float(_text(c) == "#" + r["answer"]) for r, c in zip(rows, comps)]))
    ctx.policy_calls = lambda who: PolicyCalls(who=who, tokenizer=tok, tokenize_prompts=tokenize, generate=generate,
                                               behaviour_logps=behaviour, max_new_tokens=8, max_positions=max_positions)
    return ctx, seen


#: two groups of 4: "9+10=" (rows 0-3; rows 1 and 3 wrong) and "1+2=" (rows 4-7; row 6 wrong)
ROWS = [{"prompt": "9+10=", "answer": "19"}] * 4 + [{"prompt": "1+2=", "answer": "3"}] * 4
COMPS = ["#19", "#18", "#19", "#1", "#3", "#3", "#5", "#3"]


def _batch():
    C = max(len(c) for c in COMPS)
    prompts = [_ids(r["prompt"]) for r in ROWS]
    P = max(len(p) for p in prompts)
    return {"prompt_ids": torch.tensor([[0] * (P - len(p)) + p for p in prompts]),
            "prompt_mask": torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts]),
            "completion_ids": torch.tensor([_ids(c) + [0] * (C - len(c)) for c in COMPS]),
            "completion_mask": torch.tensor([[1] * len(c) + [0] * (C - len(c)) for c in COMPS]),
            "token_source": torch.zeros(8, C, dtype=torch.long), "advantages": torch.arange(8, dtype=torch.float) / 10,
            "row_source": torch.full((8,), prov.ON_POLICY), "group_id": torch.tensor([0] * 4 + [1] * 4),
            "behaviour_logp": torch.full((8, C), float("nan"))}


def _run(inj, ctx):
    """The two hooks of a step: the first rewards seen at after_rewards, the rows appended at after_advantages."""
    ctx.primary_rewards = torch.tensor([float(c == "#" + r["answer"]) for r, c in zip(ROWS, COMPS)])
    inj.after_rewards(ctx, ROWS, torch.zeros(8))
    return inj.after_advantages(ctx, ROWS, _batch())


def _judge(attempt):
    """A stand-in error simulator: "E" and the attempt's answer."""
    return "E" + attempt.completion[1:]


def _unpad(t, mask):
    return t[mask.bool()].tolist()


# ----------------------------------------------------------------------------- Fission-GRPO
def test_fission_turns_each_failed_rollout_into_a_new_prompt_with_its_own_group_and_advantage():
    """Failed rows 1 ("#18"), 3 ("#1") and 6 ("#5"); each with feedback "E<answer>" becomes the
    context "x[y]f:" and gets G' = 3 recoveries: "9+10=[#18]E18:" -> #19, #7, #19 (rewards 1, 0, 1),
    "9+10=[#1]E1:" -> #1, #2, #3 (0, 0, 0), "1+2=[#5]E5:" -> #3 x 3 (1, 1, 1). Each group of three
    gets A = (r - mean) / (std + 1e-6), unbiased std: [1, 0, 1] -> mean 2/3, std sqrt(1/3); equal
    rewards -> 0. The recoveries are rows of their context (not of x), provenance recovery, behaviour
    recorded under the context, in no rollout group; the rollouts keep their advantages."""
    ctx, seen = _ctx(["#19", "#7", "#19", "#1", "#2", "#3", "#3", "#3", "#3"])
    inj = Fission(errors=8, recoveries=3, template="{prompt}[{attempt}]{feedback}:")
    inj.builder, inj.feedback_name = _judge, "sim.py:judge"
    new = _run(inj, ctx)
    contexts = ["9+10=[#18]E18:", "9+10=[#1]E1:", "1+2=[#5]E5:"]
    assert seen["generate"] == [[c for c in contexts for _ in range(3)]]  # one generation of all recoveries
    assert new["row_source"][8:].tolist() == [RECOVERY] * 9 and new["group_id"][8:].tolist() == [-1] * 9
    for j in range(9):
        row = 8 + j
        assert _unpad(new["prompt_ids"][row], new["prompt_mask"][row]) == _ids(contexts[j // 3])  # trained under x_corr
        comp = _unpad(new["completion_ids"][row], new["completion_mask"][row])
        assert new["token_source"][row][: len(comp)].tolist() == [RECOVERY] * len(comp)
        assert new["behaviour_logp"][row][: len(comp)].tolist() == pytest.approx([-0.01 * len(contexts[j // 3])] * len(comp))
    s = math.sqrt(1 / 3)
    expected = [(1 / 3) / (s + 1e-6), (-2 / 3) / (s + 1e-6), (1 / 3) / (s + 1e-6)] + [0.0] * 6
    assert new["advantages"][8:].tolist() == pytest.approx(expected)
    assert new["advantages"][:8].tolist() == pytest.approx([i / 10 for i in range(8)])
    # the policy term trains the rollouts and the recoveries; nothing else is in the batch
    trained = prov.select(new["token_source"], ("on_policy", "recovery")) & new["completion_mask"].bool()
    assert bool((trained == new["completion_mask"].bool()).all())
    assert inj.metrics == {"fission/picked": 3.0, "fission/instances": 3.0, "fission/recovery_reward": pytest.approx(5 / 9),
                           "fission/recovered": pytest.approx(5 / 9)}


def test_fission_with_the_verifier_message_and_a_whole_number_of_rows_per_micro_batch():
    """The verifier's message is the feedback; with 2 micro-batches and 3 recoveries per instance,
    3 fissioned attempts would give 9 rows: 2 instances (6 rows) are kept, in order."""
    ctx, seen = _ctx(["#1"] * 9)
    inj = Fission(errors=4, recoveries=3, template="{prompt}|{attempt}|{feedback}")

    class _G:  # one process, 2 micro-batches, 8 rollouts a step
        world_size, grad_accum, rollouts_per_step = 1, 2, 8
    inj.geometry = _G()
    new = _run(inj, ctx)
    assert seen["generate"][0][:4] == ["9+10=|#18|No final answer was found; the expected answer is 19."] * 3 + \
        ["9+10=|#1|No final answer was found; the expected answer is 19."]
    assert len(seen["generate"][0]) == 6 and len(new["row_source"]) == 8 + 6 and inj.metrics["fission/instances"] == 2.0


def test_fission_with_the_policys_own_critique_as_the_error_feedback():
    """feedback: self: the policy critiques each failed attempt first (one request each, the expected
    answer given), then writes the recoveries in contexts holding its critique; only the recoveries
    are appended (the critiques are context, never trained)."""
    ctx, seen = _ctx(["c1", "c2", "c3"] + ["#1"] * 6)
    inj = Fission(errors=8, recoveries=2, feedback="self", request="{prompt}{attempt}/{expected}?",
                  template="{prompt}[{attempt}]{feedback}:")
    new = _run(inj, ctx)
    assert seen["generate"][:3] == [["9+10=#18/19?"], ["9+10=#1/19?"], ["1+2=#5/3?"]]
    assert seen["generate"][3] == ["9+10=[#18]c1:"] * 2 + ["9+10=[#1]c2:"] * 2 + ["1+2=[#5]c3:"] * 2
    assert new["row_source"][8:].tolist() == [RECOVERY] * 6
    assert [_text(_unpad(new["prompt_ids"][r], new["prompt_mask"][r])) for r in (8, 10, 12)] == \
        ["9+10=[#18]c1:", "9+10=[#1]c2:", "1+2=[#5]c3:"]


def test_fission_refusals_are_one_line():
    with pytest.raises(ConfigError, match=r"recoveries"):
        compose_config(["algo=fission_grpo", "algo.inject.recoveries=1"])
    with pytest.raises(ConfigError, match=r"errors=100000 is more than the \d+ rollouts per step"):
        compose_config(["algo=fission_grpo", "algo.inject.errors=100000"])
    fast = ["trainer.prompts_per_step=4", "algo.num_generations=4", "trainer.micro_batch_size=8"]  # 2 micro-batches
    with pytest.raises(ConfigError, match=r"errors=1 must give every process .* 2 micro-batch\(es\), 3 row\(s\) each"):
        compose_config(["algo=fission_grpo", *fast, "algo.inject.errors=1", "algo.inject.recoveries=3"])
    with pytest.raises(ConfigError, match=r"must contain \{prompt\}, \{attempt\} and \{feedback\} \(it lacks \{attempt\}\)"):
        compose_config(["algo=fission_grpo", "algo.inject.template='{prompt} {feedback}'"])
    with pytest.raises(ConfigError, match="recovery"):  # the recoveries must be trained
        compose_config(["algo=fission_grpo", "algo.terms.policy.tokens=[on_policy]"])
    # a corrective context with no room for a recovery in the model's positions: one line, at the step
    ctx, _ = _ctx(["#1"] * 9, max_positions=20)  # "9+10=[#18]E18:" is 14 tokens, + 8 new > 20
    inj = Fission(errors=8, recoveries=3, template="{prompt}[{attempt}]{feedback}:")
    inj.builder, inj.feedback_name = _judge, "sim.py:judge"
    with pytest.raises(UserFunctionError, match=r"^algo.inject.template \(fission's corrective context\) asked the policy "
                                                r"to write 8 tokens after a request of 14 tokens.*20 positions") as e:
        _run(inj, ctx)
    assert "\n" not in str(e.value)
    # the recoveries are scored on each process by rule-based reward functions: a reward model is one line
    ctx, _ = _ctx(["#1"] * 9)

    def model_reward(rows, comps):
        raise ConfigError("teacher completions are checked with the run's reward functions, which must be rule-based")
    ctx.rewards = model_reward
    inj = Fission(errors=8, recoveries=3)
    with pytest.raises(ConfigError, match=r"^algo.inject=fission scores what the policy writes .*\(not a reward model\)"):
        _run(inj, ctx)


def test_the_fission_preset_and_toy_recipe_compose():
    cfg = compose_config(["algo=fission_grpo"])
    inj = build_injection(cfg)
    assert (type(inj), inj.errors, inj.recoveries, inj.feedback_name) == (Fission, 8, 8, "verifier")
    assert list(cfg.algo.terms.policy.tokens) == ["on_policy", "recovery"] and cfg.algo.advantage.name == "grpo"
    toy = compose_config(["recipe=fission_grpo/arith-tiny"])
    assert toy.model.name == "tiny-bpe" and build_injection(toy).recoveries == 4


# ----------------------------------------------------------------------------- ILF
def test_ilf_keeps_the_first_best_refinement_and_trains_it_under_the_original_prompt():
    """Failed rows 1, 3, 6 get feedback "E<answer>"; the policy writes N = 3 refinements of each in
    "x[y]f:": row 1 -> #7, #19, #19 (scores 0, 1, 1: the first best, #19), row 3 -> #1, #2, #5 (all 0:
    the first, #1, kept since min_score is null), row 6 -> #3, #4, #3 (the first, #3). The kept
    refinements are rows of the ORIGINAL prompt ("9+10=", "9+10=", "1+2="), provenance
    selected_refinement, no behaviour probability (NaN), advantage 0."""
    ctx, seen = _ctx(["#7", "#19", "#19", "#1", "#2", "#5", "#3", "#4", "#3"])
    inj = SelectRefinement(attempts=8, refinements=3, template="{prompt}[{attempt}]{feedback}:")
    inj.builder, inj.feedback_name = _judge, "sim.py:judge"
    new = _run(inj, ctx)
    assert seen["generate"] == [[c for c in ["9+10=[#18]E18:", "9+10=[#1]E1:", "1+2=[#5]E5:"] for _ in range(3)]]
    assert new["row_source"][8:].tolist() == [SELECTED] * 3
    got = [(_text(_unpad(new["prompt_ids"][r], new["prompt_mask"][r])), _text(_unpad(new["completion_ids"][r], new["completion_mask"][r])))
           for r in range(8, 11)]
    assert got == [("9+10=", "#19"), ("9+10=", "#1"), ("1+2=", "#3")]
    assert new["advantages"][8:].tolist() == [0.0] * 3 and bool(new["behaviour_logp"][8:].isnan().all())
    assert new["token_source"][8][:3].tolist() == [SELECTED] * 3
    assert prov.provenance("selected_refinement").behaviour == "unknown"  # no ratio term may claim these tokens
    assert inj.metrics == {"ilf/picked": 3.0, "ilf/selected": 3.0, "ilf/refinement_reward": pytest.approx(4 / 9),
                           "ilf/selected_reward": pytest.approx(2 / 3)}
    # min_score = 1: only the refinements that are right are imitated
    ctx, _ = _ctx(["#7", "#19", "#19", "#1", "#2", "#5", "#3", "#4", "#3"])
    inj = SelectRefinement(attempts=8, refinements=3, min_score=1.0, template="{prompt}[{attempt}]{feedback}:")
    inj.builder, inj.feedback_name = _judge, "sim.py:judge"
    new = _run(inj, ctx)
    assert [_text(_unpad(new["completion_ids"][r], new["completion_mask"][r])) for r in range(8, 10)] == ["#19", "#3"]
    assert len(new["row_source"]) == 10


def test_ilf_selection_helpers_by_hand():
    idx, best = select_best(torch.tensor([0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.5, -1.0, 0.5]), 3)
    assert idx.tolist() == [1, 0, 0] and best.tolist() == [1.0, 0.0, 0.5]  # ties: the first, as np.argmax
    assert (whole_units(5, 3, 2), whole_units(3, 1, 2), whole_units(3, 4, 2), whole_units(0, 3, 2)) == (4, 2, 3, 0)
    ctx, _ = _ctx([])
    rewards = [float(c == "#" + r["answer"]) for r, c in zip(ROWS, COMPS)]
    picks = pick_failed(ctx, _batch(), rewards, 1.0, 2, seed=0)
    assert len(picks) == 2 and set(picks) <= {1, 3, 6} and picks == sorted(picks)
    assert picks == pick_failed(ctx, _batch(), rewards, 1.0, 2, seed=0)  # the run's seed and the step fix the draw
    assert pick_failed(ctx, _batch(), rewards, 1.0, 8, seed=0) == [1, 3, 6]


def test_ilf_preset_trains_only_the_selected_refinements_and_refuses_bad_settings():
    cfg = compose_config(["algo=ilf"])
    inj = build_injection(cfg)
    assert (type(inj), inj.attempts, inj.refinements, inj.min_score) == (SelectRefinement, 8, 5, None)
    assert set(cfg.algo.terms) == {"sft"} and cfg.algo.terms.sft.name == "nll"
    assert list(cfg.algo.terms.sft.tokens) == ["selected_refinement"]
    assert compose_config(["recipe=ilf/arith-tiny"]).model.name == "tiny-bpe"
    with pytest.raises(ConfigError, match="refinements"):
        compose_config(["algo=ilf", "algo.inject.refinements=0"])
    fast = ["trainer.prompts_per_step=4", "algo.num_generations=4", "trainer.micro_batch_size=8"]
    with pytest.raises(ConfigError, match=r"attempts=3 must give every process"):
        compose_config(["algo=ilf", *fast, "algo.inject.attempts=3"])
    with pytest.raises(ConfigError, match="selected_refinement"):  # the selected refinements must be trained
        compose_config(["algo=ilf", "algo.terms.sft.tokens=[on_policy]"])
    with pytest.raises(ConfigError, match=r"lacks \{attempt\}"):
        compose_config(["algo=ilf", "algo.inject.template='{prompt} {feedback}'"])


# ----------------------------------------------------------------------------- the presets' objectives by hand
def _two_rows(second: int, behaviour: float):
    """Row 0: a rollout, 2 tokens, log p -1 (pi_old the same), A = 1; row 1 (provenance ``second``):
    3 tokens, log p -0.5, its recorded behaviour log-prob ``behaviour``, A = -2."""
    logp = torch.tensor([[-1.0, -1.0, 0.0], [-0.5, -0.5, -0.5]], requires_grad=True)
    return dict(logp=logp, mask=torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool),
                token_source=torch.tensor([[prov.ON_POLICY] * 3, [second] * 3]), advantages=torch.tensor([1.0, -2.0]),
                old_logp=logp.detach().clone(), behaviour_logp=torch.tensor([[float("nan")] * 3, [behaviour] * 3]))


def test_fission_preset_trains_rollouts_and_recoveries_with_the_recorded_behaviour():
    """ppo_clip, token-mean over the 5 tokens: rollout tokens l = -A r = -1 (r = 1); recovery tokens
    r = exp(-0.5 - (-0.6)) = e^0.1 (the behaviour recorded under x_corr, not pi_old), A = -2, inside
    the clip range: l = 2 e^0.1. L = (2 (-1) + 3 (2 e^0.1)) / 5; dL/dlog p = -A r / 5 per token."""
    kw = _two_rows(RECOVERY, -0.6)
    loss, _ = compute_objective(build_objective(compose_config(["algo=fission_grpo"])), **kw)
    r = math.exp(0.1)
    assert float(loss.detach()) == pytest.approx((-2 + 6 * r) / 5, rel=1e-5)
    loss.backward()
    assert kw["logp"].grad.flatten().tolist() == pytest.approx([-1 / 5, -1 / 5, 0.0] + [2 * r / 5] * 3, rel=1e-5)


def test_ilf_preset_trains_only_the_selected_refinement_by_its_likelihood():
    """nll, token-mean over the selected refinement's 3 tokens: L = -(-0.5 x 3) / 3 = 0.5, whatever
    the advantages; the rollout (initial output) gets no gradient."""
    kw = _two_rows(SELECTED, float("nan"))
    loss, _ = compute_objective(build_objective(compose_config(["algo=ilf"])), **kw)
    assert float(loss.detach()) == pytest.approx(0.5)
    loss.backward()
    assert kw["logp"].grad.flatten().tolist() == pytest.approx([0.0, 0.0, 0.0] + [-1 / 3] * 3)


# ----------------------------------------------------------------------------- end to end
def _train(recipe, model_path, tmp_path, key, *extra):
    from typer.testing import CliRunner

    from conftest import FAST
    from mixrl.cli.main import app

    res = CliRunner().invoke(app, ["train", f"recipe={recipe}", *FAST, f"model.path={model_path}",
                                   f"run_dir={tmp_path / 'run'}", "data.levels=[4]", "trainer.save_steps=0", *extra])
    assert res.exit_code == 0, res.stdout[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if key in r]


@pytest.mark.slow  # a 2-step training (make test-slow); the mechanism is tested by hand above
def test_fission_toy_recipe_trains_two_steps(tiny_bpe_model_path, tmp_path):
    """Level-4 problems (beyond the barely warm-started model): rollouts fail, each picked failure
    gets its recoveries under its corrective context, and training goes on (4 failures x 2
    recoveries a step here, to keep the test short)."""
    train = _train("fission_grpo/arith-tiny", tiny_bpe_model_path, tmp_path, "fission/instances",
                   "algo.inject.errors=4", "algo.inject.recoveries=2")
    assert len(train) == 2 and all(r["fission/instances"] > 0 for r in train)


@pytest.mark.slow  # a 2-step training (make test-slow); the mechanism is tested by hand above
def test_ilf_toy_recipe_trains_two_steps(tiny_bpe_model_path, tmp_path):
    train = _train("ilf/arith-tiny", tiny_bpe_model_path, tmp_path, "ilf/selected")
    assert len(train) == 2 and all(r["ilf/selected"] > 0 for r in train)
