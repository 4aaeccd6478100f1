"""Run model-written Python in a separate, limited process: :func:`run_python`.

What holds, and how (each layer is independent; the first to trigger gives the reason):

* **a separate process**: ``sys.executable -I -S -X utf8 _launcher.py`` started with
  :class:`subprocess.Popen` (fork-and-exec at once: nothing of the caller, torch included, runs in
  it), in its own session (``start_new_session``), so the whole process group is killed at the end;
  isolated mode and no ``site``: only the standard library is importable;
* **a private directory**: a fresh :func:`tempfile.mkdtemp` directory is the working directory,
  ``HOME`` and ``TMPDIR``; the environment is replaced (``HOME``, ``TMPDIR``, ``PATH=/usr/bin:/bin``,
  ``LANG``); the directory is removed afterwards;
* **kernel limits** set by the child on itself before the program runs (:mod:`mixrl.tools._launcher`):
  ``RLIMIT_CPU``, ``RLIMIT_AS``, ``RLIMIT_NPROC``, ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``,
  ``RLIMIT_CORE`` = 0;
* **no network**: where ``unshare`` can make one (:data:`ISOLATION`, probed once), the child runs in
  a new network namespace with only a loopback that is down (``unshare --user --map-root-user --net``,
  which needs unprivileged user namespaces; as root, ``unshare --net``): nothing outside is reachable
  even by code that steps around Python; the audit hook also refuses every ``socket.*`` event;
* **an audit hook** in the child (PEP 578) refuses new processes, signals, ``ctypes``, sockets, writes
  outside the directory and reads outside it and the standard library (see the launcher);
* **a wall-clock limit**: the parent reads the output with a deadline and kills the process group
  with SIGKILL when it passes, or when the output exceeds :attr:`Limits.max_output_chars`.

Known gaps (also in ``docs/guides/tools-sandbox.md``): ``RLIMIT_NPROC`` counts the processes of the
user id, and the kernel does not apply it to root: as root the audit hook alone refuses new
processes (a fork bomb is still refused, and the process group is killed at the end);
without a user namespace it counts every process of the user, so a program that may start processes
(``max_processes > 0``) may be refused early. The audit hook sees Python's ``open``/``os`` calls, not
files that C code of the standard library opens itself (``pwd`` reads ``/etc/passwd``, the time zone
database); ``os.stat`` of any path is allowed (it tells whether a file exists, not what it holds).
Without ``unshare`` the network is refused by the audit hook only.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

_LAUNCHER = str(Path(__file__).with_name("_launcher.py"))


@dataclass(frozen=True)
class Limits:
    """What a sandboxed program may use. Defaults suit a tool call during training.

    ``cpu_seconds`` is rounded up to whole seconds (``RLIMIT_CPU``); ``max_processes`` counts the
    processes beyond the program itself (0: none); ``max_output_chars`` is the most of its output
    (stdout and stderr together) that comes back: a program that writes more is stopped.
    """

    cpu_seconds: float = 2.0
    wall_seconds: float = 5.0
    memory_mb: int = 256
    max_processes: int = 0
    max_file_mb: int = 1
    max_open_files: int = 32
    network: bool = False
    max_output_chars: int = 4000


@dataclass
class ToolResult:
    """How a sandboxed program ended: its output, whether it succeeded, and if not why, in one line.

    ``reason`` is e.g. ``"timeout after 5.0 s (wall)"``, ``"CPU time limit 2.0 s"``,
    ``"memory limit 256 MB"``, ``"refused: os.fork: no new processes in the sandbox"``,
    ``"crashed: signal SIGSEGV"``, ``"ZeroDivisionError: division by zero"``; ``None`` when ``ok``.
    """

    text: str
    ok: bool
    reason: str | None


@lru_cache(maxsize=None)
def _isolation(network: bool) -> tuple[str, ...]:
    """The command prefix that gives the child no network, or ``()`` where none works here (probed once)."""
    if network:
        return ()
    unshare = shutil.which("unshare")
    if not unshare:
        return ()
    candidates = [(unshare, "--user", "--map-root-user", "--net")]
    if os.geteuid() == 0:
        candidates.append((unshare, "--net"))
    for prefix in candidates:
        try:
            probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=10, env={"PATH": "/usr/bin:/bin"})
        except (OSError, subprocess.SubprocessError):
            continue
        if probe.returncode == 0:
            return prefix
    return ()


def isolation() -> str:
    """How the network is kept out on this machine, in words (for the guide, the log and the tests)."""
    prefix = _isolation(False)
    if not prefix:
        return "audit hook only (no usable unshare: the network is refused inside Python)"
    return "network namespace (" + " ".join(["unshare", *prefix[1:]]) + ") and audit hook"


def _signal_reason(number: int, limits: Limits) -> str:
    if number in (signal.SIGXCPU, signal.SIGKILL):
        return f"CPU time limit {limits.cpu_seconds} s"
    if number == signal.SIGXFSZ:
        return f"file size limit {limits.max_file_mb} MB"
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = str(number)
    return f"crashed: signal {name}"


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass


def _read(proc: subprocess.Popen, limits: Limits, deadline: float) -> tuple[bytes, str | None]:
    """The child's output until it closes it, the deadline, or the output limit; a reason if it was stopped."""
    out, fd = bytearray(), proc.stdout.fileno()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(out), f"timeout after {limits.wall_seconds} s (wall)"
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return bytes(out), None
        out += chunk
        if len(out) > limits.max_output_chars and len(out.decode("utf-8", "replace")) > limits.max_output_chars:
            return bytes(out), f"output over {limits.max_output_chars} characters: stopped, the first {limits.max_output_chars} are shown"


def _reason(proc: subprocess.Popen, status: dict, limits: Limits) -> str | None:
    kind, detail = status.get("kind"), status.get("detail", "")
    if proc.returncode < 0:
        return _signal_reason(-proc.returncode, limits)
    if kind == "ok" and proc.returncode == 0:
        return None
    if kind == "memory":
        return f"memory limit {limits.memory_mb} MB"
    if kind == "file_size":
        return f"file size limit {limits.max_file_mb} MB"
    if kind == "refused":
        return f"refused: {detail}"
    if kind in ("error", "exit") and detail:
        return detail
    return f"exited with status {proc.returncode}" if proc.returncode else None


def _run(code: str, limits: Limits, *, audit_hook: bool = True) -> ToolResult:
    """:func:`run_python`, with the audit hook optional (off only in tests of the kernel's layers)."""
    workdir = tempfile.mkdtemp(prefix="mixrl-sandbox-")
    status_read, status_write = os.pipe()
    proc = None
    try:
        settings = {**asdict(limits), "audit_hook": audit_hook}
        command = [*_isolation(limits.network), sys.executable, "-I", "-S", "-X", "utf8", _LAUNCHER,
                   str(status_write), json.dumps(settings)]
        env = {"HOME": workdir, "TMPDIR": workdir, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
        deadline = time.monotonic() + limits.wall_seconds
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                cwd=workdir, env=env, start_new_session=True, close_fds=True, pass_fds=(status_write,))
        os.close(status_write)
        status_write = -1
        try:
            proc.stdin.write(code.encode("utf-8", "replace"))
            proc.stdin.close()
        except BrokenPipeError:  # the child died before it read the program; its exit status says why
            pass
        out, stopped = _read(proc, limits, deadline)
        if stopped is None:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                stopped = f"timeout after {limits.wall_seconds} s (wall)"
        _kill(proc)  # the program's group goes in every case: nothing it started outlives the call
        proc.wait()
        text = out.decode("utf-8", "replace")[: limits.max_output_chars]
        if stopped:
            return ToolResult(text=text, ok=False, reason=stopped)
        with os.fdopen(status_read, "rb") as pipe:
            status_read = -1
            raw = pipe.read(4096)
        try:
            status = json.loads(raw) if raw else {}
        except ValueError:
            status = {}
        reason = _reason(proc, status if isinstance(status, dict) else {}, limits)
        return ToolResult(text=text, ok=reason is None, reason=reason)
    except Exception as err:  # a tool failure is a tool message, never a crash of the caller
        if proc is not None:
            _kill(proc)
        return ToolResult(text="", ok=False, reason=" ".join(f"sandbox failed: {type(err).__name__}: {err}".split()))
    finally:
        for fd in (status_read, status_write):
            if fd >= 0:
                os.close(fd)
        if proc is not None and proc.stdout:
            proc.stdout.close()
        shutil.rmtree(workdir, ignore_errors=True)


def run_python(code: str, limits: Limits = Limits()) -> ToolResult:
    """Run ``code`` as a Python program in the sandbox; its output and how it ended. Never raises.

    The output is stdout and stderr together, cut to ``limits.max_output_chars`` characters; a failure
    (an exception, a limit, a refusal, a crash) gives ``ok=False`` and a one-line ``reason``.
    """
    return _run(code, limits)
