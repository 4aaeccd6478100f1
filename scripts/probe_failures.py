#!/usr/bin/env python
"""Probe how mixrl fails, as a user meets it: bad overrides, bad data files, bad reward
functions, kills and resumes, odd run directories, run directories made by someone else.

Each case runs the real command line (``python -m mixrl.cli.main train|eval|explain ...``) in
a fresh folder, one case at a time, with tiny budgets (the FAST overrides of
tests/conftest.py, one torch thread, a tiny model warm-started for 10 steps once per probe),
and is classified automatically:

* ``clean``: what must fail exits 2 with exactly one ``error:`` line, no traceback, and leaves
  no new directory; what must work exits 0 (and passes the case's own check); where either is
  right (a run_dir holding the user's files), exit 0 or such a refusal;
* ``traceback``: a raw failure: a Python traceback, or a failure that is not one ``error:`` line
  (a usage box, several lines, an unexpected exit status);
* ``silently wrong``: exit 0 where the command must fail, a result that is meaningless (0 training
  steps, weights that differ after a resume), code from a run directory executed without being
  asked, a valid command refused, or a process that hangs past SIGTERM;
* ``data lost``: a file the user owned (data, reward file, someone's run) deleted or changed;
* ``orphan``: a failed start that left a new directory behind (a case that fails after
  training started must instead leave its run directory marked ``FAILED``).

A case may raise several flags; its class is the first of data lost, silently wrong,
traceback, orphan, clean. Usage::

    python scripts/probe_failures.py --out /tmp/probe.json          # all cases (about 15 minutes on one core)
    python scripts/probe_failures.py --only reward,resume            # cases whose name or group contains a word
    python scripts/probe_failures.py --list

The probe imports nothing of mixrl but the tiny model's warm start; every case is a
subprocess of the Python running this script (so run it with the environment mixrl is
installed in). It is not part of the test suite: it measures, it does not assert.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import FAST  # noqa: E402  the overrides that make a training run take seconds (the tests' own)

CLASSES = ("clean", "traceback", "silently wrong", "data lost", "orphan")
PRIORITY = ("data lost", "silently wrong", "traceback", "orphan")
TRACEBACK = "Traceback (most recent call last)"


# ----------------------------------------------------------------------------- running
@dataclass
class Proc:
    argv: list
    rc: int | None
    out: str
    err: str
    seconds: float
    timed_out: bool = False

    @property
    def text(self) -> str:
        return self.out + "\n" + self.err


@dataclass
class Result:
    name: str
    group: str
    expect: str
    cls: str = ""
    flags: list = field(default_factory=list)
    rc: int | None = None
    seconds: float = 0.0
    note: str = ""
    message: str = ""


class Ctx:
    """One case's folder and helpers; ``probe`` runs the command under test and records what it changed."""

    def __init__(self, work: Path, model: str, name: str, shared: dict):
        self.work, self.model, self.shared = work, model, shared
        self.dir = work / "cases" / name
        self.dir.mkdir(parents=True)
        self.protected: dict[str, str | None] = {}
        self.new_dirs: list[str] = []
        self.proc: Proc | None = None
        self.wrong: list[str] = []
        self.lost: list[str] = []
        self.note = ""

    # -- commands
    def env(self) -> dict:
        env = dict(os.environ)
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                   WANDB_MODE="disabled", COLUMNS="200", PYTHONUNBUFFERED="1")
        return env

    def run(self, *args: str, timeout: float = 300, cwd: Path | None = None, preexec=None) -> Proc:
        argv = [sys.executable, "-m", "mixrl.cli.main", *map(str, args)]
        t0 = time.perf_counter()
        try:
            p = subprocess.run(argv, cwd=cwd or self.dir, env=self.env(), capture_output=True, text=True,
                               timeout=timeout, preexec_fn=preexec, errors="replace")
            return Proc(argv, p.returncode, p.stdout, p.stderr, time.perf_counter() - t0)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
            return Proc(argv, None, out, err, time.perf_counter() - t0, timed_out=True)

    def train_args(self, *ovs: str) -> list[str]:
        return ["train", *FAST, f"model.path={self.model}", *ovs]

    def train(self, *ovs: str, **kw) -> Proc:
        return self.run(*self.train_args(*ovs), **kw)

    # -- the command under test
    def probe(self, *args: str, runner: Callable[[], Proc] | None = None, **kw) -> Proc:
        before_dirs = _dirs(self.dir)
        before = {p: _digest(Path(p)) for p in self.protected}
        self.proc = runner() if runner else self.run(*args, **kw)
        self.new_dirs = sorted(set(_dirs(self.dir)) - set(before_dirs))
        for p, h in before.items():
            now = _digest(Path(p))
            if now != h:
                self.lost.append(f"{Path(p).relative_to(self.dir)} {'deleted' if now is None else 'changed'}")
        return self.proc

    def protect(self, *paths: Path) -> None:
        """Files the user owns: any change or deletion by the probed command is data lost."""
        for path in paths:
            files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
            for f in files:
                self.protected[str(f)] = _digest(f)

    def write(self, rel: str, text: str | bytes) -> Path:
        p = self.dir / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        (p.write_bytes if isinstance(text, bytes) else p.write_text)(text)
        return p

    def rows(self, rel: str, rows: list[dict]) -> Path:
        return self.write(rel, "".join(json.dumps(r) + "\n" for r in rows))

    def reward(self, rel: str, body: str) -> Path:
        return self.write(rel, textwrap.dedent(body))

    def copy_run(self, key: str = "grpo", rel: str = "run") -> Path:
        dst = self.dir / rel
        shutil.copytree(self.shared_run(key), dst)
        return dst

    def shared_run(self, key: str = "grpo", *ovs: str) -> Path:
        """A finished 2-step run made once per probe (``key`` names it; first call's overrides)."""
        runs = self.shared.setdefault("runs", {})
        if key not in runs:
            d = self.work / "shared" / key
            p = self.run(*self.train_args(*ovs, f"run_dir={d}"), cwd=self.work)
            if p.rc != 0:
                raise RuntimeError(f"could not make the shared run {key}: {p.err.strip()[-400:]}")
            runs[key] = d
        return runs[key]


def _dirs(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_dir()]


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _weights(model_dir: Path) -> dict:
    from safetensors.torch import load_file  # deferred: imports torch

    return load_file(str(model_dir / "model.safetensors"))


def _max_diff(a: Path, b: Path) -> float:
    wa, wb = _weights(a), _weights(b)
    return max(float((wa[k].double() - wb[k].double()).abs().max()) for k in wa)


def _summary(run: Path) -> dict:
    try:
        return json.loads((run / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


# ----------------------------------------------------------------------------- cases
@dataclass
class Case:
    name: str
    group: str
    expect: str  # "fail": must exit 2 cleanly; "ok": must exit 0; "fail_or_warn": exit 2, or exit 0 saying so;
    # "either": exit 0, or a clean refusal (exit 2, one line); the user's files untouched either way
    fn: Callable[[Ctx], None]
    ok_rcs: tuple = (2,)
    #: the failure comes after training started: the run directory stays, marked FAILED with the
    #: one-line reason (not an orphan of a failed start)
    after_start: bool = False


CASES: list[Case] = []


def case(name: str, group: str, expect: str = "fail", ok_rcs: tuple = (2,), after_start: bool = False):
    def deco(fn):
        CASES.append(Case(name, group, expect, fn, ok_rcs, after_start))
        return fn
    return deco


def _bad_train(name: str, group: str, *ovs: str, expect: str = "fail", check=None):
    """A case: ``mixrl train FAST <ovs> run_dir=<case>/run`` must be refused."""
    def fn(ctx: Ctx) -> None:
        ctx.probe(*ctx.train_args(*ovs, f"run_dir={ctx.dir / 'run'}"))
        if check is not None:
            check(ctx)
    CASES.append(Case(name, group, expect, fn))


def _zero_steps(ctx: Ctx) -> None:
    s = _summary(ctx.dir / "run")
    if ctx.proc.rc == 0 and int(s.get("steps", -1)) == 0:
        ctx.wrong.append("0 training steps, exit 0")


# -- overrides
_bad_train("unknown-key", "config", "trainer.max_stepz=3")
_bad_train("unknown-algo", "config", "algo=nope")
_bad_train("wrong-type", "config", "trainer.max_steps=abc")
_bad_train("chord-mu-out-of-range", "config", "algo=chord", "algo.mu=1.5")
_bad_train("luffy-negative-gamma", "config", "algo=luffy", "algo.gamma=-0.5")
_bad_train("seed-negative", "config", "seed=-1")
_bad_train("seed-huge", "config", "seed=1e23")
_bad_train("learning-rate-nan", "config", "trainer.learning_rate=nan")
_bad_train("temperature-zero", "config", "trainer.temperature=0")
_bad_train("max-steps-zero", "config", "trainer.max_steps=0", check=_zero_steps)
_bad_train("data-limit-zero", "config", "data.limit=0")
_bad_train("sweep-without-m", "config", "seed=1,2")
_bad_train("gpu-hardware-on-cpu", "machine", "hardware=gpu-1x80g")
_bad_train("model-path-missing", "machine", "model.path=/nonexistent/model")
_bad_train("teacher-missing", "machine", "algo=opd", "teacher=model", "teacher.source.models=[/nonexistent/teacher]")


@case("explain-luffy-negative-gamma", "config")
def _explain_gamma(ctx):
    ctx.probe("explain", "algo=luffy", "algo.gamma=-0.5")


@case("explain-unknown-key", "config")
def _explain_key(ctx):
    ctx.probe("explain", "algo.nope=1")


@case("run-name-too-long", "machine")
def _long_name(ctx):
    ctx.probe(*ctx.train_args(f"run_dir={ctx.dir / ('x' * 300)}"))


#: as root, file permissions are ignored; run the read-only cases without the capabilities that ignore them
NO_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]


def _run_respecting_permissions(ctx: Ctx, *args: str) -> Proc:
    if os.geteuid() != 0:
        return ctx.run(*args)
    if shutil.which("setpriv") is None:
        raise RuntimeError("running as root without setpriv: file permissions cannot be probed")
    t0 = time.perf_counter()
    argv = [*NO_DAC, sys.executable, "-m", "mixrl.cli.main", *args]
    try:
        p = subprocess.run(argv, cwd=ctx.dir, env=ctx.env(), capture_output=True, text=True, timeout=300, errors="replace")
        return Proc(argv, p.returncode, p.stdout, p.stderr, time.perf_counter() - t0)
    except subprocess.TimeoutExpired as e:
        return Proc(argv, None, str(e.stdout or ""), str(e.stderr or ""), time.perf_counter() - t0, timed_out=True)


@case("run-dir-parent-read-only", "machine")
def _ro_parent(ctx):
    ro = ctx.dir / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    ctx.probe(runner=lambda: _run_respecting_permissions(ctx, *ctx.train_args(f"run_dir={ro / 'run'}")))
    ro.chmod(0o755)


@case("disk-full-while-saving", "machine", after_start=True)
def _disk_full(ctx):
    """RLIMIT_FSIZE of 1 MB (SIGXFSZ ignored): writes past it fail as on a full disk; the model (2.6 MB) cannot be saved."""
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, 1_000_000))

    ctx.probe(*ctx.train_args(f"run_dir={ctx.dir / 'run'}"), preexec=limit)


# -- data files
ARITH = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10)]


def _data_case(name: str, make: Callable[[Ctx], Path], *ovs: str, expect="fail", check=None):
    def fn(ctx: Ctx) -> None:
        data = make(ctx)
        ctx.protect(data)
        ctx.probe(*ctx.train_args(f"data.source={data}", *ovs, f"run_dir={ctx.dir / 'run'}"))
        if check:
            check(ctx)
    CASES.append(Case(name, "data", expect, fn))


_data_case("data-file-missing", lambda c: c.dir / "missing.jsonl")
_data_case("data-file-empty", lambda c: c.write("empty.jsonl", ""))
_data_case("data-invalid-json-line", lambda c: c.write("bad.jsonl", "".join(json.dumps(r) + "\n" for r in ARITH[:50]) + "{not json\n"))
_data_case("data-not-utf8", lambda c: c.write("latin.jsonl", b"".join((json.dumps(r) + "\n").encode() for r in ARITH[:50])
                                               + b'{"prompt": "caf\xe9 1+1=", "answer": "2"}\n'))
_data_case("data-missing-column", lambda c: c.rows("q.jsonl", [{"q": r["prompt"], "answer": r["answer"]} for r in ARITH]))
_data_case("data-200-identical-rows", lambda c: c.rows("same.jsonl", [ARITH[3]] * 200), check=_zero_steps)
_data_case("data-too-small-for-a-step", lambda c: c.rows("tiny.jsonl", ARITH[:3]), check=_zero_steps)
_data_case("data-all-empty-answers", lambda c: c.rows("noans.jsonl", [{"prompt": r["prompt"], "answer": ""} for r in ARITH]),
           expect="fail_or_warn")
_data_case("data-eval-source-missing", lambda c: c.rows("ok.jsonl", ARITH), "data.eval_source=/nonexistent/eval.jsonl")


# -- reward functions
def _reward_case(name: str, body: str, expect="fail", check=None):
    def fn(ctx: Ctx) -> None:
        f = ctx.reward("my_reward.py", body)
        ctx.protect(f)
        ctx.probe(*ctx.train_args(f"reward.name={f}:fn", f"run_dir={ctx.dir / 'run'}"))
        if check:
            check(ctx)
    CASES.append(Case(name, "reward", expect, fn))


@case("reward-file-missing", "reward")
def _reward_missing(ctx):
    ctx.probe(*ctx.train_args(f"reward.name={ctx.dir / 'nope.py'}:fn", f"run_dir={ctx.dir / 'run'}"))


_reward_case("reward-syntax-error", "def fn(prompts, completions, **kw)\n    return [0.0]\n")
_reward_case("reward-raises", "def fn(prompts, completions, **kw):\n    raise RuntimeError('boom')\n")
_reward_case("reward-wrong-length", "def fn(prompts, completions, **kw):\n    return [1.0]\n")
_reward_case("reward-returns-strings", "def fn(prompts, completions, **kw):\n    return ['good' for _ in completions]\n")
_reward_case("reward-all-none", "def fn(prompts, completions, **kw):\n    return [None for _ in completions]\n", expect="fail_or_warn")
_reward_case("reward-all-nan", "def fn(prompts, completions, **kw):\n    return [float('nan') for _ in completions]\n",
             expect="fail_or_warn")
_reward_case("reward-all-1e300", "def fn(prompts, completions, **kw):\n    return [1e300 for _ in completions]\n",
             expect="fail_or_warn")


@case("reward-hangs-sigterm", "reward", ok_rcs=(2, 130))
def _reward_hang(ctx):
    """The reward hangs at its first call; SIGTERM must stop the run within 20 s."""
    entered = ctx.dir / "entered"
    f = ctx.reward("hang.py", f"""
        import time
        from pathlib import Path
        def fn(prompts, completions, **kw):
            Path({str(entered)!r}).write_text("x")
            time.sleep(3600)
            return [0.0 for _ in completions]
        """)

    def runner() -> Proc:
        argv = [sys.executable, "-m", "mixrl.cli.main", *ctx.train_args(f"reward.name={f}:fn", f"run_dir={ctx.dir / 'run'}")]
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, cwd=ctx.dir, env=ctx.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120
        while not entered.exists() and time.time() < deadline and p.poll() is None:
            time.sleep(0.2)
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        try:
            out, err = p.communicate(timeout=20)
            return Proc(argv, p.returncode, out, err, time.perf_counter() - t0)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            return Proc(argv, None, out, err, time.perf_counter() - t0, timed_out=True)

    ctx.probe(runner=runner)
    if ctx.proc.timed_out:
        ctx.note = "still running 20 s after SIGTERM: killed"


# -- run directories
@case("run-dir-with-users-FAILED-file", "run dirs", expect="either")
def _users_failed(ctx):
    """A folder of the user's that happens to hold a file named FAILED: training there must not delete it."""
    d = ctx.dir / "mine"
    ctx.write("mine/FAILED", "my notes\n")
    ctx.write("mine/thesis.tex", "\\documentclass{article}\n")
    ctx.protect(d)
    ctx.probe(*ctx.train_args(f"run_dir={d}"))


@case("run-dir-with-users-files", "run dirs", expect="either")
def _users_files(ctx):
    d = ctx.dir / "mine"
    ctx.write("mine/notes.txt", "keep me\n")
    ctx.protect(d)
    ctx.probe(*ctx.train_args(f"run_dir={d}"))


@case("resume-not-a-run", "resume")
def _resume_not_run(ctx):
    (ctx.dir / "empty").mkdir()
    ctx.probe(*ctx.train_args(f"resume={ctx.dir / 'empty'}"))


@case("resume-no-checkpoint", "resume")
def _resume_no_ckpt(ctx):
    run = ctx.copy_run()
    shutil.rmtree(run / "trainer")
    ctx.protect(run / "config.yaml")
    ctx.probe("train", f"resume={run}", "trainer.max_steps=3")


@case("resume-corrupt-checkpoint", "resume")
def _resume_corrupt(ctx):
    run = ctx.copy_run()
    ckpt = next((run / "trainer").glob("checkpoint-*"))
    for f in ckpt.glob("*.safetensors"):
        f.write_bytes(f.read_bytes()[:200])
    ctx.probe("train", f"resume={run}", "trainer.max_steps=3")


@case("resume-same-value-override", "resume", expect="ok")
def _resume_same(ctx):
    run = ctx.copy_run()
    ctx.probe("train", f"resume={run}", "trainer.max_steps=3", "trainer.eval_size=8")


@case("resume-refused-keeps-config", "resume")
def _resume_refused(ctx):
    run = ctx.copy_run()
    ctx.protect(run)
    ctx.probe("train", f"resume={run}", "trainer.learning_rate=0.5")


@case("resume-read-only-run", "resume")
def _resume_ro(ctx):
    run = ctx.copy_run()
    for p in [run, *run.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    ctx.protect(run)
    ctx.probe(runner=lambda: _run_respecting_permissions(ctx, "train", f"resume={run}", "trainer.max_steps=3"))
    for p in [run, *run.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)


def _kill_resume(ctx: Ctx, *ovs: str) -> None:
    """Train 6 steps straight; train again, SIGKILL once checkpoint-2 is complete, resume: final weights must match exactly."""
    common = [*ovs, "trainer.max_steps=6", "trainer.save_steps=1"]
    ref = ctx.dir / "straight"
    p = ctx.train(*common, f"run_dir={ref}")
    if p.rc != 0:
        ctx.note = f"the uninterrupted run failed (exit {p.rc})"
        ctx.proc = p
        return
    run = ctx.dir / "killed"
    argv = [sys.executable, "-m", "mixrl.cli.main", *ctx.train_args(*common, f"run_dir={run}")]
    proc = subprocess.Popen(argv, cwd=ctx.dir, env=ctx.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = run / "trainer" / "checkpoint-2" / "trainer_state.json"
    deadline = time.time() + 240
    while proc.poll() is None and not marker.exists() and time.time() < deadline:
        time.sleep(0.02)
    if proc.poll() is not None:
        ctx.note = "the run ended before it could be killed"
    proc.kill()
    proc.wait()
    ctx.probe("train", f"resume={run}")
    if ctx.proc.rc == 0:
        diff = _max_diff(ref / "model", run / "model")
        ctx.note = f"max |w_resumed - w_straight| = {diff:.3g}"
        if diff != 0.0:
            ctx.wrong.append(f"resumed weights differ from the uninterrupted run's by {diff:.3g}")


@case("kill9-resume-grpo", "resume", expect="ok")
def _kill_grpo(ctx):
    _kill_resume(ctx)


@case("kill9-resume-chord", "resume", expect="ok")
def _kill_chord(ctx):
    _kill_resume(ctx, "algo=chord")


@case("resume-prefix_rft", "resume", expect="ok")
def _resume_prefix_rft(ctx):
    run = ctx.dir / "run"
    p = ctx.train("algo=prefix_rft", f"run_dir={run}")
    if p.rc != 0:
        ctx.proc, ctx.note = p, "the prefix_rft run itself failed"
        return
    ctx.probe("train", f"resume={run}", "trainer.max_steps=3")


@case("eval-prefixrl-run", "eval", expect="ok")
def _eval_prefixrl(ctx):
    run = ctx.dir / "run"
    p = ctx.train("algo=prefixrl", f"run_dir={run}")
    if p.rc != 0:
        ctx.proc, ctx.note = p, "the prefixrl run itself failed"
        return
    ctx.probe("eval", str(run), "trainer.eval_size=8", "logger.progress=false")


@case("eval-missing-dir", "eval")
def _eval_missing(ctx):
    ctx.probe("eval", str(ctx.dir / "nope"))


@case("eval-dir-without-model", "eval")
def _eval_no_model(ctx):
    (ctx.dir / "empty").mkdir()
    ctx.probe("eval", str(ctx.dir / "empty"))


@case("eval-bad-override", "eval")
def _eval_bad_override(ctx):
    run = ctx.copy_run()
    ctx.probe("eval", str(run), "trainer.eval_sise=4")


# -- run directories made by someone else (the code they name must not run unasked)
def _marker_check(ctx: Ctx, marker: Path) -> None:
    if marker.exists():
        ctx.wrong.append(f"code named by the run directory ran ({marker.name} written)")


def _evil_reward(ctx: Ctx, run: Path, marker: Path) -> Path:
    return ctx.reward(f"{run.relative_to(ctx.dir)}/evil_reward.py", f"""
        from pathlib import Path
        Path({str(marker)!r}).write_text("ran")
        def fn(prompts, completions, **kw):
            return [0.0 for _ in completions]
        """)


def _set_config(run: Path, edit: Callable[[dict], None]) -> None:
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    edit(cfg)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


@case("eval-someones-run-reward-file", "security")
def _sec_eval_reward(ctx):
    run, marker = ctx.copy_run(), ctx.dir / "MARKER"
    f = _evil_reward(ctx, run, marker)
    _set_config(run, lambda c: c["reward"].update(name=f"{f}:fn", params={}))
    ctx.probe("eval", str(run), "logger.progress=false")
    _marker_check(ctx, marker)


@case("resume-someones-run-reward-file", "security")
def _sec_resume_reward(ctx):
    run, marker = ctx.copy_run(), ctx.dir / "MARKER"
    f = _evil_reward(ctx, run, marker)
    _set_config(run, lambda c: c["reward"].update(name=f"{f}:fn", params={}))
    ctx.probe("train", f"resume={run}", "trainer.max_steps=3")
    _marker_check(ctx, marker)


@case("resume-someones-run-plugin", "security")
def _sec_resume_plugin(ctx):
    run, marker = ctx.copy_run(), ctx.dir / "MARKER"
    ctx.write("evil_plugin.py", f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n")
    _set_config(run, lambda c: c.update(plugins=["evil_plugin"]))
    ctx.probe("train", f"resume={run}", "trainer.max_steps=3")
    _marker_check(ctx, marker)


@case("eval-someones-run-remote-code", "security")
def _sec_eval_remote(ctx):
    run, marker = ctx.copy_run(), ctx.dir / "MARKER"
    ctx.write("run/model/evil_config.py", f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
              "from transformers import PretrainedConfig\nclass EvilConfig(PretrainedConfig):\n    model_type = 'evil'\n")
    conf = json.loads((run / "model" / "config.json").read_text())
    conf["auto_map"] = {"AutoConfig": "evil_config.EvilConfig"}
    (run / "model" / "config.json").write_text(json.dumps(conf))
    _set_config(run, lambda c: c["model"].update(trust_remote_code=True))
    ctx.probe("eval", str(run), "logger.progress=false")
    _marker_check(ctx, marker)


@case("eval-someones-run-trusted", "security", expect="ok")
def _sec_eval_trusted(ctx):
    """With --trust-run-code the user asked: the run's reward file is imported and the evaluation runs."""
    run, marker = ctx.copy_run(), ctx.dir / "MARKER"
    f = _evil_reward(ctx, run, marker)
    _set_config(run, lambda c: c["reward"].update(name=f"{f}:fn", params={}))
    ctx.probe("eval", str(run), "--trust-run-code", "logger.progress=false")
    if ctx.proc.rc == 0 and not marker.exists():
        ctx.wrong.append("--trust-run-code given but the run's reward did not run")


# ----------------------------------------------------------------------------- classification
def classify(c: Case, ctx: Ctx) -> Result:
    p = ctx.proc
    r = Result(c.name, c.group, c.expect, rc=p.rc if p else None, seconds=round(p.seconds, 1) if p else 0.0, note=ctx.note)
    if p is None:
        r.flags, r.cls = ["traceback"], "traceback"
        r.note = r.note or "the case did not run its command"
        return r
    text = p.text
    errors = [line for line in p.err.splitlines() if line.startswith("error:")]
    r.message = (errors[0] if errors else (p.err.strip().splitlines() or [""])[-1])[:300]
    flags: list[str] = []
    if ctx.lost:
        flags.append("data lost")
        r.note = "; ".join(filter(None, [r.note, *ctx.lost]))
    if ctx.wrong:
        flags.append("silently wrong")
        r.note = "; ".join(filter(None, [r.note, *ctx.wrong]))
    raw = TRACEBACK in text
    one_line = len(errors) == 1 and not raw
    if p.timed_out:
        flags.append("silently wrong")
        r.note = r.note or "hung: killed at the time limit"
    elif c.expect == "ok":
        if p.rc != 0:
            flags.append("traceback" if raw or not one_line else "silently wrong")
            if not raw and one_line:
                r.note = "; ".join(filter(None, [r.note, "a valid command was refused"]))
    elif c.expect == "either":
        if p.rc != 0 and not (p.rc in c.ok_rcs and one_line):
            flags.append("traceback")
    elif c.expect == "fail_or_warn":
        if p.rc == 0 and "warning" not in text.lower():
            flags.append("silently wrong")
            r.note = "; ".join(filter(None, [r.note, "exit 0 without a warning"]))
        elif p.rc != 0 and not (p.rc in c.ok_rcs and one_line):
            flags.append("traceback")
    else:
        if p.rc == 0:
            flags.append("silently wrong")
            r.note = "; ".join(filter(None, [r.note, "exit 0 where it must fail"]))
        elif raw or not (p.rc in c.ok_rcs and one_line):
            flags.append("traceback")
    if c.after_start and p.rc not in (0, None):
        failed = [Path(d) / "FAILED" for d in ctx.new_dirs if (Path(d) / "FAILED").is_file()]
        if not failed:
            flags.append("silently wrong")
            r.note = "; ".join(filter(None, [r.note, "failed after training started but no run directory says FAILED"]))
    elif p.rc not in (0, None) and ctx.new_dirs:
        flags.append("orphan")
        tops = sorted({str(Path(d).relative_to(ctx.dir)).split("/")[0] for d in ctx.new_dirs})
        r.note = "; ".join(filter(None, [r.note, "left " + ", ".join(tops)]))
    r.flags = sorted(set(flags), key=PRIORITY.index)
    r.cls = r.flags[0] if r.flags else "clean"
    return r


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    ap.add_argument("--only", help="comma-separated words: run the cases whose name or group contains one")
    ap.add_argument("--work", type=Path, help="working folder (default: a temporary one, removed after)")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    args = ap.parse_args(argv)
    cases = CASES
    if args.only:
        words = [w.strip() for w in args.only.split(",") if w.strip()]
        cases = [c for c in CASES if any(w in c.name or w in c.group for w in words)]
    if args.list:
        for c in cases:
            print(f"{c.group:10s} {c.name:38s} expect {c.expect}")
        return 0
    work = Path(args.work or tempfile.mkdtemp(prefix="mixrl-probe-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch_threads = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    from mixrl.models import tiny  # deferred: imports torch

    model = str(tiny.warm_start(work / "tiny", steps=10, progress=False))
    if torch_threads is not None:
        os.environ["OMP_NUM_THREADS"] = torch_threads
    shared: dict = {}
    results: list[Result] = []
    t_all = time.perf_counter()
    for i, c in enumerate(cases, 1):
        ctx = Ctx(work, model, c.name, shared)
        try:
            c.fn(ctx)
            r = classify(c, ctx)
        except Exception as e:  # noqa: BLE001 - a probe bug, reported as such, never hidden
            r = Result(c.name, c.group, c.expect, cls="probe error", note=f"{type(e).__name__}: {e}"[:300])
        results.append(r)
        print(f"[{i:2d}/{len(cases)}] {r.cls:14s} {c.name:38s} rc={r.rc} {r.seconds:5.1f}s  {r.note or r.message}"[:220], flush=True)
    counts = Counter(r.cls for r in results)
    print()
    print(f"{'case':38s} {'group':9s} {'expect':12s} {'rc':>4s} {'class':14s} note / message")
    for r in results:
        print(f"{r.name:38s} {r.group:9s} {r.expect:12s} {str(r.rc):>4s} {r.cls:14s} {(r.note or r.message)[:120]}")
    print()
    print("counts: " + ", ".join(f"{k} {counts.get(k, 0)}" for k in (*CLASSES, "probe error") if counts.get(k, 0) or k in CLASSES)
          + f"  ({len(results)} cases, {time.perf_counter() - t_all:.0f}s)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"counts": {k: counts.get(k, 0) for k in (*CLASSES, "probe error")},
                                        "cases": [asdict(r) for r in results]}, indent=2) + "\n")
        print(f"wrote {args.out}")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
