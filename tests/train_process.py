"""``mixrl train`` in a process of its own, for tests that launch processes (FSDP on gloo, rehearsals)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port free now (the system's pick: another process choosing at the same time gets another)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_env(**extra: str) -> dict:
    """This environment without a launcher's rank variables, offline, one thread, this checkout first."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MIXRL_LAUNCHED")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", WANDB_MODE="disabled",
               OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])), **extra)
    return env


def train_in_group(args: list[str], log: Path, *, timeout: float, grace: float, env: dict | None = None) -> tuple[int | str, float]:
    """``mixrl train ARGS`` in its own process group: (exit status or "hung", seconds). A run past
    ``timeout`` (a collective some process never joins) gets Ctrl-C, which the launcher forwards to
    torchrun and torchrun to its workers (each in a session of its own, out of reach of a kill of
    this group); after ``grace`` seconds whatever is left of the group is killed."""
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "mixrl.cli.main", "train", *args], cwd=ROOT,
                                env=env if env is not None else train_env(),
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        rc: int | str = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        rc = "hung"
    return rc, time.perf_counter() - t0
