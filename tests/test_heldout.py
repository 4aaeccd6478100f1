"""Held-out evaluation never uses training rows; ``mixrl eval RUN_DIR`` uses the run's config."""

from __future__ import annotations

import json

import pytest
from datasets import Dataset
from typer.testing import CliRunner

from mixrl.cli.main import app
from mixrl.evaluation.heldout import separate_heldout

runner = CliRunner()


def _rows(n: int, start: int = 0) -> list[dict]:
    return [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(start, start + n)]


def test_a_single_file_is_split_by_the_fixed_rule():
    train = Dataset.from_list(_rows(20))
    same = _rows(8)  # what a single file returns for the 'test' split: its own first rows
    ds, held, info = separate_heldout(train, same, eval_size=8, source="f.jsonl")
    assert info["rule"] == "split" and info["n_eval"] == 4 and info["n_train"] == 16  # min(8, 20% of 20)
    assert not {r["prompt"] for r in held} & set(ds["prompt"])
    assert len(ds) + len(held) == 20
    ds2, held2, info2 = separate_heldout(train, same, eval_size=8, source="f.jsonl")
    assert held2 == held and info2 == info  # the same split every time (and for every run seed)


def test_duplicate_prompts_of_held_out_rows_leave_training():
    rows = _rows(10) + _rows(10)  # every prompt twice
    ds, held, _ = separate_heldout(Dataset.from_list(rows), rows[:5], eval_size=2, source="f")
    assert not {r["prompt"] for r in held} & set(ds["prompt"])
    assert len(ds) == 20 - 2 * 2


def test_separate_splits_are_kept_and_shared_prompts_dropped():
    train = Dataset.from_list(_rows(20))
    ds, held, info = separate_heldout(train, _rows(5, start=100), eval_size=5, source="test.jsonl")
    assert info["rule"] == "separate" and len(held) == 5 and len(ds) == 20
    ds, held, info = separate_heldout(train, _rows(1, start=19) + _rows(4, start=100), eval_size=5, source="t")
    assert info["dropped_shared_prompts"] == 1 and [r["prompt"] for r in held] == [r["prompt"] for r in _rows(4, start=100)]


def test_too_few_rows_to_hold_out_is_one_line():
    from mixrl.errors import DataError

    with pytest.raises(DataError, match="too few to hold any out"):
        separate_heldout(Dataset.from_list(_rows(3)), _rows(3), eval_size=8, source="tiny.jsonl")


@pytest.mark.slow
def test_train_on_one_file_records_the_split_and_eval_uses_the_run_config(fast_overrides, tmp_path):
    src = tmp_path / "data.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in _rows(40, start=1)))
    res = runner.invoke(app, ["train", *fast_overrides, f"data.source={src}", "data.expert_column=null"])
    assert res.exit_code == 0, res.output[-2000:]
    assert "held-out: 8 rows of" in res.stderr and "training on the other 32" in res.stderr
    run_dir = [o for o in fast_overrides if o.startswith("run_dir=")][0].split("=", 1)[1]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["heldout"]["rule"] == "split" and summary["heldout"]["n_eval"] == 8
    assert summary["eval_after"]["n"] == 8

    out = tmp_path / "eval.json"
    res = runner.invoke(app, ["eval", run_dir, "logger.progress=false", "hardware.torch_threads=1", "--out", str(out)])
    assert res.exit_code == 0, res.output[-2000:]
    assert "config.yaml (the run's own, with the overrides)" in res.stderr
    result = json.loads(out.read_text())
    assert result["data"] == str(src) and result["metrics"]["n"] == 8
    assert result["metrics"]["accuracy"] == pytest.approx(summary["eval_after"]["accuracy"])
