"""``mixrl eval MODEL benchmarks=... --plot FILE``, and a real SIGKILL in the middle of an
evaluation: the rerun reads the finished samples back and generates only the rest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mixrl.cli.main import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "benchmarks"


def test_plot_draws_ours_beside_the_papers_rows(tiny_model_path, tmp_path):
    png, out = tmp_path / "table.png", tmp_path / "t.json"
    res = runner.invoke(app, ["eval", tiny_model_path, "benchmarks=[aime24,amc]", f"benchmarks.source_dir={FIXTURES}",
                              f"benchmarks.cache_dir={tmp_path / 'c'}", "benchmarks.limit=1", "benchmarks.all.protocol.samples=1",
                              "benchmarks.all.protocol.max_new_tokens=4", "benchmarks.backend=hf",
                              "recipe=luffy/qwen2.5-math-7b-openr1", "model=tiny", "hardware=cpu", "hardware.torch_threads=1",
                              "data.system_prompt=null", "--plot", str(png), "--out", str(out)])
    assert res.exit_code == 0, res.output[-2000:]
    assert "paper: Qwen2.5-Math-7B" in res.stdout and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 5000


def test_plot_without_benchmarks_is_one_line(tiny_model_path, tmp_path):
    res = runner.invoke(app, ["eval", tiny_model_path, "--plot", str(tmp_path / "x.png")])
    assert res.exit_code == 2 and "--plot draws the benchmark table" in res.output
    assert not (tmp_path / "x.png").exists()


@pytest.mark.slow  # an evaluation killed and rerun in its own processes, ~40 s: `make test-slow`
def test_a_killed_evaluation_resumes_without_regenerating_finished_samples(tiny_model_path, tmp_path):
    """SIGKILL once some batches are in the samples file; the rerun generates exactly the rest."""
    cache, out = tmp_path / "cache", tmp_path / "r.json"
    args = [sys.executable, "-m", "mixrl.cli.main", "eval", tiny_model_path, "benchmarks=arith", f"benchmarks.cache_dir={cache}",
            "benchmarks.arith.protocol.samples=8", "benchmarks.arith.protocol.temperature=1.0",
            "benchmarks.arith.protocol.metrics=[avg@8,pass@8]", "trainer.eval_size=64", "trainer.eval_batch_size=16",
            "hardware.torch_threads=1", "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    lines = 0
    while proc.poll() is None and time.time() < deadline:
        files = list((cache).glob("arith-*.jsonl")) if cache.is_dir() else []
        lines = sum(1 for _ in files[0].open()) if files else 0
        if lines >= 32:  # two batches (2 problems x 8 samples each) written
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert 32 <= lines < 64 * 8, f"killed at {lines} samples"
    (path,) = cache.glob("arith-*.jsonl")
    kept = []
    for x in path.read_text().splitlines():
        try:
            kept.append(json.loads(x))
        except ValueError:
            pass
    res = subprocess.run([*args, "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    (arith,) = json.loads(out.read_text())["benchmarks"]
    assert arith["reused"] == len(kept) and arith["generated"] == 64 * 8 - len(kept)
    recs = []
    for x in path.read_text().splitlines():
        try:
            recs.append(json.loads(x))
        except ValueError:  # a line the kill cut (ignored by the reader)
            pass
    assert recs[: len(kept)] == kept  # the finished samples are read back as they were
    assert sorted((r["problem"], r["sample"]) for r in recs) == [(i, s) for i in range(64) for s in range(8)]
