"""Print an ``ATEN_CPU_CAPABILITY`` value other than this machine's best, for `make test-other-cpu`.

PyTorch picks the widest SIMD kernel set the CPU supports (avx512, avx2, or plain "default"
kernels; sve on some arm64); results differ in the last bits between them, as between
machines. Running the exact-value tests under another set shows, on one machine, whether a
pinned value is bound to one kind of CPU. Prints nothing when the machine has only one set.
"""

from __future__ import annotations

import torch

#: the next-narrower kernel set: avx512 machines are checked as avx2 ones, avx2 (and sve) ones as default
OTHER = {"avx512": "avx2", "avx2": "default"}

if __name__ == "__main__":
    best = torch.backends.cpu.get_cpu_capability().lower()
    print(OTHER.get(best, "" if best == "default" else "default"))
