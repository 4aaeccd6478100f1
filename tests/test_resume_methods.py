"""Resume holds for every method family: a run interrupted right after a checkpoint and
continued with ``resume=RUN_DIR`` ends with exactly the weights (``torch.equal``) and per-step
losses of the same run left uninterrupted.

One method per family: expert rows (CHORD, killed with SIGKILL in a real process), in-group
injection (LUFFY), prefixes (Prefix-RFT), hints (Guide), replay (ReMix), a teacher (KDRL, with
a throwaway tiny teacher) and staleness (GRPO with ``trainer.staleness=2`` and
``trainer.num_iterations=2``, interrupted inside a generation batch). The other cases stop the
process in-process right after the checkpoint is written (a ``BaseException``, as abrupt for
the trainer as a kill: nothing after it runs), which is cheaper than a subprocess and resumes
through the same path. Each run is 4 tiny steps on one thread.
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
import torch
from typer.testing import CliRunner

from mixrl.cli.main import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
STEPS = 4
#: a smaller batch than FAST: these runs only need to exercise every piece of state
SMALL = ["trainer.prompts_per_step=2", "trainer.micro_batch_size=4", "trainer.eval_size=0", "data.train_size=32",
         "trainer.max_completion_length=16", "trainer.save_total_limit=10"]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> str:
    from mixrl.models import tiny

    return str(tiny.teacher_warm_start(tmp_path_factory.mktemp("teacher-cache"), steps=4, progress=False))


class _Stop(BaseException):
    """Ends the run the moment a checkpoint is written (nothing of the trainer runs after it)."""


def _args(fast_overrides: list[str], run_dir: Path, extra: list[str]) -> list[str]:
    base = [o for o in fast_overrides if not o.startswith("run_dir=")]
    return ["train", *base, *SMALL, f"trainer.max_steps={STEPS}", *extra, f"run_dir={run_dir}"]


def _stop_after_checkpoint(monkeypatch, step: int) -> None:
    from mixrl.trainer.grpo import MixrlGRPOTrainer

    save = MixrlGRPOTrainer._save_checkpoint

    def save_then_stop(self, model, trial):
        save(self, model, trial)
        if self.state.global_step == step:
            raise _Stop()

    monkeypatch.setattr(MixrlGRPOTrainer, "_save_checkpoint", save_then_stop)


def _resume(run_dir: Path) -> None:
    res = runner.invoke(app, ["train", f"resume={run_dir}", "logger.progress=false", "hardware.torch_threads=1"])
    assert res.exit_code == 0, res.output[-3000:]
    assert "resuming" in res.stderr


def _assert_same_run(full: Path, resumed: Path) -> None:
    from safetensors.torch import load_file

    wa, wb = load_file(str(full / "model" / "model.safetensors")), load_file(str(resumed / "model" / "model.safetensors"))
    assert wa.keys() == wb.keys()
    differ = [k for k in wa if not torch.equal(wa[k], wb[k])]
    assert not differ, f"{len(differ)} tensors differ, e.g. {differ[0]} by {float((wa[differ[0]] - wb[differ[0]]).abs().max())}"
    rows = lambda d: [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    ra, rb = rows(full), rows(resumed)
    assert [r["step"] for r in ra] == [r["step"] for r in rb] == list(range(1, STEPS + 1))
    for x, y in zip(ra, rb):
        for key in x:
            if key.startswith("loss") or key in ("reward_mean", "staleness", "grad_norm"):
                same = y.get(key) == x[key] or (x[key] != x[key] and y.get(key) != y.get(key))  # NaN: not logged
                assert same, (x["step"], key, x[key], y.get(key))
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (full, resumed))
    assert (sa["rollouts"], sa["generated_tokens"]) == (sb["rollouts"], sb["generated_tokens"])


CASES = {
    "luffy": (["algo=luffy"], 2),
    "prefix_rft": (["algo=prefix_rft"], 2),
    "guide": (["algo=guide"], 2),
    "remix": (["algo=remix"], 2),
    "kdrl": (["algo=kdrl"], 2),
    # the lag snapshots of trainer.staleness (the generation at step 2 uses step 0's weights) and TRL's buffered batch (step 1 is inside a generation batch)
    "staleness": (["algo=grpo", "trainer.staleness=2", "trainer.num_iterations=2", "trainer.save_steps=1"], 1),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_interrupted_after_a_checkpoint_then_resumed_ends_with_identical_weights(name, fast_overrides, tmp_path, monkeypatch, request):
    extra, stop = CASES[name]
    extra = [*extra, "trainer.save_steps=2"] if not any(e.startswith("trainer.save_steps") for e in extra) else extra
    if name == "kdrl":
        extra.append(f"teacher.source.models=[{request.getfixturevalue('teacher')}]")
    full = runner.invoke(app, _args(fast_overrides, tmp_path / "full", extra))
    assert full.exit_code == 0, full.output[-3000:]

    with monkeypatch.context() as m, pytest.raises(_Stop):
        _stop_after_checkpoint(m, stop)
        runner.invoke(app, _args(fast_overrides, tmp_path / "cut", extra))
    assert (tmp_path / "cut" / "trainer" / f"checkpoint-{stop}").is_dir() and not (tmp_path / "cut" / "model").exists()
    _resume(tmp_path / "cut")
    _assert_same_run(tmp_path / "full", tmp_path / "cut")


@pytest.mark.slow
def test_chord_killed_with_sigkill_then_resumed_ends_with_identical_weights(fast_overrides, tmp_path):
    """CHORD's expert rows are drawn with a generator seeded on TRL's micro-batch counter,
    which a fresh process starts at 0 unless the checkpoint restores it."""
    extra = ["algo=chord", "trainer.save_steps=2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    import threading

    killed = subprocess.Popen([sys.executable, "-m", "mixrl.cli.main", *_args(fast_overrides, tmp_path / "killed", extra)],
                              env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ckpt = tmp_path / "killed" / "trainer" / "checkpoint-2" / "trainer_state.json"

    watcher = threading.Thread(target=sigkill_once_written, args=(ckpt, killed))
    watcher.start()
    full = runner.invoke(app, _args(fast_overrides, tmp_path / "full", extra))  # meanwhile
    watcher.join()
    _, err = killed.communicate()
    assert full.exit_code == 0, full.output[-3000:]
    assert killed.returncode == -signal.SIGKILL, err[-3000:]
    assert not (tmp_path / "killed" / "model").exists()  # cut short after the checkpoint
    _resume(tmp_path / "killed")
    _assert_same_run(tmp_path / "full", tmp_path / "killed")
