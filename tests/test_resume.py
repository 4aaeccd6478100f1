"""Resume, interrupts, divergence and failed runs, end to end with the tiny model.

The subprocess tests run the real CLI (``python -m mixrl.cli.main``) so that a signal hits
a real process: SIGKILL after a checkpoint + ``resume=RUN_DIR`` must end with the same
weights and per-step metrics as an uninterrupted run; SIGINT must save a checkpoint and
print one line saying how to resume.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import sigkill_once_written
from typer.testing import CliRunner

from mixrl.cli.main import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
#: per-step metrics that must match to 1e-6 (timings excluded)
COMPARED = ("loss", "grad_norm", "reward_mean", "reward_std", "entropy", "completion_length", "loss/policy", "clip_frac")


def _cli(args: list[str], **kw) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "mixrl.cli.main", "train", *args], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    t0 = time.time()
    while not path.exists():
        assert proc.poll() is None, f"the run ended before {path} appeared:\n{proc.communicate()[1][-2000:]}"
        assert time.time() - t0 < timeout, f"{path} did not appear in {timeout}s"
        time.sleep(0.02)


def _weights(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "model" / "model.safetensors"))


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _overrides(fast_overrides: list[str], run_dir: Path, *extra: str) -> list[str]:
    return [o for o in fast_overrides if not o.startswith("run_dir=")] + [f"run_dir={run_dir}", *extra]


def _assert_same_run(a: Path, b: Path) -> float:
    wa, wb = _weights(a), _weights(b)
    diff = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    assert diff == 0.0, f"final weights differ by {diff}"
    ra, rb = _rows(a), _rows(b)
    assert [r["step"] for r in rb] == [r["step"] for r in ra]  # continued, not restarted or repeated
    for x, y in zip(ra, rb):
        for key in COMPARED:
            if x.get(key) is not None:
                assert y[key] == pytest.approx(x[key], abs=1e-6), (x["step"], key)
    return diff


@pytest.mark.slow
def test_sigkill_after_checkpoint_then_resume_matches_uninterrupted_run(fast_overrides, tmp_path):
    import threading

    steps = ["trainer.max_steps=4", "trainer.save_steps=2"]
    killed = _cli(_overrides(fast_overrides, tmp_path / "killed", *steps))
    ckpt = tmp_path / "killed" / "trainer" / "checkpoint-2" / "trainer_state.json"

    watcher = threading.Thread(target=sigkill_once_written, args=(ckpt, killed))
    watcher.start()
    full = runner.invoke(app, ["train", *_overrides(fast_overrides, tmp_path / "full", *steps)])  # meanwhile
    watcher.join()
    _, err = killed.communicate()
    assert full.exit_code == 0, full.output[-2000:]
    assert killed.returncode == -signal.SIGKILL, err[-2000:]
    assert ckpt.exists() and not (tmp_path / "killed" / "model").exists()  # cut short after a checkpoint

    resumed = runner.invoke(app, ["train", "resume=" + str(tmp_path / "killed"), "logger.progress=false",
                                  "hardware.torch_threads=1"])
    assert resumed.exit_code == 0, resumed.output[-2000:]
    assert "resuming" in resumed.stderr
    summary = json.loads((tmp_path / "killed" / "summary.json").read_text())
    assert summary["resumed_from_step"] in (2, 4) and summary["steps"] == 4
    assert summary["rollouts"] == json.loads((tmp_path / "full" / "summary.json").read_text())["rollouts"]
    _assert_same_run(tmp_path / "full", tmp_path / "killed")


@pytest.mark.slow
def test_sigint_saves_a_checkpoint_and_says_how_to_resume(fast_overrides, tmp_path):
    run_dir = tmp_path / "run"
    proc = _cli(_overrides(fast_overrides, run_dir, "trainer.max_steps=40", "trainer.save_steps=0"))
    _wait_for(run_dir / "metrics.jsonl", proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert "Traceback" not in err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and f"resume={run_dir}" in errors[0], err
    ckpts = list((run_dir / "trainer").glob("checkpoint-*"))
    assert len(ckpts) == 1 and (ckpts[0] / "optimizer.pt").is_file()
    assert not (run_dir / "FAILED").exists()
    step = int(ckpts[0].name.split("-")[1])
    assert step < 40 and [r["step"] for r in _rows(run_dir)][-1] == step

    res = runner.invoke(app, ["train", f"resume={run_dir}", "trainer.max_steps=" + str(step + 1), "logger.progress=false",
                              "hardware.torch_threads=1"])
    assert res.exit_code == 0, res.output[-2000:]
    assert [r["step"] for r in _rows(run_dir)] == list(range(1, step + 2))
    import yaml

    assert yaml.safe_load((run_dir / "config.yaml").read_text())["trainer"]["max_steps"] == step + 1  # kept current


def test_resume_refuses_overrides_that_change_the_run(tmp_path):
    from mixrl.config.compose import compose_config
    from mixrl.trainer.state.rundir import config_text

    (tmp_path / "config.yaml").write_text(config_text(compose_config([])))
    res = runner.invoke(app, ["train", f"resume={tmp_path}", "algo.loss.clip_high=0.3"])
    assert res.exit_code == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "algo.loss.clip_high=0.3" in lines[0] and "would change what is trained" in lines[0]


def test_resume_of_a_directory_that_is_not_a_run(tmp_path):
    res = runner.invoke(app, ["train", f"resume={tmp_path / 'nope'}"])
    assert res.exit_code == 2
    assert "not a mixrl run directory" in res.stderr and "Traceback" not in res.output


def test_truncate_jsonl_drops_rows_after_the_checkpoint_and_a_torn_line(tmp_path):
    from mixrl.trainer.state.rundir import truncate_jsonl

    p = tmp_path / "m.jsonl"
    p.write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n{"step": 4, "lo')
    assert truncate_jsonl(p, 2) == 2
    assert p.read_text() == '{"step": 1}\n{"step": 2}\n'
    assert sorted(x.name for x in tmp_path.iterdir()) == ["m.jsonl"]  # replaced in one rename: no temporary file left


def test_only_rank_0_cuts_the_logs_back_on_resume(tmp_path, monkeypatch):
    """Every process of a multi-process run resumes through ``run_steps.begin``; only world process zero
    (the logs' one writer) cuts metrics.jsonl, eval.jsonl and samples.jsonl back to the checkpoint's step.
    (Two processes cutting one log back raced: a two-node requeued job once kept only its own new rows.)"""
    from types import SimpleNamespace

    from rich.console import Console

    from mixrl.evaluation.periodic import EVAL_FILE
    from mixrl.trainer import run_steps
    from mixrl.trainer.sample_log import SAMPLES_FILE

    rows = '{"step": 1}\n{"step": 2}\n{"step": 3}\n'
    inputs = SimpleNamespace(seconds=0.0, cpu_seconds=0.0)
    for rank, kept in (("1", rows), ("0", '{"step": 1}\n{"step": 2}\n')):
        run_dir = tmp_path / f"rank{rank}"
        run_dir.mkdir()
        for name in ("metrics.jsonl", EVAL_FILE, SAMPLES_FILE):
            (run_dir / name).write_text(rows)
        monkeypatch.setenv("RANK", rank)
        run = run_steps.begin(None, Console(quiet=True), run_dir, None, run_dir / "checkpoint-2", {}, inputs)
        assert run.start_step == 2
        assert {name: (run_dir / name).read_text() for name in ("metrics.jsonl", EVAL_FILE, SAMPLES_FILE)} == dict.fromkeys(
            ("metrics.jsonl", EVAL_FILE, SAMPLES_FILE), kept), rank


def test_last_checkpoint_ignores_incomplete_folders(tmp_path):
    from mixrl.trainer.state.rundir import last_checkpoint

    (tmp_path / "trainer" / "checkpoint-2").mkdir(parents=True)
    (tmp_path / "trainer" / "checkpoint-2" / "trainer_state.json").write_text("{}")
    (tmp_path / "trainer" / "checkpoint-10").mkdir()  # killed while saving
    assert last_checkpoint(tmp_path).name == "checkpoint-2"


# --------------------------------------------------------------------------- divergence / failures
def _one_error_line(res, code: int) -> str:
    assert res.exit_code == code, f"exit {res.exit_code}: {res.output[-2000:]}"
    assert "Traceback" not in res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, res.stderr
    return lines[0]


@pytest.mark.slow
def test_huge_learning_rate_stops_with_one_line_and_a_finite_checkpoint(fast_overrides, tmp_path):
    import torch
    from safetensors.torch import load_file

    res = runner.invoke(app, ["train", *fast_overrides, "trainer.max_steps=6", "trainer.learning_rate=1e6"])
    line = _one_error_line(res, 3)
    assert "training diverged at step" in line and "learning rate" in line
    run_dir = Path([o for o in fast_overrides if o.startswith("run_dir=")][0].split("=", 1)[1])
    assert "diverged" in (run_dir / "FAILED").read_text()
    ckpts = list((run_dir / "trainer").glob("checkpoint-*"))
    assert ckpts, "no checkpoint of the last finite state"
    weights = load_file(str(ckpts[0] / "model.safetensors"))
    assert all(bool(torch.isfinite(w).all()) for w in weights.values())


def test_generation_failure_on_inf_probabilities_is_one_line(fast_overrides, monkeypatch):
    from mixrl.trainer.grpo import MixrlGRPOTrainer

    def broken(self, *a, **k):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")

    monkeypatch.setattr(MixrlGRPOTrainer, "train", broken)
    res = runner.invoke(app, ["train", *fast_overrides, "trainer.eval_size=0"])
    line = _one_error_line(res, 3)
    assert "training diverged at step 1" in line and "probabilities are not finite" in line and "learning rate" in line


NAN_REWARD = """
def nan_reward(prompts, completions, **kwargs):
    return [float("nan")] * len(completions)
"""


@pytest.mark.slow
def test_nan_reward_stops_the_run_before_its_directory_and_a_retry_runs(fast_overrides, tmp_path):
    reward = tmp_path / "bad_reward.py"
    reward.write_text(NAN_REWARD)
    args = ["train", *fast_overrides, f"reward.name={reward}:nan_reward", "trainer.eval_size=0"]
    line = _one_error_line(runner.invoke(app, args), 2)
    assert "nan_reward" in line and "returned nan on row 0" in line and "finite" in line
    run_dir = Path([o for o in fast_overrides if o.startswith("run_dir=")][0].split("=", 1)[1])
    assert not run_dir.exists()  # the reward is checked before the run directory is created

    ok = runner.invoke(app, ["train", *fast_overrides, "trainer.eval_size=0"])  # same run_dir, good reward
    assert ok.exit_code == 0, ok.output[-2000:]
    assert not (run_dir / "FAILED").exists() and (run_dir / "summary.json").is_file()
