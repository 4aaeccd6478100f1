"""What ``resume=`` and a reused ``run_dir`` may touch (no training: refusals happen before
any model loads).

* a resume with overrides equal to the run's own values is accepted, a real change refused
  with one line naming the key and both values;
* a refused resume changes nothing in the run directory (listing and file hashes before and after);
* two processes on one run directory: the second is refused (an exclusive lock held for the run);
* a run directory marked FAILED is cleared of mixrl's files only, and refused when it also
  holds a file mixrl did not write.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mixrl.cli.main import app
from mixrl.config.compose import compose_config
from mixrl.errors import ConfigError
from mixrl.trainer.state.resume import resume_config, same_value
from mixrl.trainer.state.rundir import config_text

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
RUN = ["algo=chord", "algo.mu=0.3", "trainer.eval_size=32", "trainer.learning_rate=1e-6", "trainer.max_steps=4"]


def _run_dir(tmp_path: Path, overrides=RUN, step: int = 2, failed: bool = True) -> Path:
    """A run directory as a killed run leaves it: config.yaml, a checkpoint, metrics, FAILED."""
    d = tmp_path / "run"
    d.mkdir()
    (d / "config.yaml").write_text(config_text(compose_config([*overrides, f"run_dir={d}"])))
    ckpt = d / "trainer" / f"checkpoint-{step}"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text("{}")
    (d / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    if failed:
        (d / "FAILED").write_text("killed\n")
    return d


def _snapshot(d: Path) -> dict[str, str]:
    """Every entry under ``d`` with the sha256 of each file's bytes (folders: 'dir')."""
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(d.rglob("*"))}


def _one_line(res, code: int = 2) -> str:
    assert res.exit_code == code, res.output[-2000:]
    assert "Traceback" not in res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    return lines[0]


# --------------------------------------------------------------------------- identical values
def test_values_compare_by_value_with_types_kept_apart():
    assert same_value(64, 64.0) and same_value(1e-6, 0.000001) and same_value([0.0, 0.9], [0, 0.9])
    assert not same_value(True, 1) and not same_value(None, 0) and not same_value("64", 64)
    assert same_value({"a": [1, {"b": 2}]}, {"a": [1.0, {"b": 2.0}]}) and not same_value({"a": 1}, {"a": 1, "b": 2})


def test_resume_accepts_overrides_equal_to_the_runs_own_values(tmp_path):
    d = _run_dir(tmp_path)
    cfg = resume_config(str(d), [f"resume={d}", "algo=chord", "algo.mu=0.30", "trainer.eval_size=32",
                                 "trainer.learning_rate=0.000001", "trainer.max_steps=9"])
    assert cfg.trainer.max_steps == 9 and cfg.algo.coefs.mu == 0.3 and cfg.trainer.eval_size == 32  # safe key applied


def test_the_runs_own_command_line_plus_resume_reaches_training(tmp_path, monkeypatch):
    from mixrl.trainer import run

    seen = []
    monkeypatch.setattr(run, "train_stages", lambda cfg, stages, console=None: seen.append(cfg) or run.RunResult(Path(cfg.resume), {}))
    d = _run_dir(tmp_path)
    before = _snapshot(d)
    res = runner.invoke(app, ["train", *RUN, f"resume={d}", "trainer.eval_size=32"])
    assert len(seen) == 1 and seen[0].resume == str(d) and seen[0].algo.coefs.mu == 0.3, res.output[-2000:]
    assert _snapshot(d) == before  # the checks wrote nothing


def test_resume_accepts_the_runs_own_recipe(tmp_path):
    d = _run_dir(tmp_path, ["recipe=chord/arith-tiny"])
    cfg = resume_config(str(d), ["recipe=chord/arith-tiny", "trainer.max_steps=500"])
    assert cfg.trainer.max_steps == 500 and cfg.recipe_info.name == "chord/arith-tiny"


@pytest.mark.parametrize("override, words", [
    ("algo.mu=0.5", "algo.coefs.mu is 0.3 in that run, 0.5 with this value"),
    ("algo=chord", "algo.coefs.mu is 0.3 in that run"),  # the group's defaults, not the run's mu
    ("trainer.eval_size=32 trainer.eval_size=64", "trainer.eval_size is 32 in that run, 64 with this value"),  # last wins
    ("trainer.eval_size=64", "trainer.eval_size is 32 in that run, 64 with this value"),
    ("recipe=chord/arith-tiny", "in that run"),
    ("algo.loss.clip_high=0.3", "algo.loss.clip_high"),
    ("trainer.max_steps=2", "nothing left to train"),  # a safe key, but the checkpoint is step 2
])
def test_a_refused_resume_changes_nothing_in_the_run_directory(override, words, tmp_path):
    d = _run_dir(tmp_path)
    before = _snapshot(d)
    line = _one_line(runner.invoke(app, ["train", f"resume={d}", "hardware.torch_threads=1", *override.split()]))
    assert words in line, line
    if "nothing left" not in words:
        assert f"'{override.split()[-1]}' would change what is trained" in line
    assert _snapshot(d) == before  # FAILED and config.yaml included


# --------------------------------------------------------------------------- config.yaml edited since the checkpoint
def _record_trained_config(d: Path, step: int = 2) -> None:
    """What a checkpoint of mixrl train holds: the config it was trained under (the trainer's progress state)."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from mixrl.trainer.state import checkpoint_state
    from mixrl.trainer.trl_hooks.checkpoints import RunProgress

    cfg = OmegaConf.to_container(compose_config([*RUN, f"run_dir={d}"]), resolve=True)
    trainer = SimpleNamespace(mixrl_rollouts=8, mixrl_generated_tokens=80, micro_step_at_checkpoint=lambda: 4,
                              spec=SimpleNamespace(config=cfg))
    checkpoint_state.save(str(d / "trainer" / f"checkpoint-{step}"), {"progress": RunProgress(trainer)}, rank=0, should_save=True)


@pytest.mark.parametrize("edit, words", [
    (("algo:\n  name: chord", "algo:\n  name: luffy"), "algo.name is chord there, luffy in config.yaml"),
    (("  learning_rate: 1.0e-06", "  learning_rate: 0.001"), "trainer.learning_rate is 1e-06 there, 0.001 in config.yaml"),
])
def test_a_config_yaml_edited_since_the_checkpoint_is_refused_like_the_same_override(tmp_path, edit, words):
    """Editing config.yaml to another algo (or any key a resume may not change) is the same change
    as the override on the command line: refused in one line, comparing with what the checkpoint
    was trained under, and nothing in the run directory changes."""
    d = _run_dir(tmp_path)
    _record_trained_config(d)
    text = (d / "config.yaml").read_text()
    assert edit[0] in text
    (d / "config.yaml").write_text(text.replace(edit[0], edit[1], 1))
    before = _snapshot(d)
    line = _one_line(runner.invoke(app, ["train", f"resume={d}", "hardware.torch_threads=1"]))
    assert f"resume={d}: its config.yaml no longer matches what checkpoint-2 was trained under" in line
    assert words in line and "start a new run" in line, line
    assert _snapshot(d) == before


def test_a_checkpoint_resumes_under_its_own_config_with_safe_changes(tmp_path, monkeypatch):
    from mixrl.trainer import run
    from mixrl.trainer.state.resume import trained_config

    seen = []
    monkeypatch.setattr(run, "train_stages", lambda cfg, stages, console=None: seen.append(cfg) or run.RunResult(Path(cfg.resume), {}))
    d = _run_dir(tmp_path)
    _record_trained_config(d)
    assert trained_config(d / "trainer" / "checkpoint-2")["algo"]["name"] == "chord"
    text = (d / "config.yaml").read_text()
    (d / "config.yaml").write_text(text.replace("max_steps: 4", "max_steps: 9", 1))  # a key a resume may change
    res = runner.invoke(app, ["train", f"resume={d}", "logger.progress=false"])
    assert len(seen) == 1 and seen[0].trainer.max_steps == 9, res.output[-2000:]


# --------------------------------------------------------------------------- one process per run
HOLD = """
import sys, time
from mixrl.trainer.state.rundir import RunDirLock
RunDirLock().acquire(sys.argv[1])
print("locked", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("hardware", ["cpu", "cpu-2proc"])  # cpu-2proc: refused by the launcher, before launch/ is written
def test_a_second_process_on_a_run_in_use_is_refused_and_changes_nothing(hardware, tmp_path):
    d = _run_dir(tmp_path, [*RUN, f"hardware={hardware}"])
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(d)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = _snapshot(d)
        line = _one_line(runner.invoke(app, ["train", f"resume={d}", "trainer.max_steps=6", "hardware.torch_threads=1"]))
        assert f"is in use by another mixrl process (pid {holder.pid})" in line
        assert _snapshot(d) == before and not (d / "launch").exists()
    finally:
        holder.kill()
        holder.wait()


def test_training_holds_the_lock_until_the_run_ends(tmp_path, monkeypatch):
    from mixrl.trainer import run
    from mixrl.trainer.state.rundir import RunDirLock

    seen = {}

    def fake_train(cfg, console, run_dir, guard, resume_from, before, inputs):
        with pytest.raises(ConfigError, match="in use by another mixrl process"):
            RunDirLock().acquire(run_dir)
        seen["resume_from"] = resume_from
        return run.RunResult(run_dir)

    monkeypatch.setattr(run, "_train", fake_train)
    d = _run_dir(tmp_path)
    cfg = resume_config(str(d), ["trainer.max_steps=6"])
    run.train(cfg)
    assert seen["resume_from"].name == "checkpoint-2"
    assert not (d / "FAILED").exists()  # the resumed run is no longer a failed one
    lock = RunDirLock()
    lock.acquire(d)  # released when the run ended
    lock.release()


# --------------------------------------------------------------------------- a FAILED run_dir
def test_a_failed_run_dir_with_a_users_file_is_refused_and_left_as_it_is(tmp_path):
    d = _run_dir(tmp_path)
    (d / "notes.txt").write_text("my notes\n")
    before = _snapshot(d)
    line = _one_line(runner.invoke(app, ["train", f"run_dir={d}", "logger.progress=false", "hardware.torch_threads=1"]))
    assert "'notes.txt'" in line and "did not write" in line and "choose another run_dir" in line
    assert _snapshot(d) == before and (d / "notes.txt").read_text() == "my notes\n"


def test_a_failed_run_dir_loses_only_mixrls_files(tmp_path):
    from mixrl.trainer.state.rundir import check_new_run_dir, clear_failed_run
    from mixrl.trainer.state.rundir import LOCK_FILE

    d = _run_dir(tmp_path)
    (d / "model").mkdir()
    (d / "model" / "model.safetensors").write_bytes(b"x")
    (d / LOCK_FILE).write_text("")
    notes = []
    assert check_new_run_dir(d, notes.append) is True and not notes  # reads only
    assert (d / "FAILED").exists()
    clear_failed_run(d, notes.append)
    assert d.is_dir() and sorted(p.name for p in d.iterdir()) == [LOCK_FILE]
    assert len(notes) == 1 and "marked FAILED (killed)" in notes[0]


# --------------------------------------------------------------------------- a corrupt checkpoint
@pytest.mark.parametrize("name, data", [
    ("model.safetensors", b"\x00\x01garbage"),           # header length beyond the file
    ("optimizer.pt", b"PK\x03\x04 truncated zip"),        # torch.save file cut short: no zip directory
    ("trainer_state.json", b'{"global_step": 2,'),       # torn JSON
])
def test_a_corrupt_checkpoint_is_refused_before_anything_changes(tmp_path, name, data):
    """resume= on a checkpoint with an unreadable file: one line naming the file and the fix, exit 2,
    the run directory unchanged (before: a raw SafetensorError from deep inside the Trainer)."""
    d = _run_dir(tmp_path)
    (d / "trainer" / "checkpoint-2" / name).write_bytes(data)
    before = _snapshot(d)
    line = _one_line(runner.invoke(app, ["train", f"resume={d}", "trainer.max_steps=6"]))
    assert f"checkpoint-2/{name} is unreadable" in line and "delete" in line and "start a new run" in line
    assert _snapshot(d) == before


def test_a_readable_checkpoint_passes_the_check(tmp_path):
    import torch
    from safetensors.torch import save_file

    from mixrl.trainer.state.rundir import unreadable_checkpoint_file

    ckpt = tmp_path / "checkpoint-1"
    ckpt.mkdir()
    save_file({"w": torch.ones(3)}, str(ckpt / "model.safetensors"))
    torch.save({"state": 1}, ckpt / "optimizer.pt")
    (ckpt / "trainer_state.json").write_text('{"global_step": 1}')
    assert unreadable_checkpoint_file(ckpt) is None
    (ckpt / "optimizer.pt").write_bytes((ckpt / "optimizer.pt").read_bytes()[:-30])  # cut: the zip directory is gone
    assert unreadable_checkpoint_file(ckpt)[0] == "optimizer.pt"
