"""Run model-written Python in a separate, limited process: :func:`run_python`.

What holds, and how (the layers are independent; the first to trigger gives the reason):

* **a separate process**: ``sys.executable -I -S -u -X utf8 _launcher.py`` started with
  :class:`subprocess.Popen` (fork-and-exec at once: nothing of the caller, torch included, runs in
  it), in its own session (``start_new_session``), so its whole process group is killed at the end;
  isolated mode and no ``site`` (only the standard library is importable), unbuffered (stdout and
  stderr keep their order);
* **a private directory**: a fresh :func:`tempfile.mkdtemp` directory is the working directory,
  ``HOME`` and ``TMPDIR``; the environment is replaced (``HOME``, ``TMPDIR``, ``PATH=/usr/bin:/bin``,
  ``LANG``, ``LC_ALL``); the directory is removed afterwards;
* **kernel limits** the child sets on itself before the program runs (:mod:`mixrl.tools._launcher`):
  ``RLIMIT_CPU``, ``RLIMIT_AS``, ``RLIMIT_NPROC``, ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``, ``RLIMIT_CORE`` = 0;
* **a seccomp filter** (``PR_SET_NO_NEW_PRIVS`` + ``SECCOMP_MODE_FILTER``, x86_64 and aarch64): the
  kernel answers EPERM to fork, clone, exec, ``socket``, signals to other processes, ptrace, mount,
  namespaces, module loading and the like, whatever code makes the call (C extensions included);
  :func:`seccomp_status` says whether it comes up here;
* **no network**: where ``unshare`` works (:func:`isolation`, probed once) the child runs in a new
  network namespace whose only interface, loopback, is down (``unshare --user --map-root-user --net``,
  which needs unprivileged user namespaces; as root, ``unshare --net`` if that fails); the filter
  refuses ``socket`` and the audit hook every ``socket.*`` event;
* **an audit hook** in the child (PEP 578) turns attempts into one-line refusals: new processes,
  signals, ``ctypes``, sockets, subinterpreters, writes outside the directory, reads outside it and the
  standard library's folders (see the launcher);
* **a wall-clock limit**: the parent reads the output with a deadline and kills the process group
  with SIGKILL when it passes, or when the output exceeds :attr:`Limits.max_output_chars`.

Known gaps (also in ``docs/guides/tools-sandbox.md``): the kernel does not apply ``RLIMIT_NPROC`` to
root, and it counts every process of the user id unless a user namespace holds the child: the seccomp
filter and the audit hook are what refuse new processes there. File reads are checked by the audit
hook only, which sees Python's ``open``/``os`` calls, not files that C code opens by itself (``pwd``
reads ``/etc/passwd``; a program that writes a compiled extension into its directory and loads it runs
C code the hook does not see: the filter, the limits, the namespace and the wall clock still hold);
``os.stat`` of any path is allowed (it tells whether a file exists, not what it holds). Without a
usable ``unshare`` and seccomp (another architecture, a kernel without them) the network is refused by
the audit hook only.
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


@lru_cache(maxsize=None)
def seccomp_status() -> str:
    """Whether the launcher's seccomp filter comes up on this machine: ``"on"`` or why not (probed once)."""
    return _execute("pass", Limits())[1].get("seccomp", "unknown (the probe program failed)")


_CRASHES = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT, signal.SIGSYS}


def _signal_reason(number: int, limits: Limits) -> str:
    if number == signal.SIGXCPU:
        return f"CPU time limit {limits.cpu_seconds} s"
    if number == signal.SIGXFSZ:
        return f"file size limit {limits.max_file_mb} MB"
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = str(number)
    if number == signal.SIGKILL:
        return "killed by signal SIGKILL (the CPU time limit's hard stop, or the system)"
    return f"crashed: signal {name}" if number in _CRASHES else f"killed by signal {name}"


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
    poller = select.poll()  # not select.select: a trainer's descriptors can be numbered past FD_SETSIZE (1024)
    poller.register(fd, select.POLLIN)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(out), f"timeout after {limits.wall_seconds} s (wall)"
        ready = poller.poll(min(left, 0.05) * 1000)
        if not ready:
            if proc.poll() is not None:  # it exited and its output is read; a process it started may hold the pipe
                return bytes(out), None
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


def _run(code: str, limits: Limits, *, audit_hook: bool = True, seccomp: bool = True) -> ToolResult:
    """:func:`run_python`, with the audit hook and the seccomp filter optional (off only in tests of the other layers)."""
    return _execute(code, limits, audit_hook, seccomp)[0]


def _execute(code: str, limits: Limits, audit_hook: bool = True, seccomp: bool = True) -> tuple[ToolResult, dict]:
    """The result, and the launcher's status object (its ``seccomp`` field says whether the filter is on)."""
    workdir, status_read, status_write, proc = None, -1, -1, None
    try:
        workdir = tempfile.mkdtemp(prefix="mixrl-sandbox-")
        status_read, status_write = os.pipe()
        settings = {**asdict(limits), "audit_hook": audit_hook, "seccomp": seccomp}
        command = [*_isolation(limits.network), sys.executable, "-I", "-S", "-u", "-X", "utf8", _LAUNCHER,
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
            return ToolResult(text=text, ok=False, reason=stopped), {}
        os.set_blocking(status_read, False)  # the child wrote before it exited; never wait on what it left open
        try:
            raw = os.read(status_read, 65536)
        except BlockingIOError:
            raw = b""
        try:
            status = json.loads(raw) if raw else {}
        except ValueError:
            status = {}
        status = status if isinstance(status, dict) else {}
        reason = _reason(proc, status, limits)
        return ToolResult(text=text, ok=reason is None, reason=reason), status
    except Exception as err:  # a tool failure is a tool message, never a crash of the caller
        return ToolResult(text="", ok=False, reason=" ".join(f"sandbox failed: {type(err).__name__}: {err}".split())), {}
    finally:
        if proc is not None and proc.returncode is None:  # an error above, or the caller interrupted (Ctrl-C)
            _kill(proc)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for fd in (status_read, status_write):
            if fd >= 0:
                os.close(fd)
        if proc is not None and proc.stdout:
            proc.stdout.close()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


def run_python(code: str, limits: Limits = Limits()) -> ToolResult:
    """Run ``code`` as a Python program in the sandbox; its output and how it ended. Never raises.

    The output is stdout and stderr together, cut to ``limits.max_output_chars`` characters; a failure
    (an exception, a limit, a refusal, a crash) gives ``ok=False`` and a one-line ``reason``.
    """
    return _run(code, limits)
