"""AMPO with the authors' pre-generated teacher answers (refill_from_data, issue 49).

The authors (EnigmaYYYY/AMPO @ 647e2e4de7f0bdcd2787fa9941d4dbc317facb7e) read 4 long-CoT answers per
prompt from their training file's ``target_lst`` (ampo/verl/verl/adaptive_mix_src/
rl_dataset_with_target.py:83, 186-207: records {content, source, quality_score}), rank a guided
group's answers by the student's mean token probability (mix_dapo_trainer.py:1500-1545), take the
top k = min(#answers, int(8 / 2 - #correct)) (1378, 1397-1401, 1558) into k failed slots
(1453-1457, 1586-1631), and inject them whether right or wrong (1608-1613). Expected values below
are worked out by hand on hand-built batches.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from mixrl.config.compose import compose_config
from mixrl.core import provenance as prov
from mixrl.errors import ConfigError
from mixrl.sources import InjectContext, Rollouts
from mixrl.sources.expert import ExpertSource
from mixrl.sources.refill_data import RefillFromData

FIXTURE = Path(__file__).parent / "fixtures" / "ampo_openr1_4longcots.jsonl"
EXPERT = prov.code("expert")


class _Tok:
    eos_token_id, pad_token_id = 0, 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


def _ids(s):
    return [ord(c) for c in s] + [0]  # ctx.completion_ids appends eos


# the student's mean token probability of each written answer (comprehension): b 0.9, c 0.5, a 0.2, d 0.7
LIKES = {"b": 0.9, "c": 0.5, "a": 0.2, "d": 0.7}
RIGHT = {"b", "c", "d"}  # "a" is a wrong answer


def _ctx(rollout_rewards, G=8, gather=lambda t: t, process_index=0):
    calls = []

    def rewards(rows, comps):
        out = []
        for c in comps:
            text = "".join(chr(i) for i in c if i)
            out.append(rollout_rewards[text] if text in rollout_rewards else (1.0 if text in RIGHT else 0.0))
        return torch.tensor(out, dtype=torch.float32)

    def score(model, prompts, comps):
        assert model == "policy"
        calls.append(["".join(chr(i) for i in c if i) for c in comps])
        return [[math.log(LIKES["".join(chr(i) for i in c if i)])] * len(c) for c in comps]

    ctx = InjectContext(tokenizer=_Tok(), process_index=process_index, num_processes=1, num_generations=G,
                        max_completion_length=16, global_step=0, micro_step=0, device=torch.device("cpu"),
                        tokenize_prompts=lambda ps: [[9] for _ in ps], gather=gather, policy="policy",
                        rewards=rewards, score_tokens=score)
    return ctx, calls


# rewards with AMPO's format term (the recipe's threshold 0.6 = their format_coefficient + 0.5, line 1391):
# 5 correct of 8 (not guided); 1 correct (k = min(3 answers, int(4 - 1)) = 3); 3 correct (k = min(3, 1) = 1);
# none correct, but the row has only 2 answers (k = min(2, 4) = 2)
GROUPS = [[1.0, 0.9, 1.0, 0.1, 1.0, 0.9, 0.0, 0.1],
          [0.9, 0.1, 0.0, 0.0, 0.1, 0.0, 0.0, 0.0],
          [1.0, 0.0, 0.9, 0.1, 1.0, 0.0, 0.0, 0.0],
          [0.0] * 8]
ANSWERS = [["a", "b", "c"], ["a", "b", "c"], ["a", "b", "c"], ["d", "a"]]


def _batch(**kw):
    texts = [f"r{g}{s}" for g in range(4) for s in range(8)]
    ctx, calls = _ctx({t: GROUPS[g][s] for t, (g, s) in zip(texts, [(g, s) for g in range(4) for s in range(8)])})
    rows = [{"prompt": f"p{g}", "expert": ANSWERS[g]} for g in range(4) for _ in range(8)]
    rollouts = Rollouts([_ids(t)[:-1] for t in texts], [[-1.0] * 3] * 32, [prov.ON_POLICY] * 32)
    inj = RefillFromData(threshold=0.6, guide_below=0.5, adaptive_k=True, source=ExpertSource(), **kw)
    return inj.after_generation(ctx, rows, rollouts), inj, calls


def test_guided_groups_get_the_best_understood_written_answers_right_or_wrong():
    """Group 1: k = 3 of its answers a, b, c ranked by the student (b 0.9, c 0.5, a 0.2) fill its last
    3 failed slots 5, 6, 7 (the wrong a too: the authors inject whether right or wrong); group 2: k = 1,
    b in slot 7; group 3: k = min(2 answers, 4) = 2, d (0.7) then a in slots 6, 7; group 0 is not guided."""
    out, inj, calls = _batch()
    written = {i: "".join(chr(c) for c in out.completion_ids[i] if c) for i in range(32) if out.row_source[i] == EXPERT}
    assert written == {8 + 5: "b", 8 + 6: "c", 8 + 7: "a", 16 + 7: "b", 24 + 6: "d", 24 + 7: "a"}
    assert out.completion_ids[13] == _ids("b")  # eos appended (the authors' _process_target add_eos)
    assert out.logprobs[13] == [None, None] and out.behaviour_logp[13] is None  # written: no behaviour probability
    assert all(out.row_source[i] == prov.ON_POLICY for i in range(8))
    # the student scored every guided group's answers in one call
    assert calls == [["a", "b", "c", "a", "b", "c", "d", "a"]]
    assert inj.metrics() == {"ampo/failed_groups": 3.0, "ampo/refilled_rows": 6.0, "ampo/candidates": 8.0,
                             "ampo/correct_candidates": 5.0}


def test_verify_keeps_only_the_right_answers():
    """verify=true (not the authors'): group 1's a is dropped, so its 3 slots get b, c and slot 7 keeps
    its rollout; group 3 gets d only (slot 6), slot 7 keeps its rollout."""
    out, _, _ = _batch(verify=True)
    written = {i: "".join(chr(c) for c in out.completion_ids[i] if c) for i in range(32) if out.row_source[i] == EXPERT}
    assert written == {8 + 5: "b", 8 + 6: "c", 16 + 7: "b", 24 + 6: "d"}


def test_a_row_without_answers_keeps_its_rollouts_and_counts_are_gathered():
    """k's cap is each row's number of answers, gathered over processes: a process whose rows have none
    plans nothing for them."""
    ctx, _ = _ctx({"x": 0.0}, G=4)
    rollouts = Rollouts([_ids("x")[:-1]] * 4, None, [prov.ON_POLICY] * 4)
    inj = RefillFromData(guide_below=0.5, adaptive_k=True, source=ExpertSource())
    out = inj.after_generation(ctx, [{"prompt": "p", "expert": []}] * 4, rollouts)
    assert out.row_source == [prov.ON_POLICY] * 4
    assert inj.writers(ctx, [{"prompt": "p", "expert": ["a", "b"]}, {"prompt": "p", "expert": []}], 2) == [2, 0]


def test_the_data_option_reads_the_authors_target_lst_one_answer_per_record(tmp_path):
    """conf/data/ampo-openr1-4longcots.yaml on a local fixture in the schema the authors' reader takes
    (tests/fixtures/ampo_openr1_4longcots.jsonl, also written to parquet as their prepare_train.py does):
    target_lst's records become the row's expert completions, in order (3 per row here)."""
    import pandas as pd

    from mixrl.data.loading import load_dataset_rows

    d = compose_config(["data=ampo-openr1-4longcots"]).data
    assert (d.source, d.expert_column, d.answer_column) == ("SII-Enigma/OpenR1-Math-4LongCoTs-8.5k", "target_lst",
                                                          "reward_model.ground_truth")
    raw = pd.read_json(FIXTURE, lines=True)
    parquet = tmp_path / "openr1_math_4longcots.parquet"
    raw.to_parquet(parquet)
    for path in (FIXTURE, parquet):
        rows = load_dataset_rows(str(path), split=d.split, prompt_column=d.prompt_column, answer_column=d.answer_column,
                                 expert_column=d.expert_column)
        assert len(rows) == len(raw)
        for got, want in zip(rows, raw.to_dict("records")):
            assert got["expert"] == [t["content"] for t in want["target_lst"]] and len(got["expert"]) == 3
            assert got["answer"] == want["reward_model"]["ground_truth"]
            assert [m["role"] for m in got["prompt"]] == ["system", "user"]


def test_the_recipe_uses_the_data_s_answers_and_the_toy_keeps_its_online_teacher():
    cfg = compose_config(["recipe=ampo/qwen2.5-7b-instruct-openr1"])
    assert cfg.algo.inject.name == "refill_from_data" and cfg.offpolicy.name == "expert" and cfg.teacher.name == "none"
    assert cfg.algo.inject.verify is False and cfg.algo.terms.offpolicy.tokens == ["expert"]
    toy = compose_config(["recipe=ampo/arith-tiny"])
    assert toy.algo.inject.name == "refill_failed" and toy.teacher.name == "tiny"
    with pytest.raises(ConfigError, match="offpolicy"):  # the answers come through the expert source
        compose_config(["algo=ampo", "algo.inject.name=refill_from_data", "teacher=none",
                        "algo.terms.offpolicy.tokens=[expert]", "algo.terms.offpolicy.normalise_over=[on_policy,expert]",
                        "algo.terms.policy.normalise_over=[on_policy,expert]"])
