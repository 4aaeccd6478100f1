"""Inputs that must be refused before anything is created, and failures that must be one line.

Each refused start runs the real ``mixrl train`` (tokenizer, data and reward checks included)
from an empty working directory with the default run directory, and asserts: exit 2, one
``error:`` line naming the problem, no traceback, and the directory listing unchanged (no
orphan run directory). Parameter ranges are checked through ``mixrl explain`` and ``mixrl
train`` alike (one validation). Failures during a run (disk full, a read-only folder, a
reward that hangs or outlives ``reward.timeout_s``, SIGTERM) end with one line too.
"""

from __future__ import annotations

import errno
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import FAST, ModelLoaded, fail_model_loading
from mixrl.cli.main import app

runner = CliRunner()
CASES = Path(__file__).parent / "fixtures" / "reward_cases.py"


@pytest.fixture
def no_model(monkeypatch):
    """Loading the policy model fails the test: every refusal here comes before it."""
    import transformers

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fail_model_loading)


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def one_line(res, code: int = 2) -> str:
    """The single ``error:`` line of a CLI result that exited with ``code``."""
    assert not isinstance(res.exception, ModelLoaded), str(res.exception)
    assert res.exit_code == code, f"exit {res.exit_code} ({res.exception!r}); output: {res.output[-2000:]}"
    assert "Traceback" not in res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], lines
    return errors[0]


def _rows(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


# --------------------------------------------------------------------------- refused starts leave nothing
def _bad_utf8(d: Path) -> str:
    p = d / "latin1.jsonl"
    p.write_bytes(b'{"prompt": "1+1=", "answer": "2"}\n{"prompt": "caf\xe9 1+2=", "answer": "3"}\n')
    return f"data.source={p}"


REFUSED = [
    # (name, overrides given the data folder, fragments of the one line)
    ("bad override value", lambda d: ["trainer.learning_rate=nan"], ["trainer.learning_rate=nan", "not a finite number", "> 0"]),
    ("negative seed", lambda d: ["seed=-1"], ["seed=-1", "[0, 4294967295]"]),
    ("seed beyond 32 bits", lambda d: ["seed=100000000000000000000000"], ["seed=", "[0, 4294967295]"]),
    ("missing data file", lambda d: [f"data.source={d / 'nope.jsonl'}"], ["data file not found", "nope.jsonl"]),
    ("unknown reward", lambda d: ["reward.name=exactt"], ["unknown reward 'exactt'", "did you mean: exact"]),
    ("missing model path", lambda d: [f"model.path={d / 'no-model'}"], ["no-model", "is not a directory"]),
    ("reward returns strings", lambda d: [f"reward.name={CASES}:string_reward"], ["returned str", "must be a float"]),
    ("reward returns NaN", lambda d: [f"reward.name={CASES}:nan_reward"], ["returned nan", "finite float"]),
    ("reward returns 1e300", lambda d: [f"reward.name={CASES}:huge_reward"], ["returned 1e+300", "float32", "scale the reward down"]),
    ("reward returns None for every row", lambda d: [f"reward.name={CASES}:none_reward"], ["returned None (no score) for every checked", "learn nothing"]),
    ("empty answers", lambda d: [f"data.source={_rows(d / 'empty.jsonl', [{'prompt': f'{i}+1=', 'answer': ''} for i in range(40)])}"],
     ["answer (column 'answer'", "is empty", "data.answer_column"]),
    ("non-UTF-8 row", lambda d: [_bad_utf8(d)], ["latin1.jsonl, line 2", "not UTF-8", "re-encode"]),
    ("200 identical rows", lambda d: [f"data.source={_rows(d / 'same.jsonl', [{'prompt': '1+1=', 'answer': '2'}] * 200)}"],
     ["too small for one step", "200 rows read", "8 held out", "0 left", "trainer.prompts_per_step=4"]),
    ("too few rows for a step", lambda d: [f"data.source={_rows(d / 'three.jsonl', [{'prompt': f'{i}+1=', 'answer': str(i + 1)} for i in range(3)])}",
                                           "trainer.eval_size=0"],
     ["too small for one step", "3 training rows", "trainer.prompts_per_step=4"]),
    ("run name too long", lambda d: [f"run_dir={d / ('x' * 300)}"], ["cannot be used", "File name too long", "shorter run_dir"]),
]


@pytest.mark.parametrize("name, make, fragments", REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_start_is_one_line_and_creates_nothing(name, make, fragments, tiny_model_path, tmp_path, monkeypatch, no_model):
    data, work = tmp_path / "data", tmp_path / "work"
    data.mkdir()
    work.mkdir()
    overrides = make(data)
    monkeypatch.chdir(work)
    before_work, before_data = listing(work), listing(data)
    model = [] if any(o.startswith("model.path=") for o in overrides) else [f"model.path={tiny_model_path}"]
    line = one_line(runner.invoke(app, ["train", *FAST, *model, *overrides]))
    for fragment in fragments:
        assert fragment in line, line
    assert listing(work) == before_work, "a failed start left files behind"
    assert listing(data) == before_data


def test_failed_staged_start_creates_nothing(tiny_model_path, tmp_path, monkeypatch, no_model):
    monkeypatch.chdir(tmp_path)
    line = one_line(runner.invoke(app, ["train", *FAST, f"model.path={tiny_model_path}", "algo=sft_then_rl",
                                        f"data.source={tmp_path / 'nope.jsonl'}"]))
    assert "data file not found" in line
    assert listing(tmp_path) == []


def test_failed_launched_start_creates_nothing(tiny_model_path, tmp_path, monkeypatch):
    """hardware=cpu-2proc: the launcher checks the data before writing RUN_DIR/launch/."""
    import mixrl.launch as launch

    monkeypatch.setattr(launch.subprocess, "Popen", fail_model_loading)  # no process may start
    monkeypatch.chdir(tmp_path)
    line = one_line(runner.invoke(app, ["train", *FAST, f"model.path={tiny_model_path}", "hardware=cpu-2proc",
                                        f"reward.name={CASES}:string_reward"]))
    assert "returned str" in line
    assert listing(tmp_path) == []


# --------------------------------------------------------------------------- parameter ranges
RANGES = [
    # (overrides, the key as the message names it, the range)
    (["algo=luffy", "algo.gamma=-1"], "algo.terms.offpolicy.gamma=-1", "gamma > 0"),
    (["algo=luffy", "algo.gamma=0"], "algo.terms.offpolicy.gamma=0", "gamma > 0"),
    (["algo.loss.clip_low=1.5"], "algo.loss.clip_low=1.5", "clip_low in [0, 1]"),
    (["algo.loss.clip_high=-0.1"], "algo.loss.clip_high=-0.1", "clip_high >= 0"),
    (["algo.loss.dual_clip_c=1"], "algo.loss.dual_clip_c=1", "dual_clip_c > 1"),
    (["algo.loss.name=reinforce", "algo.loss.tis_cap=0.5"], "algo.loss.tis_cap=0.5", "tis_cap >= 1"),
    (["algo.loss.name=sapo", "algo.loss.tau_neg=0"], "algo.loss.tau_neg=0", "tau_neg > 0"),
    (["algo.loss.name=m2po", "algo.loss.m2_budget=-1"], "algo.loss.m2_budget=-1", "m2_budget >= 0"),
    (["algo.advantage.eps=0"], "algo.advantage.eps=0", "eps > 0"),
    (["algo.aggregation.max_len=0"], "algo.aggregation.max_len=0", "max_len >= 1"),
    (["algo=chord", "algo.terms.sft.token_weight.cutoff=1.5"], "algo.terms.sft.token_weight.cutoff=1.5", "cutoff in [0, 1]"),
    (["algo=chord", "algo.inject.ratio=1"], "algo.inject.ratio=1", "ratio in (0, 1)"),
    (["algo=luffy", "algo.inject.per_group=0"], "algo.inject.per_group=0", "per_group >= 1"),
    (["algo=remix", "offpolicy.source.capacity=0"], "offpolicy.source.capacity=0", "capacity >= 1"),
    (["algo=bapo", "algo.controller.rho0=1.5"], "algo.controller.rho0=1.5", "rho0 in [0, 1]"),
    (["algo=chord", "algo.mu.warmup=-1"], "algo.coefs.mu.warmup=-1", "warmup >= 0"),
    (["algo=repo_replay", "algo.inject.revisit=2"], "algo.inject.revisit=2", "revisit in [0, 1]"),
    (["algo=exopd", "algo.terms.distill.lam=-1"], "algo.terms.distill.lam=-1", "lam > 0"),
    (["algo.loss.clip_high=nan"], "algo.loss.clip_high=nan", "not a finite number"),
    (["model.lora.r=0"], "model.lora.r=0", ">= 1"),
    (["model.lora.dropout=1"], "model.lora.dropout=1", "[0, 1)"),
    (["trainer.learning_rate=-1"], "trainer.learning_rate=-1", "> 0"),
    (["trainer.top_p=1.5"], "trainer.top_p=1.5", "(0, 1]"),
    (["trainer.adam_beta2=1"], "trainer.adam_beta2=1", "[0, 1)"),
    (["reward.timeout_s=0"], "reward.timeout_s=0", "> 0"),
    (["reward.weight=-1"], "reward.weight=-1", ">= 0"),
    (["algo.terms.policy.weight=-1"], "algo.terms.policy.weight = -1", "must stay >= 0"),
]


@pytest.mark.parametrize("overrides, key, bound", RANGES, ids=[" ".join(r[0]) for r in RANGES])
def test_out_of_range_values_are_refused_by_explain_and_train(overrides, key, bound, tmp_path, monkeypatch, no_model):
    monkeypatch.chdir(tmp_path)
    for command in (["explain"], ["train", "hardware.torch_threads=1"]):
        line = one_line(runner.invoke(app, [*command, *overrides]))
        assert key in line and bound in line, (command, line)
    assert listing(tmp_path) == []


def test_every_declared_default_is_inside_its_range():
    """A bound that excludes its own component's default is a wrong bound."""
    import mixrl.core as core
    import mixrl.sources as sources

    checked = 0
    for reg in (core.POLICY_LOSSES, core.TOKEN_WEIGHTS, core.TERMS, core.ADVANTAGES, core.AGGREGATIONS,
                core.SCHEDULES, core.CONTROLLERS, sources.SOURCES, sources.INJECTIONS):
        for name in reg.names():
            defaults = reg.defaults(name)
            for key, bound in reg.bounds(name).items():
                default = defaults[key]
                if isinstance(default, (int, float)) and not isinstance(default, bool):
                    assert bound.contains(default), (reg.kind, name, key, default, str(bound))
                    checked += 1
    assert checked >= 30


def test_parse_bound_reads_every_form():
    from mixrl.core.registry import parse_bound

    assert [parse_bound(t).contains(0.0) for t in ("> 0", ">= 0", "< 0", "<= 0", "(0, 1]", "[0, 1)")] == [
        False, True, False, True, False, True]
    assert str(parse_bound("(0, 1]")) == "in (0, 1]" and str(parse_bound(">= 1")) == ">= 1"
    assert not parse_bound(">= 0").contains(math.inf) and not parse_bound("[0, 1]").contains(math.nan)
    with pytest.raises(ValueError, match="write"):
        parse_bound("positive")


# --------------------------------------------------------------------------- failures during a run
@pytest.mark.parametrize("err, words", [
    (OSError(errno.ENOSPC, "No space left on device"), ["the disk is full", "free space"]),
    (PermissionError(errno.EACCES, "Permission denied"), ["permission denied", "writable"]),
    (OSError(errno.EROFS, "Read-only file system"), ["read-only", "writable run_dir"]),
])
def test_a_failed_write_during_the_run_is_one_line_naming_the_file(err, words, fast_overrides, tmp_path, monkeypatch):
    """Disk full / read-only run directory, simulated (tests may run as root, where chmod
    does not stop writes): the first metrics.jsonl write raises the OSError."""
    from mixrl.trainer.callbacks import MetricsJsonlCallback

    metrics = tmp_path / "run" / "metrics.jsonl"

    def failing_write(self, args, state, control, logs=None, **kwargs):
        err.filename = str(metrics)
        raise err

    monkeypatch.setattr(MetricsJsonlCallback, "on_log", failing_write)
    line = one_line(runner.invoke(app, ["train", *fast_overrides]))
    assert f"could not write {metrics}" in line
    for w in words:
        assert w in line, line
    assert (tmp_path / "run" / "FAILED").read_text().strip() == line.removeprefix("error: ")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes through chmod")
def test_a_read_only_run_dir_is_refused(fast_overrides, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        line = one_line(runner.invoke(app, ["train", *fast_overrides, f"run_dir={ro / 'run'}"]))
    finally:
        ro.chmod(0o755)
    assert "cannot be written" in line and listing(ro) == []


def test_deadline_stops_a_sleeping_body_that_swallows_exceptions():
    from mixrl.rewards.deadline import RewardTimeout, deadline, in_reward_call

    t0 = time.perf_counter()
    with pytest.raises(RewardTimeout):
        with deadline(0.3):
            assert in_reward_call()
            for _ in range(20):
                try:
                    time.sleep(0.5)
                except Exception:  # noqa: BLE001 - a careless reward cannot swallow the timeout
                    pass
    assert time.perf_counter() - t0 < 2.0
    assert not in_reward_call()
    with deadline(5.0):  # a body that finishes in time is untouched, and no signal arrives later
        time.sleep(0.05)
    time.sleep(0.2)


def test_reward_timeout_stops_a_slow_reward_before_anything_is_created(tiny_model_path, tmp_path, monkeypatch, no_model):
    monkeypatch.chdir(tmp_path)
    t0 = time.perf_counter()
    line = one_line(runner.invoke(app, ["train", *FAST, f"model.path={tiny_model_path}",
                                        f"reward.name={CASES}:slow_reward", "reward.timeout_s=1"]))
    assert time.perf_counter() - t0 < 25, "the 30 s reward ran to its end"
    assert "did not return within reward.timeout_s=1 s" in line and "raise reward.timeout_s" in line
    assert listing(tmp_path) == []


def test_a_run_whose_rewards_are_all_none_trains_and_says_so(fast_overrides, tmp_path):
    res = runner.invoke(app, ["train", *fast_overrides, f"reward.name={CASES}:none_in_training"])
    assert res.exit_code == 0, res.output[-2000:]
    assert "no rollout got a reward at any step" in res.stderr
    assert "reward (last step) none (no rollout of the policy's own was scored)" in " ".join(res.stdout.split()), res.stdout[-600:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert any("no rollout got a reward" in w for w in summary["warnings"])


def _mixrl(args: list[str], env: dict, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mixrl.cli.main", "train", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, proc: subprocess.Popen, seconds: float = 240) -> None:
    t0 = time.time()
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() - t0 < seconds, "the reward never started hanging"
        time.sleep(0.2)


def _env(marker: Path) -> dict:
    return {**os.environ, "HANG_MARKER": str(marker), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": str(Path(__file__).parent.parent)}


def _sigterm_when_hanging(proc, marker: Path, settle: float = 0.0) -> tuple[str, float]:
    """Once the reward hangs (``marker`` exists), SIGTERM ``proc``; its stderr and the seconds it took to exit."""
    try:
        _wait_for(marker, proc)
        time.sleep(settle)
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
        return err, time.time() - t0
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow  # `mixrl train` in its own process, stopped by SIGTERM, ~30 s: `make test-slow`
def test_sigterm_stops_a_hung_reward_within_seconds_with_a_checkpoint(fast_overrides, tmp_path):
    marker = tmp_path / "hanging"
    proc = _mixrl([*fast_overrides, "trainer.max_steps=3", "trainer.save_steps=0", f"reward.name={CASES}:hang_in_training"],
                  _env(marker), tmp_path)
    err, elapsed = _sigterm_when_hanging(proc, marker, settle=0.5)
    assert elapsed < 10
    assert proc.returncode == 75, err[-2000:]  # SIGTERM after a checkpoint: preempted, to be requeued (PREEMPTED_EXIT)
    assert "Traceback" not in err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "SIGTERM while reward" in errors[0] and "checkpoint saved in" in errors[0], err[-2000:]
    run = tmp_path / "run"
    assert (run / "trainer" / "checkpoint-1").is_dir()  # save_steps=0: written by the stop itself
    assert f"resume={run}" in errors[0]


@pytest.mark.slow  # `mixrl train` in its own process, stopped by SIGTERM, ~30 s: `make test-slow`
def test_sigterm_during_the_pre_training_check_creates_nothing(tiny_model_path, tmp_path):
    marker, work = tmp_path / "hanging", tmp_path / "work"
    work.mkdir()
    proc = _mixrl([*FAST, f"model.path={tiny_model_path}", f"reward.name={CASES}:hang_always"], _env(marker), work)
    err, elapsed = _sigterm_when_hanging(proc, marker)
    assert elapsed < 10 and proc.returncode == 130, err[-2000:]
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "SIGTERM while reward" in errors[0], err[-2000:]
    assert listing(work) == []


def test_an_unwritable_run_dir_at_creation_is_one_line(tiny_model_path, tmp_path, monkeypatch, no_model):
    """A read-only folder (simulated: root writes through chmod) when the run directory is
    made: one line naming the file, exit 2; a raw PermissionError anywhere in train is too."""
    import mixrl.trainer.run as run

    target = tmp_path / "run" / "config.yaml"

    def denied(cfg, say=print, lock=None):
        raise PermissionError(errno.EACCES, "Permission denied", str(target))

    monkeypatch.setattr(run, "prepare_run_dir", denied)
    line = one_line(runner.invoke(app, ["train", *FAST, f"model.path={tiny_model_path}", f"run_dir={tmp_path / 'run'}"]))
    assert line == f"error: could not write {target}: permission denied; make the run directory writable (chmod u+w) or choose another run_dir"


def test_storage_error_reads_wrapped_and_torch_write_failures():
    from mixrl.errors import storage_error

    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/data/run/trainer/checkpoint-2/optimizer.pt")
        except OSError as inner:
            raise RuntimeError("saving failed") from inner
    except RuntimeError as outer:
        err = storage_error(outer)
    assert str(err).startswith("could not write /data/run/trainer/checkpoint-2/optimizer.pt: the disk is full")
    torch_err = RuntimeError("[enforce fail at inline_container.cc:603] . PytorchStreamWriter failed writing file data/0: file write failed")
    assert "the disk is probably full" in str(storage_error(torch_err))
    assert storage_error(ValueError("unrelated")) is None
    assert storage_error(OSError(errno.ENOENT, "No such file or directory")) is None


def test_a_missing_teacher_folder_creates_nothing(tiny_model_path, tmp_path, no_model):
    """The teacher is resolved with the other inputs, before the run directory (the probe found an orphan)."""
    run = tmp_path / "run"
    line = one_line(runner.invoke(app, ["train", *FAST, f"model.path={tiny_model_path}", "algo=opd", "teacher=model",
                                        "teacher.source.models=[/nonexistent/teacher]", f"run_dir={run}"]))
    assert "'/nonexistent/teacher' is not a directory" in line
    assert not run.exists() and list(tmp_path.iterdir()) == []


def test_rust_wrapped_os_errors_are_storage_errors():
    """safetensors reports the OS error only in its text: '(os error 27)' is EFBIG (a file-size limit), 28 ENOSPC."""
    from mixrl.errors import storage_error

    class SafetensorError(Exception):
        pass

    big = storage_error(SafetensorError("Error while serializing: I/O error: File too large (os error 27)"))
    assert big is not None and "larger than this machine allows" in str(big) and "ulimit -f" in str(big)
    assert "the disk is full" in str(storage_error(SafetensorError("I/O error: No space left (os error 28)")))
    assert storage_error(SafetensorError("Error while deserializing header: invalid header length")) is None
