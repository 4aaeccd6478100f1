"""End-to-end training through the CLI with the tiny model (2 steps, seconds on a CPU).

Three runs in all, the slow part of the suite: one with a KL penalty (TRL then builds a
reference model from ``model.path``), checked in detail, and a two-seed multirun.

The runs use one torch thread (``hardware.torch_threads=1``): on a small shared CPU the
default (one thread per core) spin-waits against other processes and made a 2-step run
5x slower (100 s instead of 19 s, measured at load average 7 on 2 cores).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from mixrl.cli.main import app

runner = CliRunner()

ONE_THREAD = "hardware.torch_threads=1"


@pytest.fixture(scope="module", autouse=True)
def _restore_torch_threads():
    import torch

    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)

#: metric -> why it must be in every metrics.jsonl row
REQUIRED_METRICS = {
    "reward_mean": "reward mean",
    "reward_std": "reward std",
    "accuracy": "on-policy accuracy",
    "loss/policy": "policy loss term",
    "loss/total": "total loss",
    "entropy": "entropy",
    "clip_frac": "clip fraction",
    "completion_length": "completion length",
    "tokens": "tokens",
    "step_time": "step time",
}
KL_METRICS = {"kl": "KL to the reference model", "loss/kl": "KL loss term"}


def _invoke(args: list[str]):
    res = runner.invoke(app, args)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        import traceback

        tb = "".join(traceback.format_exception(*res.exc_info))
        pytest.fail(f"`mixrl {' '.join(args)}` raised:\n{tb}\nstderr:\n{res.stderr[-3000:]}")
    assert res.exit_code == 0, f"exit {res.exit_code}\nstdout:\n{res.stdout[-2000:]}\nstderr:\n{res.stderr[-3000:]}"
    return res


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _check_run_dir(run_dir: Path, *, steps: int, seed: int, kl: bool) -> dict:
    """Common checks of one run directory; returns summary.json."""
    assert run_dir.is_dir(), f"{run_dir} was not created"
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "model"):
        assert (run_dir / name).exists(), f"{run_dir / name} is missing"
    from mixrl.trainer.state.rundir import written_by_mixrl

    # a failed run is replaced only when it holds nothing but mixrl's files: every entry must be one
    assert [p.name for p in run_dir.iterdir() if not written_by_mixrl(p)] == []

    text = (run_dir / "config.yaml").read_text()
    assert "${" not in text, "config.yaml is not resolved"
    cfg = yaml.safe_load(text)
    assert cfg["seed"] == seed and cfg["trainer"]["max_steps"] == steps
    assert cfg["run_dir"] == str(run_dir)
    assert cfg["algo"]["loss"]["name"] and "dual_clip_c" in cfg["algo"]["loss"]  # component defaults listed

    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == list(range(1, steps + 1)), "metrics.jsonl needs one row per step"
    required = {**REQUIRED_METRICS, **(KL_METRICS if kl else {})}
    for row in rows:
        missing = {k: why for k, why in required.items() if k not in row}
        assert not missing, f"metrics.jsonl row {row['step']} lacks {missing}; has {sorted(row)}"
        for key in required:
            assert isinstance(row[key], (int, float)) and math.isfinite(row[key]), f"{key}={row[key]!r} at step {row['step']}"
        assert 0.0 <= row["accuracy"] <= 1.0 and 0.0 <= row["clip_frac"] <= 1.0
        assert row["completion_length"] > 0 and row["tokens"] > 0 and row["step_time"] > 0
    if kl:
        for row in rows:  # k3 >= 0 up to float error (one assert per value: `make tolerances` records each)
            assert row["kl"] >= -1e-6

    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("accuracy_before", "accuracy_after"):
        assert isinstance(summary[key], (int, float)) and 0.0 <= summary[key] <= 1.0, f"summary.json {key}={summary.get(key)!r}"
    assert summary["steps"] == steps and summary["seed"] == seed
    # the summary's reward is the last step's on-policy reward, the bar's number (mixrl.trainer.callbacks.SHOWN_REWARD)
    assert summary["last_reward"] == {"metric": "reward_on_policy", "step": steps, "value": rows[-1]["reward_on_policy"]}
    assert Path(summary["run_dir"]) == run_dir
    return summary


# --------------------------------------------------------------------------- one run with KL
@pytest.fixture(scope="module")
def kl_run(request, tmp_path_factory):
    import torch

    from conftest import FAST  # the overrides of the `fast_overrides` fixture (module scope here)

    torch.set_num_threads(1)  # also for the tiny model's warm start, if this is its first use
    tiny_model_path = request.getfixturevalue("tiny_model_path")
    run_dir = tmp_path_factory.mktemp("kl") / "run"
    args = ["train", *FAST, ONE_THREAD, f"model.path={tiny_model_path}", f"run_dir={run_dir}", "algo.kl.coef=0.05", "seed=4"]
    return run_dir, _invoke(args)


def test_kl_run_directory(kl_run):
    run_dir, _ = kl_run
    _check_run_dir(run_dir, steps=2, seed=4, kl=True)
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert cfg["algo"]["kl"]["coef"] == pytest.approx(0.05)


def test_kl_run_prints_run_directory_last(kl_run):
    run_dir, res = kl_run
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    assert lines and str(run_dir) in lines[-1], f"the run directory is not printed at the end: {lines[-3:]}"


def test_kl_run_saves_hf_model_and_tokenizer(kl_run):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir, _ = kl_run
    model = AutoModelForCausalLM.from_pretrained(run_dir / "model")
    tok = AutoTokenizer.from_pretrained(run_dir / "model")
    enc = tok("12+7=", return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits
    assert logits.shape[:2] == enc["input_ids"].shape
    assert torch.isfinite(logits).all()


# --------------------------------------------------------------------------- multirun
def test_multirun_two_seeds(fast_overrides):
    res = _invoke(["train", "-m", "seed=1,2", ONE_THREAD, *fast_overrides])
    root = Path(next(o.split("=", 1)[1] for o in fast_overrides if o.startswith("run_dir=")))
    run_dirs = sorted(p for p in root.iterdir() if p.is_dir())
    assert len(run_dirs) == 2, f"expected two run directories under {root}, found {run_dirs}"
    seeds = []
    for run_dir in run_dirs:
        summary = _check_run_dir(run_dir, steps=2, seed=json.loads((run_dir / "summary.json").read_text())["seed"], kl=False)
        seeds.append(summary["seed"])
        assert str(run_dir) in res.stdout
    assert sorted(seeds) == [1, 2]


# --------------------------------------------------------------------------- no model needed
def test_existing_run_dir_is_refused(fast_overrides, monkeypatch):
    import mixrl.trainer.build as build

    def boom(*a, **k):
        raise AssertionError("the model was loaded before the run_dir check")

    monkeypatch.setattr(build, "resolve_model_path", boom)
    run_dir = Path(next(o.split("=", 1)[1] for o in fast_overrides if o.startswith("run_dir=")))
    run_dir.mkdir(parents=True)
    (run_dir / "keep.txt").write_text("x")
    res = runner.invoke(app, ["train", *fast_overrides])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "run_dir" in lines[0] and str(run_dir) in lines[0]
    assert (run_dir / "keep.txt").read_text() == "x"
