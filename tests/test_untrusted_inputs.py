"""Commands that read a user's files do not trust them (issue 33): a log with bytes that are not
UTF-8 or lines that are not rows, a model folder without its tokenizer or with a weights file cut
short, an ``--out`` that cannot be written, a data row far beyond the tiny model, a ``reproduce``
folder holding the user's own files. Each is run as a user runs it (the CLI through Typer's
CliRunner): a log reader skips and counts the bad lines; anything else is one line naming the
problem and the fix, exit 2, and nothing created or changed."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import FAST, fail_model_loading
from mixrl.cli.main import app

runner = CliRunner()


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_error_line(res, *needles: str) -> str:
    """The output's only ``error:`` line, its last line; it holds every needle."""
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert res.exit_code == 2, res.output[-2000:]
    assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in res.output, res.output[-2000:]
    for n in needles:
        assert n in errors[0], errors[0]
    return errors[0]


# --------------------------------------------------------------------------- logs
def _sample(step: int, **kw) -> str:
    return json.dumps({"split": "train", "step": step, "source": "on_policy", "prompt": f"p{step}", "completion": f"c{step}",
                       "reward": 1.0, "advantage": 0.5, **kw}) + "\n"


def test_samples_skips_and_counts_unreadable_lines(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("seed: 0\n")
    good = _sample(1) + _sample(2)
    bad = [b'\xff\xfe{"step": 3}\n', b"[1, 2]\n", b'"text"\n', b'{"split": "train", "step": "x"}\n', b'{"step": 4, "split": "dev"}\n',
           b'{"step": 5, "reward": "high"\n']  # a non-UTF-8 byte, JSON that is not a row (4 ways), a line cut by a kill
    (run / "samples.jsonl").write_bytes(good.encode() + b"".join(bad))
    before = _snapshot(run)
    res = runner.invoke(app, ["samples", str(run), "--json"])
    assert res.exit_code == 0, res.output
    assert [json.loads(x)["step"] for x in res.stdout.splitlines()] == [1, 2]
    note = " ".join(res.stderr.split())
    assert "note: 6 unreadable lines of" in note and "line 3: not UTF-8 (byte 0xff at column 1)" in note, note
    res = runner.invoke(app, ["samples", str(run)])  # the table too
    assert res.exit_code == 0 and "p1" in res.stdout and "6 unreadable lines" in " ".join(res.stderr.split())
    # a row of the right shape whose reward is text still prints (a hand-edited log)
    (run / "samples.jsonl").write_text(_sample(1, reward="high"))
    res = runner.invoke(app, ["samples", str(run)])
    assert res.exit_code == 0 and "high" in res.stdout, res.output
    # a file of which no line is a row: refused in one line, nothing changed
    (run / "samples.jsonl").write_bytes(b"".join(bad))
    before = _snapshot(run)
    _one_error_line(runner.invoke(app, ["samples", str(run)]), "holds no readable sample row", "6 unreadable lines", "line 1: not UTF-8")
    assert _snapshot(run) == before


def test_compare_refuses_a_log_line_that_is_not_a_row(tmp_path):
    run = tmp_path / "runs" / "a"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"algo": "grpo", "seed": 0, "steps": 2, "accuracy_before": 0.1,
                                                  "accuracy_after": 0.2, "eval_before": {"accuracy": 0.1},
                                                  "eval_after": {"accuracy": 0.2}}))
    for content, why in ((b'{"step": 1, "reward_mean": 0.5}\n\xff\n', "not UTF-8"), (b'{"step": 1}\n[1]\n', "a JSON array, not an object"),
                         (b'{"loss": 1.0}\n', "no integer 'step'")):
        (run / "metrics.jsonl").write_bytes(content)
        out = tmp_path / "cmp"
        _one_error_line(runner.invoke(app, ["compare", str(tmp_path / "runs"), "--out", str(out), "--no-plots"]),
                        "metrics.jsonl:", why, "fix or delete the line")
        assert not out.exists()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "summary.json").write_text("[]")
    _one_error_line(runner.invoke(app, ["compare", str(tmp_path / "runs"), "--out", str(tmp_path / "cmp"), "--no-plots"]),
                    "summary.json", "JSON list")


def test_resume_truncation_drops_unreadable_lines(tmp_path):
    from mixrl.trainer.state.rundir import truncate_jsonl

    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "loss": 0.5}\n\xff\xfe\n[2]\n{"step": 2}\n{"step": 3}\n{"step": 4, "lo')
    assert truncate_jsonl(path, 2) == 2
    assert [json.loads(x) for x in path.read_text().splitlines()] == [{"step": 1, "loss": 0.5}, {"step": 2}]


# --------------------------------------------------------------------------- model folders
@pytest.fixture()
def damaged(tiny_model_path, tmp_path):
    """Two copies of the tiny model: one without its tokenizer files, one with its weights cut in half."""
    no_tok, cut = tmp_path / "no-tokenizer", tmp_path / "cut"
    shutil.copytree(tiny_model_path, no_tok)
    shutil.copytree(tiny_model_path, cut)
    for f in no_tok.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab")):
            f.unlink()
    weights = cut / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    return no_tok, cut


def test_eval_and_train_refuse_a_damaged_model_folder(damaged, tmp_path, monkeypatch):
    import mixrl.evaluation.saved as saved

    monkeypatch.setattr(saved, "load_saved_model", fail_model_loading)  # refused before any model loads
    no_tok, cut = damaged
    args = ["trainer.eval_size=4", "hardware.torch_threads=1", "logger.progress=false"]
    for folder in damaged:
        before = _snapshot(folder)
        res = runner.invoke(app, ["eval", str(folder), *args, "--out", str(tmp_path / "e" / "eval.json")])
        if folder == no_tok:
            _one_error_line(res, f"'{no_tok}' holds no tokenizer files", "tokenizer.save_pretrained")
        else:
            _one_error_line(res, "model.safetensors is unreadable", "SafetensorError", "save or copy it again")
        run_dir = tmp_path / f"run-{folder.name}"
        res = runner.invoke(app, ["train", *FAST, f"model.path={folder}", f"run_dir={run_dir}"])
        _one_error_line(res, "no tokenizer files" if folder == no_tok else "is unreadable")
        assert not run_dir.exists() and not (tmp_path / "e").exists() and _snapshot(folder) == before


def test_eval_out_is_checked_before_the_evaluation(tiny_model_path, tmp_path, monkeypatch):
    import mixrl.trainer.saved_eval as saved_eval

    def evaluated(*a, **k):
        raise AssertionError("the evaluation ran before --out was checked")

    monkeypatch.setattr(saved_eval, "evaluate_saved_model", evaluated)
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "mine.txt").write_text("mine")
    _one_error_line(runner.invoke(app, ["eval", tiny_model_path, "--out", str(folder)]),
                    f"--out {folder} is a directory", f"--out {folder / 'eval.json'}")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if not os.access(locked, os.W_OK):  # root writes anywhere: only the directory case applies then
            _one_error_line(runner.invoke(app, ["eval", tiny_model_path, "--out", str(locked / "new" / "eval.json")]),
                            "cannot be written", f"{locked} is not a writable directory")
    finally:
        locked.chmod(0o700)
    assert _snapshot(folder) == {"mine.txt": b"mine"} and list(locked.iterdir()) == []


# --------------------------------------------------------------------------- data rows
def test_build_tiny_refuses_a_row_beyond_its_length(tmp_path):
    from mixrl.models.tiny_data import MAX_POSITIONS

    rows = [{"prompt": f"up: w{i}", "answer": f"W{i}"} for i in range(40)]
    data = tmp_path / "long.jsonl"
    long_row = dict(rows[5], prompt="x" * 200_000)
    data.write_text("".join(json.dumps(r) + "\n" for r in [*rows[:5], long_row, *rows[5:]]))
    cache = tmp_path / "cache"
    res = runner.invoke(app, ["model", "build-tiny", f"data.source={data}", "--steps", "2", "--quiet"], env={"MIXRL_CACHE": str(cache)})
    # <s> + 200,000 prompt bytes + "W5" + </s> = 200,004 tokens
    _one_error_line(res, "200004 tokens long", f"beyond the {MAX_POSITIONS}", "shorten or drop that row", '"xxxxxxxxxx')
    # a short row with room for generation beyond the limit: the fix is a shorter generation
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = runner.invoke(app, ["model", "build-tiny", f"data.source={data}", "--steps", "2", "--quiet",
                              f"trainer.max_completion_length={MAX_POSITIONS}"], env={"MIXRL_CACHE": str(cache)})
    _one_error_line(res, f"trainer.max_completion_length={MAX_POSITIONS} exceeds", "lower trainer.max_completion_length to 50")
    assert not cache.exists()


def test_tiny_lengths_at_the_limit_by_hand():
    from mixrl.errors import DataError
    from mixrl.models.tiny_data import MAX_POSITIONS, check_lengths

    # <s> + 10 prompt bytes, + max(target 500 bytes + </s>, 32 generated) = 11 + 501 = 512: fits exactly
    check_lengths([{"prompt": "p" * 10}], ["t" * 500], 32)
    with pytest.raises(DataError, match=r"training row 1 .* is 513 tokens long"):
        check_lengths([{"prompt": "a"}, {"prompt": "p" * 10}], ["b", "é" * 250 + "t"], 32)  # é: 2 bytes, so 501 + 1 bytes
    assert MAX_POSITIONS == 512


# --------------------------------------------------------------------------- reproduce --out
def test_reproduce_refuses_a_folder_of_the_users_own(tmp_path, monkeypatch):
    import mixrl.experiments.reproduce as rep

    def trained(*a, **k):
        raise AssertionError("a run started before --out was checked")

    monkeypatch.setattr(rep, "run_grid", trained)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "README.md").write_text("my notes\n")
    (mine / "compare.md").write_text("my table\n")
    before = _snapshot(mine)
    _one_error_line(runner.invoke(app, ["reproduce", "toy", "--only", "grpo", "--seeds", "1", "--out", str(mine)]),
                    f"--out {mine} holds 'README.md' (and 1 more), which mixrl reproduce did not write")
    assert _snapshot(mine) == before
    with pytest.raises(rep.ConfigError, match="did not write"):
        rep.reproduce_toy(mine, seeds=[0], recipes=("grpo/arith-tiny",))
    # what reproduce may write into: a new or empty folder, an earlier reproduce's, a stopped grid's runs/
    rep.check_out_dir(tmp_path / "new")
    (tmp_path / "empty").mkdir()
    rep.check_out_dir(tmp_path / "empty")
    (tmp_path / "stopped" / "runs").mkdir(parents=True)
    rep.check_out_dir(tmp_path / "stopped")
    (mine / "reproduce.json").write_text("{}")
    rep.check_out_dir(mine)
    rep.check_out_dir(Path(__file__).resolve().parents[1] / "docs" / "results" / "hard")  # committed results: re-made with --out
