"""AMPO's injection (refill_failed): teacher completions enter only groups whose rollouts all
failed, the correct candidates the student finds most likely first; and a short run with a
throwaway teacher."""

from __future__ import annotations

import json

import pytest
import torch

from mixrl.core import provenance as prov
from mixrl.sources import InjectContext, Rollouts
from mixrl.sources.refill_failed import RefillFailed, comprehension
from mixrl.sources.teacher import TEACHER


class _Tok:
    eos_token_id, pad_token_id = 0, 0


def _ctx(rewards_of, candidates, student_logps, process_index=0, G=4, gather=lambda t: t):
    """rewards_of(completion) -> reward; candidates[teacher] -> list of completions; student_logps[tuple(c)] -> logps."""
    generated = []

    def rewards(rows, comps):
        return torch.tensor([rewards_of(tuple(c)) for c in comps], dtype=torch.float32)

    def generate(teacher, prompt_ids, n):
        generated.append((teacher, n))
        return [list(c) for c in candidates[teacher][:n]]

    def score(model, prompts, comps):
        if model == "policy":
            return [student_logps[tuple(c)] for c in comps]
        return [[-0.1 * (k + 1)] * len(c) for k, c in enumerate(comps)]  # the teacher's own log-probs

    ctx = InjectContext(
        tokenizer=_Tok(), process_index=process_index, num_processes=1, num_generations=G, max_completion_length=8,
        global_step=0, micro_step=0, device=torch.device("cpu"), tokenize_prompts=lambda ps: [[9] for _ in ps],
        gather=gather, teachers=["A", "B"], policy="policy", rewards=rewards, generate_with=generate, score_tokens=score,
    )
    return ctx, generated


def test_comprehension_is_the_mean_token_probability():
    import math

    assert comprehension([math.log(0.5), math.log(0.1)]) == pytest.approx(0.3)


def test_only_all_failed_groups_get_the_best_understood_correct_candidates():
    """Two groups of 4: group 0 has a success, group 1 fails everywhere. Teachers A and B give
    2 candidates each; (7,) is wrong; among the correct ones the student likes (6,) best, then
    (5,), then (8,). k = 2: group 1's slots 2 and 3 get (6,) and (5,), in that order."""
    good = {(5, 0), (6, 0), (8, 0), (1, 1)}
    cands = {"A": [(5, 0), (7, 0)], "B": [(6, 0), (8, 0)]}
    student = {(5, 0): [-0.5, -0.5], (6, 0): [-0.1, -0.1], (8, 0): [-2.0, -2.0]}
    ctx, generated = _ctx(lambda c: 1.0 if c in good else 0.0, cands, student)
    rows = [{"prompt": "p0"}] * 4 + [{"prompt": "p1"}] * 4
    completions = [[1, 1], [2, 2], [2, 2], [2, 2], [3, 3], [3, 3], [3, 3], [3, 3]]
    rollouts = Rollouts([list(c) for c in completions], [[-1.0, -1.0]] * 8, [prov.ON_POLICY] * 8)
    inj = RefillFailed(per_group=2, candidates=2)
    out = inj.after_generation(ctx, rows, rollouts)
    assert out.completion_ids[:6] == completions[:6]  # group 0 untouched; group 1's first two rollouts kept
    assert out.completion_ids[6] == [6, 0] and out.completion_ids[7] == [5, 0]
    assert out.row_source == [prov.ON_POLICY] * 6 + [TEACHER, TEACHER]
    assert out.logprobs[6] == [None, None]  # not the policy's sampling log-probs
    assert out.behaviour_logp[6] == pytest.approx([-0.1, -0.1]) and out.behaviour_logp[7] == pytest.approx([-0.1, -0.1])
    assert generated == [("A", 2), ("B", 2)]  # one failed prompt: each teacher asked once
    assert inj.metrics() == {"ampo/failed_groups": 1.0, "ampo/refilled_rows": 2.0, "ampo/candidates": 4.0,
                             "ampo/correct_candidates": 3.0}


def test_without_a_correct_candidate_the_group_keeps_its_rollouts():
    ctx, _ = _ctx(lambda c: 0.0, {"A": [(5, 0)], "B": [(6, 0)]}, {})
    rollouts = Rollouts([[3]] * 4, None, [prov.ON_POLICY] * 4)
    out = RefillFailed(per_group=1, candidates=1).after_generation(ctx, [{"prompt": "p"}] * 4, rollouts)
    assert out.row_source == [prov.ON_POLICY] * 4 and out.completion_ids == [[3]] * 4


def test_select_first_keeps_the_teachers_order():
    cands = {"A": [(5, 0)], "B": [(6, 0)]}
    ctx, _ = _ctx(lambda c: 1.0 if c[0] in (5, 6) else 0.0, cands, {(5, 0): [-3.0, -3.0], (6, 0): [0.0, 0.0]})
    rollouts = Rollouts([[3]] * 4, None, [prov.ON_POLICY] * 4)
    out = RefillFailed(per_group=1, candidates=1, select="first").after_generation(ctx, [{"prompt": "p"}] * 4, rollouts)
    assert out.completion_ids[3] == [5, 0]


def test_groups_straddling_processes_use_the_global_slot():
    """6 local rows on process 1 of 2, groups of 4: global rows 6..11; local rows 0-1 are slots
    2-3 of group 1, rows 2-5 group 2. Every rollout fails; k = 1 fills slot 3 of each group."""
    ctx, _ = _ctx(lambda c: 1.0 if c == (5, 0) else 0.0, {"A": [(5, 0)], "B": []}, {(5, 0): [-0.1, -0.1]}, process_index=1,
                  gather=lambda t: torch.cat([torch.zeros(6), t]))  # process 0's 6 rows failed too
    rollouts = Rollouts([[3]] * 6, None, [prov.ON_POLICY] * 6)
    out = RefillFailed(per_group=1, candidates=1).after_generation(ctx, [{"prompt": "p"}] * 6, rollouts)
    assert [s == TEACHER for s in out.row_source] == [False, True, False, False, False, True]


def test_the_student_scores_every_failed_group_in_one_call_made_even_with_none():
    """Under a sharded policy (FSDP, ZeRO-3) each forward needs every process, so the policy is
    asked once per batch on every process: the candidates of all failed groups together (here
    two groups, 2 correct candidates each), and with an empty list where no group failed."""
    calls = []
    cands = {"A": [(5, 0), (6, 0)], "B": []}
    student = {(5, 0): [-2.0, -2.0], (6, 0): [-0.1, -0.1]}
    ctx, _ = _ctx(lambda c: 1.0 if c in student else 0.0, cands, student)
    score = ctx.score_tokens

    def counted(model, prompts, comps):
        if model == "policy":
            calls.append([tuple(c) for c in comps])
        return score(model, prompts, comps)

    ctx.score_tokens = counted
    rollouts = Rollouts([[3]] * 8, None, [prov.ON_POLICY] * 8)
    out = RefillFailed(per_group=1, candidates=2).after_generation(ctx, [{"prompt": "p0"}] * 4 + [{"prompt": "p1"}] * 4, rollouts)
    assert calls == [[(5, 0), (6, 0), (5, 0), (6, 0)]]
    assert out.completion_ids[3] == out.completion_ids[7] == [6, 0]  # each group still gets its best-understood candidate
    calls.clear()
    solved = Rollouts([[5, 0]] * 8, None, [prov.ON_POLICY] * 8)
    out = RefillFailed(per_group=1, candidates=2).after_generation(ctx, [{"prompt": "p0"}] * 8, solved)
    assert calls == [[]] and out.row_source == [prov.ON_POLICY] * 8


def test_per_group_must_leave_a_rollout():
    from mixrl.config.geometry import geometry
    from mixrl.config.compose import compose_config
    from mixrl.errors import ConfigError

    with pytest.raises(ConfigError, match="per_group"):
        RefillFailed(per_group=8, geometry=geometry(compose_config(["algo=ampo"])))


@pytest.mark.slow  # trains a throwaway teacher (60 steps) first, ~30 s: `make test-slow`
def test_ampo_trains_with_a_throwaway_teacher(tiny_model_path, tmp_path, fast_overrides):
    """Levels 5-6 (the tiny student fails them): teacher rows enter failed groups and are trained."""
    from typer.testing import CliRunner

    from mixrl.cli.main import app
    from mixrl.models import tiny

    teacher = tiny.teacher_warm_start(tmp_path / "teacher", steps=60, progress=False)
    res = CliRunner().invoke(app, ["train", "algo=ampo", *fast_overrides, "data.levels=[5,6]", "trainer.save_steps=0",
                                   f"teacher.source.models=[{teacher}]", "algo.inject.candidates=4", "algo.inject.per_group=1"])
    assert res.exit_code == 0, res.stdout[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["ampo/failed_groups"] >= 1 for r in rows)
    assert sum(r["ampo/candidates"] for r in rows) > 0
    # a refilled row is a teacher row the shaped term trains on
    for r in rows:
        assert r["teacher/rows"] == r["ampo/refilled_rows"]
        if r["ampo/refilled_rows"]:
            assert "loss/offpolicy" in r and r["teacher/token_prob"] > 0


# ----------------------------------------------------------------------------- adaptive k (issue 49)
def _three_teachers(rewards: list[float]):
    """Groups of 8 with the given rewards; teachers A, B, C give one correct candidate each, the
    student liking A's best, then B's, then C's."""
    cands = {"A": [(5, 0)], "B": [(6, 0)], "C": [(7, 0)]}
    student = {(5, 0): [-0.1, -0.1], (6, 0): [-0.5, -0.5], (7, 0): [-2.0, -2.0]}
    reward_of = {(5, 0): 1.0, (6, 0): 1.0, (7, 0): 1.0}
    ids = [[100 + i] for i in range(len(rewards))]
    for i, r in enumerate(rewards):
        reward_of[(100 + i,)] = r
    ctx, _ = _ctx(lambda c: reward_of[c], cands, student, G=8)
    ctx.teachers = ["A", "B", "C"]
    return ctx, Rollouts([list(c) for c in ids], None, [prov.ON_POLICY] * len(rewards))


# rewards with AMPO's format term: 1.0 correct + formatted, 0.9 correct, 0.1 wrong + formatted, 0.0 wrong;
# the authors' "correct" is r > 0.1 + 0.5 (mix_dapo_trainer.py:1391), threshold 0.6 here
GROUPS = [[1.0, 0.9, 1.0, 0.1, 1.0, 0.9, 0.0, 0.1],   # 5 correct of 8: rate 0.625 >= 0.5, not guided
          [0.9, 0.1, 0.0, 0.0, 0.1, 0.0, 0.0, 0.0],   # 1 correct: k = min(3 teachers, int(8 * 0.5 - 1)) = 3
          [1.0, 0.0, 0.9, 0.1, 1.0, 0.0, 0.0, 0.0],   # 3 correct: k = min(3, int(4 - 3)) = 1
          [0.0] * 8]                                   # 0 correct: k = min(3, 4) = 3


def test_adaptive_k_guides_groups_below_half_success_with_4_minus_correct_teachers():
    """The authors' use_adaptive_k (EnigmaYYYY/AMPO @ 647e2e4, mix_dapo_trainer.py:1396-1401):
    a group whose success rate is below 0.5 is guided, effective_k = min(num_teacher_models,
    int(n * 0.5 - len(correct_positions))), then min(effective_k, num_incorrect) failed rollouts
    (line 1453) are replaced, the best-understood candidate first. Here: group 1 -> its last 3
    failed slots 5, 6, 7 get A, B, C; group 2 -> slot 7 gets A; group 3 -> slots 5, 6, 7."""
    ctx, rollouts = _three_teachers([r for g in GROUPS for r in g])
    inj = RefillFailed(threshold=0.6, guide_below=0.5, adaptive_k=True, candidates=1)
    out = inj.after_generation(ctx, [{"prompt": f"p{i // 8}"} for i in range(32)], rollouts)
    teacher_rows = {i: tuple(out.completion_ids[i]) for i in range(32) if out.row_source[i] == TEACHER}
    assert teacher_rows == {8 + 5: (5, 0), 8 + 6: (6, 0), 8 + 7: (7, 0),
                            16 + 7: (5, 0),
                            24 + 5: (5, 0), 24 + 6: (6, 0), 24 + 7: (7, 0)}
    assert inj.metrics()["ampo/failed_groups"] == 3.0 and inj.metrics()["ampo/refilled_rows"] == 7.0


def test_the_earlier_preset_guides_only_all_failed_groups_with_per_group_rows():
    """guide_below=null, adaptive_k=false (the override that restores mixrl's earlier preset):
    only group 3 (no success) is guided, its last per_group = 2 slots replaced."""
    ctx, rollouts = _three_teachers([r for g in GROUPS for r in g])
    out = RefillFailed(threshold=0.6, per_group=2, candidates=1).after_generation(
        ctx, [{"prompt": f"p{i // 8}"} for i in range(32)], rollouts)
    assert [i for i in range(32) if out.row_source[i] == TEACHER] == [30, 31]
    assert out.completion_ids[30] == [5, 0] and out.completion_ids[31] == [6, 0]


def test_a_rate_without_adaptive_k_replaces_per_group_failed_rollouts():
    """guide_below=0.5 with a fixed k (the authors' use_adaptive_k=False with pass_num=4:
    effective_k = min(num_teachers, n_prefix)): groups 1, 2, 3 each get 2 rows in failed slots."""
    ctx, rollouts = _three_teachers([r for g in GROUPS for r in g])
    out = RefillFailed(threshold=0.6, per_group=2, candidates=1, guide_below=0.5).after_generation(
        ctx, [{"prompt": f"p{i // 8}"} for i in range(32)], rollouts)
    assert [i for i in range(32) if out.row_source[i] == TEACHER] == [14, 15, 22, 23, 30, 31]


def test_plan_never_replaces_a_success_and_adaptive_k_needs_a_rate():
    from mixrl.errors import ConfigError

    inj = RefillFailed(guide_below=0.5, adaptive_k=True)
    # 3 correct in slots 5-7: k = min(4 teachers, 1) -> the last failed slot is 4, not a success
    assert inj.plan([False] * 5 + [True] * 3, n_teachers=4) == [4]
    # 1 correct, 2 teachers: k = min(2, 3) = 2
    assert inj.plan([True] + [False] * 7, n_teachers=2) == [6, 7]
    with pytest.raises(ConfigError, match="adaptive_k=true needs algo.inject.guide_below"):
        RefillFailed(adaptive_k=True)
    with pytest.raises(ConfigError, match="guide_below"):
        RefillFailed(guide_below=1.5)
