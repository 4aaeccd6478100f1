"""``samples.jsonl`` and ``mixrl samples RUN_DIR``: what the model writes, with each row's source.

Unit tests on hand-built batches and files (milliseconds), the trackers' tables (a stand-in
W&B module, a real TensorBoard event file), and short training runs of two source families
(expert rows: CHORD with TensorBoard; prefix continuations: Prefix-RFT) read back through the
command."""

from __future__ import annotations

import importlib.util
import json
import types

import pytest
import torch
from typer.testing import CliRunner

from mixrl.cli.main import app
from mixrl.core import provenance as prov
from mixrl.sources import prefix as _prefix  # noqa: F401  (registers the "prefix" provenance)
from mixrl.sources import replay as _replay  # noqa: F401  (registers the "replay" provenance)
from mixrl.trainer.callbacks import publish_samples
from mixrl.trainer.sample_log import (
    SAMPLES_FILE, SampleLog, capture_rows, eval_rows, markdown_table, pick_rows, select, source_label, trim,
)

runner = CliRunner()
TB = importlib.util.find_spec("tensorboard") is not None


def test_trim_pick_and_label():
    assert trim("abcdef", 4) == "abc…" and trim("abc", 4) == "abc" and trim("abcdef", 0) == "abcdef"
    # in turn from each source: 6 rollouts and 2 expert rows, 4 picked -> both kinds
    assert pick_rows(["on_policy"] * 6 + ["expert"] * 2, 4) == [0, 1, 6, 7]
    assert pick_rows(["a", "a"], 5) == [0, 1]
    assert source_label("on_policy", ["prefix", "prefix", "on_policy"]) == "prefix+on_policy"
    assert source_label("on_policy", ["hinted", "hinted"]) == "hinted"
    assert source_label("expert", []) == "expert"


class _Tok:
    """Decodes token t as chr(ord('a') + t)."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i) for i in ids)


def test_capture_rows_by_hand():
    on, ex, pre = prov.ON_POLICY, prov.EXPERT, prov.code("prefix")
    out = {
        "prompt_ids": torch.tensor([[0, 1], [0, 2], [9, 3]]),
        "prompt_mask": torch.tensor([[1, 1], [1, 1], [0, 1]]),
        "completion_ids": torch.tensor([[4, 5, 6], [7, 8, 0], [1, 2, 3]]),
        "completion_mask": torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]]),
        "row_source": torch.tensor([on, on, ex]),
        "token_source": torch.tensor([[pre, on, on], [on, on, on], [ex, ex, ex]]),
        "advantages": torch.tensor([0.5, -0.5, 0.0]),
    }
    # 2 processes' worth of rewards: this process's rows start at 2; the expert row was appended after scoring
    rewards = torch.tensor([9.0, 9.0, 1.0, 0.0])
    rpf = torch.tensor([[9.0], [9.0], [1.0], [0.0]])
    rows = capture_rows(out, tokenizer=_Tok(), rewards=rewards, rewards_per_func=rpf, reward_names=["exact"], start=2,
                        n=3, max_chars=3, n_local_scored=2)
    assert rows == [
        {"source": "prefix+on_policy", "prompt": "ab", "completion": "efg", "reward": 1.0, "rewards": {"exact": 1.0},
         "advantage": 0.5, "tokens": 3},
        {"source": "on_policy", "prompt": "ac", "completion": "hi", "reward": 0.0, "rewards": {"exact": 0.0},
         "advantage": -0.5, "tokens": 2},
        {"source": "expert", "prompt": "d", "completion": "bcd", "reward": None, "rewards": {}, "advantage": 0.0, "tokens": 3},
    ]
    # n=2: one row of each label first (prefix+on_policy, on_policy), the expert row is the third label
    assert [r["source"] for r in capture_rows(out, tokenizer=_Tok(), rewards=rewards, rewards_per_func=rpf, reward_names=["exact"],
                                              start=2, n=2, max_chars=0, n_local_scored=2)] == ["prefix+on_policy", "on_policy"]
    # a rollout generated with a hint in its prompt (guided=2) and trained under it
    assert [r["source"] for r in capture_rows(out, tokenizer=_Tok(), rewards=rewards, rewards_per_func=rpf, reward_names=["exact"],
                                              start=2, n=3, max_chars=0, n_local_scored=2, guided=[0, 2])] == [
        "prefix+on_policy", "hint+on_policy", "expert"]
    # row 1 was a rollout when scored, then a replayed row took its place: its summed reward is the
    # replayed row's (rewards), the per-function scores were the rollout's and are left out
    replay = dict(out, row_source=torch.tensor([on, prov.code("replay"), ex]))
    rows = capture_rows(replay, tokenizer=_Tok(), rewards=rewards, rewards_per_func=rpf, reward_names=["exact"], start=2, n=3,
                        max_chars=0, n_local_scored=2, scored_sources=torch.tensor([on, on]))
    assert [(r["reward"], r["rewards"]) for r in rows] == [(1.0, {"exact": 1.0}), (0.0, {}), (None, {})]


def test_sample_log_keeps_the_last_steps_and_selects(tmp_path):
    log = SampleLog(tmp_path, keep_steps=3)
    for step in range(1, 6):
        log.append("train", step, [{"source": "on_policy", "prompt": "p", "completion": str(step)},
                                   {"source": "expert" if step % 2 else "prefix+on_policy", "prompt": "p", "completion": "x"}])
    log.append("eval", 5, eval_rows([{"prompt": [{"role": "user", "content": "2+2="}], "completion": "4", "reward": 1.0,
                                      "correct": True, "answer": "4"}], 8, 100))
    rows = [json.loads(x) for x in (tmp_path / SAMPLES_FILE).read_text().splitlines()]
    assert sorted({(r["split"], r["step"]) for r in rows}) == [("eval", 5), ("train", 4), ("train", 5)]  # 3 pairs kept
    assert SampleLog(tmp_path, keep_steps=3).rows == rows  # reopened (a resumed run) from the file
    assert [r["step"] for r in select(rows, last=1)] == [5, 5]
    assert [r["step"] for r in select(rows, source="prefix")] == [4]  # a part of "prefix+on_policy"
    assert [r["step"] for r in select(rows, source="expert")] == [5]
    held = select(rows, heldout=True)
    assert held == [{"split": "eval", "step": 5, "source": "heldout", "prompt": "2+2=", "completion": "4", "reward": 1.0,
                     "correct": True, "answer": "4"}]
    assert "| 5 | heldout | 1 ✓ | - | 2+2= | 4 |" in markdown_table(held)


def test_cli_errors_are_one_line_exit_2(tmp_path):
    res = runner.invoke(app, ["samples", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "is not a directory" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    (tmp_path / "config.yaml").write_text("seed: 0\n")  # a run from before samples.jsonl
    res = runner.invoke(app, ["samples", str(tmp_path)])
    assert res.exit_code == 2 and "logger.samples_per_step=4" in res.stderr
    res = runner.invoke(app, ["train", "logger.samples_per_step=-1"])
    assert res.exit_code == 2 and "logger.samples_per_step=-1 is out of range" in res.stderr


def _trainer_with(callbacks, step=3):
    return types.SimpleNamespace(callback_handler=types.SimpleNamespace(callbacks=callbacks),
                                 state=types.SimpleNamespace(global_step=step))


def test_wandb_gets_a_table():
    logged = []

    class Table:
        def __init__(self, columns, data):
            self.columns, self.data = columns, data

    fake = types.SimpleNamespace(run=object(), Table=Table, log=lambda d: logged.append(d))
    WandbCallback = type("WandbCallback", (), {"_wandb": fake})
    rows = [{"split": "train", "step": 3, "source": "expert", "prompt": "1+1=", "completion": "2", "reward": None, "advantage": 0.25}]
    assert publish_samples(_trainer_with([WandbCallback()]), "train", 3, rows) == ["WandbCallback"]
    (entry,) = logged
    table = entry["samples/train"]
    assert table.columns == ["step", "source", "reward", "advantage", "prompt", "completion"]
    assert table.data == [["3", "expert", "-", "0.25", "1+1=", "2"]]
    fake.run = None  # wandb not initialised (WANDB_MODE=disabled before init): nothing sent
    assert publish_samples(_trainer_with([WandbCallback()]), "train", 3, rows) == []


def _tb_texts(logdir: str, tag: str) -> list[tuple[int, str]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(logdir, size_guidance={"tensors": 0})
    ea.Reload()
    assert tag in ea.Tags()["tensors"], ea.Tags()["tensors"]
    return [(e.step, e.tensor_proto.string_val[0].decode()) for e in ea.Tensors(tag)]


def _invoke(args):
    res = runner.invoke(app, args)
    assert res.exit_code == 0, f"{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    return res


@pytest.mark.skipif(not TB, reason="tensorboard is not installed (pip install 'mixrl[tensorboard]')")
def test_runs_of_two_source_families_show_their_sources(fast_overrides, tmp_path):
    """CHORD (rollouts + expert rows) reporting to TensorBoard, and Prefix-RFT (rollouts continued
    from solution prefixes): each row's source in samples.jsonl, `mixrl samples` and TensorBoard."""
    base = [o for o in fast_overrides if not o.startswith(("run_dir=", "trainer.max_steps="))]
    chord, prefix = tmp_path / "chord", tmp_path / "prefix"
    _invoke(["train", *base, "recipe=chord/arith-tiny", "trainer.max_steps=1", "logger=tensorboard", "logger.progress=false",
             f"run_dir={chord}"])
    _invoke(["train", *base, "recipe=prefix_rft/arith-tiny", "trainer.max_steps=1", f"run_dir={prefix}"])

    rows = [json.loads(x) for x in (chord / SAMPLES_FILE).read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    assert len(train) == 4 and {r["source"] for r in train} == {"on_policy", "expert"}
    assert all(r["step"] == 1 and r["prompt"] and r["completion"] for r in train)
    assert all(r["reward"] is None for r in train if r["source"] == "expert")  # appended after scoring
    assert all(isinstance(r["reward"], float) for r in train if r["source"] == "on_policy")
    assert len([r for r in rows if r["split"] == "eval"]) == 8  # the evaluation after training (eval_size=8)

    out = _invoke(["samples", str(chord), "--source", "expert", "--width", "0"]).stdout
    assert "expert" in out and "on_policy" not in out
    expert_prompt = next(r["prompt"] for r in train if r["source"] == "expert")
    assert expert_prompt in out
    held = [json.loads(x) for x in _invoke(["samples", str(chord), "--eval", "--json"]).stdout.splitlines()]
    assert len(held) == 8 and {r["source"] for r in held} == {"heldout"} and all("correct" in r for r in held)

    logdir = str(chord / "tensorboard")
    ((step, text),) = _tb_texts(logdir, "samples/train/text_summary")
    assert step == 1 and "| 1 | expert |" in text and "| 1 | on_policy |" in text
    assert [s for s, _ in _tb_texts(logdir, "samples/eval/text_summary")] == [1]

    prefixed = [json.loads(x) for x in _invoke(["samples", str(prefix), "--json", "--source", "prefix"]).stdout.splitlines()]
    assert prefixed and all(r["source"] == "prefix+on_policy" for r in prefixed)
