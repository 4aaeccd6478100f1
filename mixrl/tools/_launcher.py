"""The sandbox's child process: set the limits, install the guard, run the program, report how it ended.

Run by :func:`mixrl.tools.sandbox.run_python` as ``python -I -S -X utf8 _launcher.py STATUS_FD LIMITS_JSON``
(isolated mode, no ``site``: only the standard library is importable, no environment variable or user
site directory is read), in its own session, with the program on stdin and a private temporary directory
as the working directory. It imports only the standard library (nothing of mixrl, no torch): it must start
fast and small under the memory limit.

In order, before any of the program runs:

1. resource limits (the kernel enforces them): ``RLIMIT_CPU`` (SIGXCPU at the limit, SIGKILL a second
   later), ``RLIMIT_AS`` (an allocation past it fails: ``MemoryError``), ``RLIMIT_NPROC`` = 1 + the
   processes allowed, ``RLIMIT_FSIZE`` (a write past it fails with EFBIG), ``RLIMIT_NOFILE``,
   ``RLIMIT_CORE`` = 0;
2. an audit hook (PEP 578, ``sys.addaudithook``) that refuses, with :class:`SandboxRefusal` (a
   ``PermissionError``): new processes (``os.fork``, ``os.exec*``, ``os.posix_spawn``, ``os.system``,
   ``subprocess.Popen``, importing ``_posixsubprocess``), signals to other processes, ``ctypes``
   (foreign calls would step around every check here), sockets unless the network is allowed, writes
   outside the working directory, reads outside it and the standard library's folders, and the
   introspection that could reach the hook's own state (``gc.get_objects``/``get_referrers``/
   ``get_referents``, ``sys._current_frames``, ``sys.settrace``/``setprofile``).

CPython's own documentation says audit hooks are not a sandbox on their own: the hook is the layer that
turns an attempt into a one-line reason; the kernel's limits, the network namespace and the wall-clock
kill by the parent are what hold when the hook is stepped around.

The last thing it does is write one JSON object to STATUS_FD: ``{"kind": "ok" | "exit" | "error" |
"memory" | "refused" | "file_size", "detail": one line}``; the parent turns it into the tool's reason.
"""

import json
import os
import resource
import sys

_PROCESS_EVENTS = frozenset({  # refused when no process beyond the program itself is allowed
    "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.startfile",
    "subprocess.Popen", "pty.spawn",
})
_SIGNAL_EVENTS = frozenset({"os.kill", "os.killpg", "signal.pthread_kill"})
_INTROSPECTION_EVENTS = frozenset({
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames", "sys.settrace",
    "sys.setprofile", "sys._current_exceptions",
})
_PATH_EVENTS = {  # event -> (index of the path argument, whether it writes)
    "os.listdir": (0, False), "os.scandir": (0, False), "os.chdir": (0, False), "os.mkdir": (0, True),
    "os.remove": (0, True), "os.rmdir": (0, True), "os.rename": (0, True), "os.symlink": (1, True),
    "os.link": (1, True), "os.chmod": (0, True), "os.chown": (0, True), "os.truncate": (0, True),
    "os.utime": (0, True), "os.setxattr": (0, True), "os.removexattr": (0, True),
    "os.listxattr": (0, False), "os.getxattr": (0, False), "shutil.rmtree": (0, True),
}
_REFUSED_IMPORTS = frozenset({"_ctypes", "ctypes"})  # and _posixsubprocess when no process is allowed
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class SandboxRefusal(PermissionError):
    """The sandbox refused an operation; the message names it and why."""


def _set_limits(limits):
    mb = 1024 * 1024
    cpu = max(1, int(-(-float(limits["cpu_seconds"]) // 1)))  # whole seconds, rounded up
    for name, soft, hard in (
        ("RLIMIT_CORE", 0, 0),
        ("RLIMIT_CPU", cpu, cpu + 1),
        ("RLIMIT_AS", int(limits["memory_mb"]) * mb, int(limits["memory_mb"]) * mb),
        ("RLIMIT_NPROC", 1 + int(limits["max_processes"]), 1 + int(limits["max_processes"])),
        ("RLIMIT_FSIZE", int(limits["max_file_mb"]) * mb, int(limits["max_file_mb"]) * mb),
        ("RLIMIT_NOFILE", int(limits["max_open_files"]), int(limits["max_open_files"])),
    ):
        resource.setrlimit(getattr(resource, name), (soft, hard))


def _install_guard(workdir, read_roots, network, max_processes):
    realpath, fsdecode, join = os.path.realpath, os.fsdecode, os.path.join
    write_roots = (workdir,)
    read_roots = tuple(read_roots) + write_roots
    busy = []  # re-entry guard: the checks below must not check themselves

    def inside(path, roots):
        if isinstance(path, int):  # an already-open descriptor: it passed this check when it was opened
            return True
        path = realpath(join(workdir, fsdecode(path)))
        return any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in roots)

    def check_path(event, path, writes):
        if path is None:
            path = "."
        if not inside(path, write_roots if writes else read_roots):
            verb = "writing" if writes else "reading"
            raise SandboxRefusal(f"{event} {fsdecode(path) if not isinstance(path, int) else path!s}: "
                                 f"{verb} outside the sandbox's directory")

    def hook(event, args):
        if busy:
            return
        busy.append(1)
        try:
            if event == "open":
                path, mode, flags = args
                writes = bool(mode and any(c in mode for c in "wax+")) or bool((flags or 0) & _WRITE_FLAGS)
                if path is not None:
                    check_path("open", path, writes)
            elif event in _PATH_EVENTS:
                index, writes = _PATH_EVENTS[event]
                check_path(event, args[index] if len(args) > index else None, writes)
            elif event in _PROCESS_EVENTS and not max_processes:
                raise SandboxRefusal(f"{event}: no new processes in the sandbox")
            elif event in _SIGNAL_EVENTS:
                raise SandboxRefusal(f"{event}: no signals from the sandbox")
            elif event.startswith("ctypes."):
                raise SandboxRefusal(f"{event}: ctypes is not available in the sandbox")
            elif event in _INTROSPECTION_EVENTS:
                raise SandboxRefusal(f"{event}: not available in the sandbox")
            elif event == "import" and (args[0] in _REFUSED_IMPORTS or (args[0] == "_posixsubprocess" and not max_processes)):
                raise SandboxRefusal(f"import {args[0]}: not available in the sandbox")
            elif event.startswith("socket.") and not network:
                raise SandboxRefusal(f"{event}: no network in the sandbox")
        finally:
            busy.pop()

    sys.addaudithook(hook)


def _report(status, kind, detail=""):
    try:
        status.write(json.dumps({"kind": kind, "detail": " ".join(str(detail).split())[:300]}))
        status.flush()
    except Exception:  # the program closed or broke the status pipe: the parent falls back to the exit status
        pass


def main():
    status = os.fdopen(int(sys.argv[1]), "w")
    limits = json.loads(sys.argv[2])
    code = sys.stdin.read()
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
    workdir = os.path.realpath(os.getcwd())
    read_roots = [os.path.realpath(p) for p in sys.path if p and os.path.exists(p)] + [os.path.realpath(os.devnull)]
    _set_limits(limits)
    if limits.get("audit_hook", True):
        _install_guard(workdir, read_roots, bool(limits["network"]), int(limits["max_processes"]))
    del read_roots, fd
    try:
        program = compile(code, "<program>", "exec")
        del code
        exec(program, {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as stop:
        sys.stdout.flush()
        if stop.code not in (None, 0):
            _report(status, "exit", f"exited with status {stop.code}")
            os._exit(stop.code if isinstance(stop.code, int) else 1)
    except BaseException as err:  # everything the program raised: a traceback for the model, one line for the log
        import traceback  # deferred: only a failing program pays for it
        try:
            traceback.print_exc()
        except BaseException:
            print(f"{type(err).__name__}: {err}", file=sys.stderr)
        sys.stderr.flush()
        refusal = err if isinstance(err, SandboxRefusal) else None
        if refusal is None and isinstance(err.__context__, SandboxRefusal):
            refusal = err.__context__
        if isinstance(err, MemoryError):
            _report(status, "memory", "MemoryError")
        elif refusal is not None:
            _report(status, "refused", refusal)
        elif isinstance(err, OSError) and err.errno == 27:  # EFBIG: a write past RLIMIT_FSIZE
            _report(status, "file_size", err)
        else:
            _report(status, "error", f"{type(err).__name__}: {err}")
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    _report(status, "ok")
    os._exit(0)


if __name__ == "__main__":
    main()
