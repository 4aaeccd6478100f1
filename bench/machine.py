"""Where and on what a benchmark ran: the machine and software versions, the commit (marked
when the work tree has uncommitted changes), and the load average, for the report's header.
Shared by ``python -m bench.throughput`` and ``python -m bench.vllm_steps``.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

#: the repository root (``git_commit`` reads it; reports shorten file names relative to it)
REPO = Path(__file__).resolve().parent.parent


def machine_info(device: str) -> dict:
    """CPU model and count, torch threads, Python/torch/transformers/trl versions; the GPU and CUDA on ``cuda``."""
    import torch  # deferred: torch loads only when something is measured (`--help` and the report stay light)
    import transformers  # deferred: transformers loads only when a model is built or measured
    import trl  # deferred: TRL loads only when a trainer is built

    cpu_model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "cpu": cpu_model, "cpu_count": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch_threads": torch.get_num_threads(), "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "trl": trl.__version__, "device": device, "platform": platform.platform(),
    }
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    return info


def git_commit() -> str:
    """The short commit of the repository, "(+ uncommitted changes)" when tracked files differ; "unknown" outside git."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        return sha + (" (+ uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages ("n/a" where the OS has none)."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"
