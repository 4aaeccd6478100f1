"""The step-time benchmark (``python -m bench.throughput``): its turn-taking and ratio
logic (fast), and one end-to-end run with minimal counts (slow, well under a minute)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.throughput import StepRecord, Turns, VariantResult, paired_ratio  # noqa: E402


def test_turns_run_one_step_at_a_time_round_robin():
    """Each participant holds the turn from one take() to the next: steps never overlap and
    run in round-robin order once every participant has arrived; a participant that finishes
    early drops out of the rotation."""
    names, steps = ["a", "b", "c"], {"a": 3, "b": 1, "c": 3}
    turns = Turns(names, seed=0, interleaved=True, device="cpu")
    log, running = [], []

    def participant(name):
        if name == "c":  # a slow set-up: the first round waits for it
            time.sleep(0.2)
            log.append(("c arrives", 0))
        try:
            for i in range(steps[name]):
                turns.take(name)
                running.append(name)
                assert len(running) == 1, f"{running} run at once"
                log.append((name, i))
                time.sleep(0.002)
                running.remove(name)
        finally:
            turns.done(name)

    threads = [threading.Thread(target=participant, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert log == [("c arrives", 0), ("a", 0), ("b", 0), ("c", 0), ("a", 1), ("c", 1), ("a", 2), ("c", 2)]


def test_turns_keep_one_rng_stream_per_participant():
    """Interleaving does not change what each participant draws: its stream is the one it
    would have had alone (seeded at its first turn, saved and restored around switches)."""
    import torch

    def draws(interleaved: bool, names: list[str]) -> dict[str, list[float]]:
        turns = Turns(names, seed=7, interleaved=interleaved, device="cpu")
        out = {n: [] for n in names}

        def participant(name):
            try:
                for _ in range(3):
                    turns.take(name)
                    out[name].append(float(torch.rand(())))
            finally:
                turns.done(name)

        if interleaved:
            ths = [threading.Thread(target=participant, args=(n,)) for n in names]
            [t.start() for t in ths]
            [t.join(timeout=30) for t in ths]
        else:
            for n in names:
                participant(n)
        return out

    alone = draws(False, ["a"])["a"]
    together = draws(True, ["a", "b"])
    assert together["a"] == alone and together["b"] == alone


def test_turns_abort_releases_waiters():
    turns = Turns(["a", "b"], seed=0, interleaved=True, device="cpu")
    errors = []

    def b():
        try:
            turns.take("b")  # waits: it is a's turn
        except Exception as e:  # noqa: BLE001
            errors.append(type(e).__name__)

    t = threading.Thread(target=b)
    t.start()
    turns.take("a")  # both have arrived: a runs
    time.sleep(0.05)
    turns.abort(RuntimeError("a failed"))
    t.join(timeout=10)
    assert errors == ["Aborted"]


def test_paired_ratio():
    def res(name, secs):
        r = VariantResult(name, name)
        r.records = [StepRecord(step=0, seconds=9.0, measured=False)] + [StepRecord(step=i + 1, seconds=s) for i, s in enumerate(secs)]
        return r

    d = paired_ratio(res("a", [1.1, 2.2, 3.0]), res("b", [1.0, 2.0, 3.0]))
    assert d["n"] == 3  # warm-up steps are not paired
    assert d["paired_median"] == pytest.approx(1.1)
    assert d["ratio_of_medians"] == pytest.approx(2.2 / 2.0)
    assert paired_ratio(res("a", [1.0]), None) is None


@pytest.mark.slow
def test_bench_end_to_end_minimal(tiny_model_path, tmp_path):
    out = tmp_path / "bench.md"
    cmd = [sys.executable, "-m", "bench.throughput", "--warmup", "1", "--steps", "1", "--threads", "1", "--quiet",
           "--model", tiny_model_path, "--set", "trainer.prompts_per_step=2", "--set", "algo.num_generations=2",
           "--set", "trainer.max_completion_length=8", "--out", str(out), "--profile-out", str(tmp_path / "profile.txt"),
           "--json", str(tmp_path / "bench.json")]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1")
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    assert time.perf_counter() - t0 < 120  # ~30 s on a loaded 2-core machine
    data = json.loads((tmp_path / "bench.json").read_text())
    assert set(data["results"]) == {"trl", "grpo", "chord", "floor"}
    for name, r in data["results"].items():
        measured = [s for s in r["records"] if s["measured"]]
        assert len(measured) == 1 and measured[0]["seconds"] > 0, name
        assert measured[0]["rollout_tokens"] == 2 * 2 * 8, name  # --lengths fixed: every completion 8 tokens
    assert data["results"]["chord"]["records"][-1]["expert_tokens"] > 0
    assert {"grpo_vs_trl", "chord_vs_grpo", "grpo_vs_floor"} <= set(data["ratios"])
    md = out.read_text()
    assert "python -m bench.throughput" in md and "commit" in md and "(1) mixrl grpo / plain TRL" in md
    profile = (tmp_path / "profile.txt").read_text()
    assert "cProfile" in profile and "mixrl/trainer/grpo.py" in profile and "torch.profiler" in profile
    assert "mixrl step-time benchmark" in res.stdout
