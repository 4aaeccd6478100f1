"""Memory probes of the step-time benchmark: the process's RSS high-water mark (resettable at
every step begin on Linux) and the bytes of a variant's parameters + optimizer state. CUDA peaks
are read by the timer itself (``torch.cuda.max_memory_allocated``). The allocator-peak
measurement against ``mixrl plan`` is a benchmark of its own: :mod:`bench.memory`.
"""

from __future__ import annotations

import resource
from pathlib import Path


def rss_hwm_mb() -> float:
    """Peak RSS of the process (VmHWM; resettable), else ru_maxrss (lifetime peak)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_rss_peak() -> bool:
    """Reset the RSS high-water mark to the current RSS (Linux >= 4.0); False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def state_mb(model, optimizer) -> float:
    """MB of the model's parameters plus the optimizer's state tensors (an accelerate wrapper is looked through)."""
    import torch  # deferred: torch loads only when something is measured (`--help` and the report stay light)

    total = sum(p.numel() * p.element_size() for p in model.parameters())
    opt = getattr(optimizer, "optimizer", optimizer)
    for st in getattr(opt, "state", {}).values():
        for v in st.values():
            if isinstance(v, torch.Tensor):
                total += v.numel() * v.element_size()
    return total / 2**20


def lifetime_peak_rss_mb() -> float:
    """The process's lifetime RSS peak (ru_maxrss; never reset)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
