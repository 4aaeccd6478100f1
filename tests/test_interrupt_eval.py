"""SIGTERM during a held-out evaluation stops the run within seconds (issue 33).

A scheduler sends SIGTERM, then SIGKILL after a grace period: an evaluation of thousands of
problems must not run to its end first, and the final model must already be on disk. Unit
tests of the stop inside the evaluation (between batches and at each token) and of the
periodic evaluation, then real SIGTERMs sent to ``mixrl train`` subprocesses during the
evaluation before training and the one after it (2000 held-out problems, minutes of work)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FAST
from mixrl.evaluation.accuracy import EvaluationInterrupted, evaluate_accuracy, generate_completions
from mixrl.trainer.guards import InterruptGuard

LONG_EVAL = ["trainer.eval_size=2000", "trainer.eval_batch_size=8", "trainer.max_steps=1"]


def _model(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    tok.pad_token = tok.pad_token or tok.eos_token
    return AutoModelForCausalLM.from_pretrained(path), tok


class _Counter:
    """A stop callable that turns True on its ``after``-th call."""

    def __init__(self, after: int):
        self.after, self.calls = after, 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.calls >= self.after


def test_the_evaluation_stops_between_batches_and_within_one(tiny_model_path):
    import torch

    model, tok = _model(tiny_model_path)
    torch.manual_seed(0)
    prompts = [f"{a}+{b}=" for a in range(4) for b in range(4)]  # 16 prompts, batches of 4
    full = generate_completions(model, tok, prompts, max_new_tokens=6, batch_size=4)
    # never true: the same completions as without it (the stopping criterion changes nothing)
    assert generate_completions(model, tok, prompts, max_new_tokens=6, batch_size=4, stop=lambda: False) == full
    # true from the first question on: no batch starts
    stop = _Counter(1)
    with pytest.raises(EvaluationInterrupted, match="after 0 of 16"):
        generate_completions(model, tok, prompts, max_new_tokens=6, batch_size=4, stop=stop)
    # true during the first batch's tokens (the 3rd question: before batch 1, token 1, token 2): that batch ends there
    done = []
    stop = _Counter(3)
    with pytest.raises(EvaluationInterrupted, match="during prompts 0..4 of 16"):
        generate_completions(model, tok, prompts, max_new_tokens=6, batch_size=4, stop=stop, progress=done.append)
    assert done == [] and stop.calls == 4  # 2 tokens, then the check after generate
    rows = [{"prompt": p, "answer": "0"} for p in prompts]
    with pytest.raises(EvaluationInterrupted):
        evaluate_accuracy(model, tok, rows, lambda prompts, completions, **k: [0.0] * len(prompts), max_new_tokens=6,
                          batch_size=4, stop=lambda: True)


def test_the_periodic_evaluation_stops_and_asks_for_a_checkpoint(tiny_model_path, tmp_path):
    from mixrl.evaluation.periodic import PeriodicEvalCallback

    model, tok = _model(tiny_model_path)
    stopped = [False]
    cb = PeriodicEvalCallback(every=1, run_dir=tmp_path, tokenizer=tok, rows=[{"prompt": "1+1=", "answer": "2"}] * 4,
                              reward_fn=lambda prompts, completions, **k: [0.0] * len(prompts), max_new_tokens=4,
                              batch_size=2, model=model, stop=lambda: stopped[0])

    class State:
        global_step, is_world_process_zero = 1, True

    class Control:
        should_save = should_training_stop = False

    cb.on_step_end(None, State, Control)
    assert len(cb.rows) == 1 and not Control.should_save  # no signal: an evaluation row
    stopped[0] = True
    State.global_step = 2
    control = cb.on_step_end(None, State, Control)
    assert control.should_save and control.should_training_stop and len(cb.rows) == 1
    assert [json.loads(x)["step"] for x in (tmp_path / "eval.jsonl").read_text().splitlines()] == [1]


def test_a_signal_during_an_evaluation_says_what_it_stops():
    said = []
    guard = InterruptGuard(say=said.append).install()
    try:
        with guard.during("the held-out evaluation after training (the final model is saved in m)"):
            assert not guard.stop_requested()
            os.kill(os.getpid(), signal.SIGTERM)
            assert guard.stop_requested()
        assert said == ["SIGTERM: stopping the held-out evaluation after training (the final model is saved in m) (again to quit now)"]
    finally:
        guard.restore()


# --------------------------------------------------------------------------- real SIGTERMs
def _train(args: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).parent.parent)}
    return subprocess.Popen([sys.executable, "-m", "mixrl.cli.main", "train", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _sigterm_once(proc, path: Path, settle: float, seconds: float = 600) -> tuple[str, float]:
    """SIGTERM ``proc`` ``settle`` seconds after ``path`` exists; its stderr and the seconds it took to exit."""
    try:
        t0 = time.time()
        while not path.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.time() - t0 < seconds, f"{path} never appeared"
            time.sleep(0.05)
        time.sleep(settle)
        assert proc.poll() is None, proc.communicate()
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        return err, time.time() - t0
    finally:
        if proc.poll() is None:
            proc.kill()


def _error_line(err: str) -> str:
    assert "Traceback" not in err, err[-3000:]
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, err[-3000:]
    return errors[0]


@pytest.mark.slow  # 16-17 s alone: make test-slow
def test_sigterm_during_the_final_evaluation_stops_in_seconds_with_the_model_saved(fast_overrides, tmp_path):
    """The evaluation before training comes from trainer.eval_before_cache (written here), so the
    run reaches the one after training in seconds; that one (2000 problems) is SIGTERMed 1 s in."""
    from mixrl.config.compose import compose_config
    from mixrl.evaluation import cache
    from mixrl.trainer.build import heldout_rows

    model_path = next(o for o in fast_overrides if o.startswith("model.path=")).split("=", 1)[1]
    args = [*fast_overrides, *LONG_EVAL, f"trainer.eval_before_cache={tmp_path / 'cache'}"]
    cfg = compose_config(args)
    cache.store(tmp_path / "cache", cache.cache_key(cfg, model_path, heldout_rows(cfg)[1]), {"accuracy": 0.0, "n": 2000.0})
    run = tmp_path / "run"
    proc = _train(args, tmp_path)
    err, elapsed = _sigterm_once(proc, run / "model" / "config.json", settle=1.0)
    assert proc.returncode == 130, err[-3000:]
    assert elapsed < 10, f"exited {elapsed:.1f}s after SIGTERM"
    line = _error_line(err)
    assert "SIGTERM during the held-out evaluation after training (step 1)" in line and f"saved in {run / 'model'}" in line
    assert f"mixrl eval {run}" in line
    from mixrl.models.files import unreadable_file

    assert (run / "model" / "model.safetensors").is_file() and unreadable_file(run / "model") is None
    assert (run / "model" / "tokenizer_config.json").is_file()
    assert not (run / "FAILED").exists() and not (run / "summary.json").exists()


@pytest.mark.slow  # 16-17 s alone: make test-slow
def test_sigterm_during_the_evaluation_before_training_stops_in_seconds(tiny_model_path, tmp_path):
    run = tmp_path / "run"
    proc = _train([*FAST, f"model.path={tiny_model_path}", f"run_dir={run}", *LONG_EVAL], tmp_path)
    err, elapsed = _sigterm_once(proc, run / "config.yaml", settle=5.0)  # the trainer is built, the evaluation under way
    assert proc.returncode == 130, err[-3000:]
    assert elapsed < 10, f"exited {elapsed:.1f}s after SIGTERM"
    line = _error_line(err)
    assert "SIGTERM during the held-out evaluation before training; nothing to resume" in line
    assert not (run / "eval_before.json").exists() and (run / "FAILED").is_file()
