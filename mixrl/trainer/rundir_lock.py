"""One mixrl process at a time per run directory.

A run holds an exclusive ``flock`` on ``RUN_DIR/.mixrl.lock`` (created by the first run and
left in place; it holds the holder's pid) from before it writes anything until it ends, so a
second ``mixrl train resume=RUN_DIR`` (or a new run with the same ``run_dir``) started
meanwhile is refused with one line instead of writing the same metrics and checkpoints. The
kernel drops the lock when the process dies, even under SIGKILL, so a killed run never
leaves a stale lock behind. Only rank 0 of a multi-process run takes it; a resume started
through the launcher (:mod:`mixrl.launch`) takes it in the launching process, before it
writes ``launch/``, and tells the processes it starts (``MIXRL_RUN_DIR_LOCK_HELD``) not to.
"""

from __future__ import annotations

import os
from pathlib import Path

from mixrl.errors import ConfigError

LOCK_FILE = ".mixrl.lock"
#: set by the launcher for the processes it starts: the run directory whose lock it holds for them
HELD_ENV = "MIXRL_RUN_DIR_LOCK_HELD"


class RunDirLock:
    """``acquire(run_dir)`` takes the lock (ConfigError when another process holds it);
    ``release()`` drops it (idempotent)."""

    def __init__(self):
        self.fd: int | None = None

    def acquire(self, run_dir: str | Path) -> None:
        if self.fd is not None:
            return  # held already (taken early, before the run's inputs were loaded)
        if os.environ.get(HELD_ENV) == os.path.realpath(run_dir):
            return  # the launcher that started this process holds it
        try:
            import fcntl
        except ImportError:  # not a POSIX system: no locking
            return
        path = Path(run_dir) / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ConfigError(f"run_dir '{run_dir}' cannot be written ({e.strerror or e}); choose a writable run_dir") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            pid = f" (pid {holder})" if holder.isdigit() else ""
            raise ConfigError(
                f"run_dir '{run_dir}' is in use by another mixrl process{pid}; wait until it ends (or stop it), "
                "then run the command again"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is None:
            return
        import fcntl

        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            os.close(self.fd)
            self.fd = None
