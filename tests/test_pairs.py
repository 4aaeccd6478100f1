"""Preference pairs in the RL batch (mixrl.sources.pairs): the pairs source, the on-policy pair
builder, the rows and links it appends, the config checks, and two training steps of every
preference algo (``mixrl train algo=simplemix``, wpo, hypo, rpo, grpo_dpo) through the CLI."""

from __future__ import annotations

import json
import math
import random
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from mixrl.cli.main import app
from mixrl.config.compose import compose_config
from mixrl.config.geometry import geometry
from mixrl.core import provenance as prov
from mixrl.errors import ConfigError, DataError
from mixrl.sources import InjectContext
from mixrl.sources.pairs import PAIR_OFF_POLICY, PAIR_ON_POLICY, GroupPairs, MixedPairs, PairSource
from mixrl.tasks import arith

ALGOS = ["simplemix", "wpo", "hypo", "rpo", "grpo_dpo"]


# --------------------------------------------------------------------------- the source
def _arith_rows(n=6):
    from datasets import Dataset

    rows = arith.train_split(n, seed=0, levels=[2, 3])
    return Dataset.from_list([{**r, "expert": [r["solution"]]} for r in rows])


def test_builtin_pairs_are_expert_over_careless_solution():
    ds = _arith_rows()
    src = PairSource()
    src.prepare(ds, SimpleNamespace(source="builtin:arith", system_prompt=None))
    assert src.rejected_from == "arith_careless" and len(src.pool) == len(ds)
    for (prompt, chosen, rejected), row in zip(src.pool, ds):
        assert prompt == row["prompt"] and chosen == row["solution"]
        assert arith.verify(chosen, row["answer"]) and not arith.verify(rejected, row["answer"])
        assert rejected == arith.careless_solution(row)


def test_pairs_from_a_file_with_a_column_mapping(tmp_path):
    f = tmp_path / "prefs.jsonl"
    rows = [{"question": "1+2=", "good": "3 #### 3", "bad": "1 #### 1"},
            {"question": "2+2=", "good": [{"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4 #### 4"}],
             "bad": "2 #### 2"},
            {"question": "5+1=", "good": "6 #### 6", "bad": None}]  # no rejected side: no pair
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    src = PairSource(dataset=str(f), prompt_column="question", chosen_column="good", rejected_column="bad")
    src.prepare(None, SimpleNamespace(source="builtin:arith", system_prompt=None))
    assert src.pool == [("1+2=", "3 #### 3", "1 #### 1"), ("2+2=", "4 #### 4", "2 #### 2")]
    picks = src.sample(random.Random(0), 5)
    assert len(picks) == 5 and all(p in src.pool for p in picks)


def test_a_missing_pair_column_names_the_key_to_set(tmp_path):
    f = tmp_path / "prefs.jsonl"
    f.write_text(json.dumps({"prompt": "1+2=", "chosen": "3", "worse": "1"}) + "\n")
    with pytest.raises(DataError, match="offpolicy.source.rejected_column"):
        PairSource(dataset=str(f)).prepare(None, SimpleNamespace(source="x", system_prompt=None))
    with pytest.raises(DataError, match="offpolicy.source.dataset"):
        PairSource(dataset=str(tmp_path / "missing.jsonl")).prepare(None, SimpleNamespace(source="x", system_prompt=None))
    with pytest.raises(DataError, match="rejected_column"):
        PairSource(rejected_from="column").prepare(_arith_rows(), SimpleNamespace(source="builtin:arith", system_prompt=None))


def test_zero_margin_pairs_are_dropped_and_counted_from_a_file_and_from_the_training_rows(tmp_path):
    """A pair whose chosen and rejected completions are the same text (surrounding whitespace aside)
    trains the preference terms on a zero margin: dropped, from a file as from the training rows,
    and the source's note says how many (``mixrl train`` prints it before the run starts)."""
    f = tmp_path / "prefs.jsonl"
    rows = [{"prompt": "1+2=", "chosen": "3 #### 3", "rejected": "3 #### 3 "},  # the same text: dropped
            {"prompt": "2+2=", "chosen": "4 #### 4", "rejected": "2 #### 2"},
            {"prompt": "5+1=", "chosen": "6 #### 6", "rejected": None}]  # no rejected side: dropped
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    src = PairSource(dataset=str(f))
    src.prepare(None, SimpleNamespace(source="x", system_prompt=None))
    assert src.pool == [("2+2=", "4 #### 4", "2 #### 2")]
    assert src.notes == (f"pairs source: 1 pair(s) from {f}; dropped 1 row(s) without a chosen or a rejected completion "
                         "and 1 pair(s) whose chosen and rejected completions are the same text (a zero margin)",)
    assert src.texts() == ["2+2=", "4 #### 4", "2 #### 2"]
    ds = _arith_rows(4).add_column("worse", [r["solution"] for r in _arith_rows(4)][:2] + ["0 #### 0", "1 #### 1"])
    rows_src = PairSource(rejected_from="column", rejected_column="worse")
    rows_src.prepare(ds, SimpleNamespace(source="x", system_prompt=None))
    assert len(rows_src.pool) == 2 and "dropped 2 pair(s) whose chosen and rejected" in rows_src.notes[0]
    f.write_text(json.dumps(rows[0]) + "\n")
    with pytest.raises(DataError, match="every pair's chosen and rejected completions are the same text"):
        PairSource(dataset=str(f)).prepare(None, SimpleNamespace(source="x", system_prompt=None))


@pytest.mark.parametrize("cell, words", [
    ({"chosen": 5}, "row 0 of .*: 'chosen' holds an int, expected a string.*offpolicy.source.chosen_column"),
    ({"rejected": [1, 2]}, "row 0 of .*: 'rejected' holds a list with an int.*offpolicy.source.rejected_column"),
])
def test_a_pair_cell_of_another_type_is_one_line_naming_the_row(tmp_path, cell, words):
    f = tmp_path / "prefs.jsonl"
    f.write_text(json.dumps({"prompt": "1+2=", "chosen": "3", "rejected": "1", **cell}) + "\n")
    with pytest.raises(DataError, match=words):
        PairSource(dataset=str(f)).prepare(None, SimpleNamespace(source="x", system_prompt=None))


# --------------------------------------------------------------------------- the injections
class _Tok:
    eos_token_id, pad_token_id = 0, 0

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % 50 + 1 for c in text]}


def _policy_lp(prompts, completions):  # a fake "policy now": -0.1 per token
    return [[-0.1] * len(c) for c in completions]


def _ref_lp(prompts, completions):  # a fake reference: -0.3 per token
    return [[-0.3] * len(c) for c in completions]


def _ctx(G=4):
    return InjectContext(
        tokenizer=_Tok(), process_index=0, num_processes=1, num_generations=G, max_completion_length=16,
        global_step=3, micro_step=0, device=torch.device("cpu"),
        tokenize_prompts=lambda ps: [[ord(c) % 50 + 1 for c in p] for p in ps], gather=lambda t: t,
        behaviour_logps=_policy_lp, ref_logps=_ref_lp,
    )


def _scored_batch(rewards, lengths, G=4):
    """A scored local batch as the trainer leaves it after advantages: groups of G rollouts."""
    n, width = len(rewards), max(lengths)
    comp = torch.zeros(n, width, dtype=torch.long)
    mask = torch.zeros(n, width, dtype=torch.long)
    for i, L in enumerate(lengths):
        comp[i, :L] = torch.arange(1, L + 1) + 10 * i
        mask[i, :L] = 1
    return {
        "prompt_ids": torch.tensor([[0, 7, 8]] * n), "prompt_mask": torch.tensor([[0, 1, 1]] * n),
        "completion_ids": comp, "completion_mask": mask,
        "advantages": torch.zeros(n), "row_source": torch.full((n,), prov.ON_POLICY),
        "token_source": torch.full((n, width), prov.ON_POLICY), "behaviour_logp": torch.full((n, width), float("nan")),
        "group_id": torch.arange(n) // G, "mixrl_reward": torch.tensor(rewards, dtype=torch.float32),
        "ref_per_token_logps": torch.full((n, width), -0.5),
        "old_per_token_logps": torch.full((n, width), -0.2),
    }


def test_group_pairs_take_best_and_worst_and_skip_ties():
    # group 0: rewards 0,1,0,1 -> (row 1, row 0); group 1: all 1 -> tied, no pair
    out = _scored_batch([0, 1, 0, 1, 1, 1, 1, 1], [2, 3, 4, 2, 3, 3, 3, 3])
    inj = GroupPairs(pairs=4)
    new = inj.after_advantages(_ctx(), [], out)
    assert inj.metrics == {"pairs/tied_groups": 1.0, "pairs/on_policy": 1.0, "pairs/off_policy": 0.0}
    assert new["completion_ids"].shape[0] == 10
    # the appended pair: the best rollout (row 1, 3 tokens) then the worst (row 0, 2 tokens)
    assert new["completion_ids"][8, :3].tolist() == out["completion_ids"][1, :3].tolist()
    assert new["completion_ids"][9, :2].tolist() == out["completion_ids"][0, :2].tolist()
    assert new["row_source"][8:].tolist() == [PAIR_ON_POLICY] * 2
    assert new["pair_index"].tolist() == [-1] * 8 + [0, 0] and new["pair_side"].tolist() == [-1] * 8 + [1, 0]
    assert new["group_id"][8:].tolist() == [-1, -1] and new["advantages"][8:].tolist() == [0.0, 0.0]
    # links: each side carries its partner's sequence log-prob under the policy now and the reference
    assert new["pair_partner_logp"][8:].tolist() == pytest.approx([-0.2, -0.3])
    assert new["pair_partner_ref_logp"][8:].tolist() == pytest.approx([-1.0, -1.5])
    assert new["pair_partner_len"][8:].tolist() == [2.0, 3.0]
    # reference log-probs of the new rows: the rollouts' own (TRL computed them); behaviour: their old log-probs
    assert new["ref_per_token_logps"][8, :3].tolist() == pytest.approx([-0.5] * 3)
    assert new["behaviour_logp"][9, :2].tolist() == pytest.approx([-0.2, -0.2])
    assert torch.isnan(new["behaviour_logp"][9, 2:]).all()


def test_group_pairs_skip_groups_holding_other_rows_and_when_all_tie():
    out = _scored_batch([1, 0, 1, 0, 0, 0, 0, 0], [2] * 8)
    out["row_source"][2] = prov.EXPERT  # group 0 holds an expert row (LUFFY-style): not a pair of rollouts
    inj = GroupPairs(pairs=4)
    new = inj.after_advantages(_ctx(), [], out)
    assert new is out and inj.metrics["pairs/on_policy"] == 0.0 and inj.metrics["pairs/tied_groups"] == 1.0


def test_mixed_pairs_keep_the_stated_ratio_and_whole_micro_batches():
    cfg = compose_config(["algo=simplemix", "trainer.prompts_per_step=3", "algo.num_generations=4", "trainer.micro_batch_size=4"])
    geom = geometry(cfg)
    assert geom.grad_accum == 3
    src = PairSource()
    src.pool = [("1+2=", "3 #### 3", "1 #### 1")]
    # 2 on-policy + 2 off-policy pairs wanted; 3 micro-batches: 2k rows split in 3 needs k % 3 == 0
    inj = MixedPairs(pairs=4, on_policy=0.5, source=src, geometry=geom)
    out = _scored_batch([0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1], [2] * 12)
    new = inj.after_advantages(_ctx(), [], out)
    assert inj.metrics["pairs/on_policy"] == 1.0 and inj.metrics["pairs/off_policy"] == 2.0  # one on-policy pair dropped
    assert (new["completion_ids"].shape[0] - 12) % 3 == 0
    assert new["row_source"][12:].tolist() == [PAIR_ON_POLICY] * 2 + [PAIR_OFF_POLICY] * 4
    assert torch.isnan(new["behaviour_logp"][14:]).all()  # off-policy: behaviour unknown
    # off-policy rows: reference log-probs from the reference model (the fake: -0.3 per token)
    assert new["ref_per_token_logps"][14, :8].tolist() == pytest.approx([-0.3] * 8)
    assert set(MixedPairs(pairs=4, on_policy=0.0).provenances) == {"pair_off_policy"}
    assert set(MixedPairs(pairs=4, on_policy=1.0).provenances) == {"pair_on_policy"}


# --------------------------------------------------------------------------- config checks
@pytest.mark.parametrize("overrides,match", [
    (["algo=simplemix", "algo.inject.on_policy=1.5"], "on_policy"),
    (["algo=simplemix", "algo.terms.dpo.beta=0"], "beta"),
    (["algo=simplemix", "offpolicy=expert"], "offpolicy=pairs"),
    (["algo=simplemix", "algo.terms.dpo.aggregation={name: token-mean}"], "seq-mean-token-sum"),
    (["algo=chord", "+algo.terms.pref={name: dpo, tokens: [expert]}"], "reference log-probs"),
    (["algo=grpo_dpo", "algo.terms.dpo.tokens=[pair_off_policy]"], "nothing puts them in the batch"),
])
def test_contradictory_pair_configs_are_refused(overrides, match):
    with pytest.raises(ConfigError, match=match):
        compose_config(overrides)


def test_pair_terms_average_over_pairs_by_default():
    from mixrl.config.builders import build_objective

    cfg = compose_config(["algo=grpo_dpo"])
    terms = {t.label: t for t in build_objective(cfg).terms}
    assert terms["dpo"].aggregation == "seq-mean-token-sum" and terms["policy"].aggregation == "token-mean"
    assert terms["dpo"].weight == "lam" and cfg.algo.coefs.lam == 0.1


# --------------------------------------------------------------------------- training
runner = CliRunner()


@pytest.mark.slow
@pytest.mark.parametrize("algo", ALGOS)
def test_preference_recipe_trains_two_steps(algo, fast_overrides):
    run_dir = next(o for o in fast_overrides if o.startswith("run_dir=")).split("=", 1)[1]
    res = runner.invoke(app, ["train", f"algo={algo}", *fast_overrides, "trainer.eval_size=0"])  # the embedded default task
    assert res.exit_code == 0, (res.stdout[-1500:], res.stderr[-1500:] if res.stderr else "", res.exception)
    from pathlib import Path

    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert len(rows) == 2
    term = {"simplemix": "dpo", "wpo": "wpo", "hypo": "dpo", "rpo": "rpo", "grpo_dpo": "dpo"}[algo]
    first = rows[0]
    assert math.isfinite(first[f"loss/{term}"])
    if algo != "rpo" and (first["pairs/on_policy"] + first["pairs/off_policy"]) > 0:
        # step 1: the policy is the reference, so every pair's margin is 0 whichever micro-batch
        # each side landed in (the recorded partner values equal the live ones)
        assert abs(first[f"{term}/margin"]) < 1e-4
        if algo in ("simplemix", "hypo", "grpo_dpo"):
            assert first[f"loss/{term}"] == pytest.approx(math.log(2.0), abs=1e-4)
    if algo == "simplemix":
        assert first["pairs/off_policy"] == 4.0 and first["pair_off_policy/rows"] == 8.0
    if algo == "hypo":
        assert first["seq_kl"] == pytest.approx(0.0, abs=1e-4) and "loss/online_kl" in first
    if algo == "grpo_dpo":
        assert "loss/policy" in first and first["pairs/off_policy"] == 0.0
