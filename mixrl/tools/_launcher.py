"""The sandbox's child process: set the limits, install the guard, run the program, report how it ended.

Run by :func:`mixrl.tools.sandbox.run_python` as ``python -I -S -u -X utf8 _launcher.py STATUS_FD LIMITS_JSON``
(isolated mode, no ``site``: only the standard library is importable, no environment variable or user
site directory is read), in its own session, with the program on stdin and a private temporary directory
as the working directory. It imports only the standard library (nothing of mixrl, no torch): it must start
fast and small under the memory limit.

In order, before any of the program runs:

1. resource limits (the kernel enforces them): ``RLIMIT_CPU`` (SIGXCPU at the limit, SIGKILL a second
   later), ``RLIMIT_AS`` (an allocation past it fails: ``MemoryError``), ``RLIMIT_NPROC`` = 1 + the
   processes allowed, ``RLIMIT_FSIZE`` (a write past it fails with EFBIG), ``RLIMIT_NOFILE``,
   ``RLIMIT_CORE`` = 0;
2. a seccomp filter (``PR_SET_NO_NEW_PRIVS``, then ``PR_SET_SECCOMP`` with a classic-BPF program built
   here with ``ctypes``, which is then dropped from ``sys.modules``): the kernel answers EPERM to fork,
   vfork, clone, exec, ``socket`` (unless the network is allowed), signals to any process but itself,
   ptrace, mount, namespaces, module loading, leaving the process group (``setsid``, ``setpgid``: what
   ``max_processes`` allows is killed with the group) and the other calls of :data:`_ALWAYS_REFUSED`, whoever
   makes them (C code and ``ctypes`` included); ``clone3`` gets ENOSYS so glibc falls back to ``clone``;
   a call under the x32 ABI gets EPERM and one from another architecture kills the process;
3. an audit hook (PEP 578, ``sys.addaudithook``) that refuses, with :class:`SandboxRefusal` (a
   ``PermissionError``): new processes (``os.fork``, ``os.exec*``, ``os.posix_spawn``, ``os.system``,
   ``subprocess.Popen``; importing ``_posixsubprocess`` where the filter is off), signals to other processes, ``ctypes``
   (foreign calls would step around every check here), sockets unless the network is allowed, writes
   outside the working directory, reads outside it and the standard library's folders (paths resolved
   with symbolic links followed, from the current directory; a rename or a hard link checks both ends),
   directory descriptors (``os.open`` of a directory; any ``dir_fd=``: a path relative to one could not
   be checked; ``shutil.rmtree`` is switched to its path-based walk so that it still works), and the
   introspection that could reach the hook's own state (``gc.get_objects``/``get_referrers``/
   ``get_referents``, ``sys._current_frames``, ``sys.settrace``/``setprofile``), and subinterpreters
   (a new interpreter starts without this one's audit hooks).

CPython's own documentation says audit hooks are not a sandbox on their own: the hook is the layer that
turns an attempt into a one-line reason; the kernel's limits, the seccomp filter, the network namespace
and the wall-clock kill by the parent are what hold when the hook is stepped around.

The last thing it does is write one JSON object to STATUS_FD: ``{"kind": "ok" | "exit" | "error" |
"memory" | "refused" | "file_size", "detail": one line, "seccomp": "on" or why not}``; the parent turns
it into the tool's reason. The program can write to that descriptor too: it can only lie about itself.
"""

import json
import linecache
import os
import resource
import sys
import traceback  # imported before the limits: a MemoryError must still be reported

_PROCESS_EVENTS = frozenset({  # refused when no process beyond the program itself is allowed
    "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.startfile",
    "subprocess.Popen", "pty.spawn",
})
_SIGNAL_EVENTS = frozenset({"os.kill", "os.killpg", "signal.pthread_kill"})
_INTROSPECTION_EVENTS = frozenset({
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames", "sys.settrace",
    "sys.setprofile", "sys._current_exceptions",
    "cpython.PyInterpreterState_New",  # a subinterpreter starts without this interpreter's audit hooks
})
_PATH_EVENTS = {  # event -> (indices of its path arguments, whether it writes, indices of its dir_fd arguments)
    "os.listdir": ((0,), False, ()), "os.scandir": ((0,), False, ()), "os.chdir": ((0,), False, ()),
    "os.listxattr": ((0,), False, ()), "os.getxattr": ((0,), False, ()), "os.mkdir": ((0,), True, (2,)),
    "os.remove": ((0,), True, (1,)), "os.rmdir": ((0,), True, (1,)), "os.rename": ((0, 1), True, (2, 3)),
    "os.link": ((0, 1), True, (2, 3)), "os.symlink": ((1,), True, (2,)), "os.chmod": ((0,), True, (2,)),
    "os.chown": ((0,), True, (3,)), "os.truncate": ((0,), True, ()), "os.utime": ((0,), True, (3,)),
    "os.setxattr": ((0,), True, ()), "os.removexattr": ((0,), True, ()), "shutil.rmtree": ((0,), True, ()),
}
# modules refused at import; _posixsubprocess is refused too when no process is allowed and the seccomp filter is
# off (its fork_exec raises no audit event); with the filter on, the kernel refuses the fork, and ``import
# subprocess`` (which asyncio, platform and others do at import) keeps working while ``subprocess.Popen`` is
# refused by its own event
_REFUSED_IMPORTS = frozenset({"_ctypes", "ctypes", "_xxsubinterpreters"})
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


# seccomp: the system calls refused whatever code makes them (C extensions and ctypes included). Numbers from
# Linux's headers: x86_64 from asm/unistd_64.h, aarch64 from asm-generic/unistd.h (a call a table lacks is skipped).
_SYSCALLS = {
    "x86_64": (0xC000003E, {  # AUDIT_ARCH_X86_64
        "fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "execve": 59, "execveat": 322, "socket": 41, "kill": 62,
        "tkill": 200, "tgkill": 234, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "mount": 165,
        "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308, "bpf": 321,
        "perf_event_open": 298, "keyctl": 250, "add_key": 248, "request_key": 249, "userfaultfd": 323,
        "init_module": 175, "finit_module": 313, "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320,
        "reboot": 169, "swapon": 167, "swapoff": 168, "acct": 163, "open_by_handle_at": 304,
        "name_to_handle_at": 303, "syslog": 103, "mknod": 133, "mknodat": 259, "iopl": 172, "ioperm": 173,
        "sethostname": 170, "setdomainname": 171, "settimeofday": 164, "clock_settime": 227, "quotactl": 179,
        "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438, "rt_sigqueueinfo": 129,
        "rt_tgsigqueueinfo": 297, "fsopen": 430, "fsmount": 432, "move_mount": 429, "open_tree": 428,
        "setsid": 112, "setpgid": 109,
    }),
    "aarch64": (0xC00000B7, {  # AUDIT_ARCH_AARCH64
        "clone": 220, "clone3": 435, "execve": 221, "execveat": 281, "socket": 198, "kill": 129, "tkill": 130,
        "tgkill": 131, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "mount": 40, "umount2": 39,
        "pivot_root": 41, "chroot": 51, "unshare": 97, "setns": 268, "bpf": 280, "perf_event_open": 241,
        "keyctl": 219, "add_key": 217, "request_key": 218, "userfaultfd": 282, "init_module": 105,
        "finit_module": 273, "delete_module": 106, "kexec_load": 104, "kexec_file_load": 294, "reboot": 142,
        "swapon": 224, "swapoff": 225, "acct": 89, "open_by_handle_at": 265, "name_to_handle_at": 264,
        "syslog": 116, "mknodat": 33, "sethostname": 161, "setdomainname": 162, "settimeofday": 170,
        "clock_settime": 112, "quotactl": 60, "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438,
        "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240, "fsopen": 430, "fsmount": 432, "move_mount": 429,
        "open_tree": 428, "setsid": 157, "setpgid": 154,
    }),
}
_ALWAYS_REFUSED = (  # another process's memory, the kernel's and the machine's state, namespaces, signals by queue
    "ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2", "pivot_root", "chroot", "unshare",
    "setns", "bpf", "perf_event_open", "keyctl", "add_key", "request_key", "userfaultfd", "init_module",
    "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "acct",
    "open_by_handle_at", "name_to_handle_at", "syslog", "mknod", "mknodat", "iopl", "ioperm", "sethostname",
    "setdomainname", "settimeofday", "clock_settime", "quotactl", "pidfd_open", "pidfd_send_signal", "pidfd_getfd",
    "rt_sigqueueinfo", "rt_tgsigqueueinfo", "tkill", "fsopen", "fsmount", "move_mount", "open_tree",
    "setsid", "setpgid",  # a process allowed by max_processes stays in the group that is killed at the end
)
_PROCESS_SYSCALLS = ("fork", "vfork", "clone", "execve", "execveat")  # and clone3, answered ENOSYS (glibc then tries clone)


def _seccomp_program(arch, numbers, pid, max_processes, network):
    """The BPF filter (classic BPF over ``struct seccomp_data``: nr at offset 0, arch at 4, args from 16)."""
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, ...|BPF_JGE|BPF_K, BPF_RET|BPF_K
    allow, eperm, enosys, kill = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38, 0x80000000
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, kill), (ld, 0, 0, 0)]
    if arch == 0xC000003E:  # the x32 ABI's numbers (bit 30) would step around the table
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, eperm)]
    for name in ("kill", "tgkill"):  # signals to itself only (abort() and raise() use them)
        prog += [(jeq, 0, 4, numbers[name]), (ld, 0, 0, 16), (jeq, 0, 1, pid), (ret, 0, 0, allow), (ret, 0, 0, eperm)]
        prog += [(ld, 0, 0, 0)]
    refused = list(_ALWAYS_REFUSED)
    if not max_processes:
        prog += [(jeq, 0, 1, numbers["clone3"]), (ret, 0, 0, enosys)]
        refused += _PROCESS_SYSCALLS
    if not network:
        refused.append("socket")
    for name in refused:
        if name in numbers:
            prog += [(jeq, 0, 1, numbers[name]), (ret, 0, 0, eperm)]
    return prog + [(ret, 0, 0, allow)]


def _install_seccomp(max_processes, network):
    """Install the filter on this process (and anything it could start); returns ``"on"`` or why not, in words."""
    machine = os.uname().machine
    if machine not in _SYSCALLS:
        return f"off (no system call table for {machine})"
    import ctypes  # deferred: only here, before the guard; removed from sys.modules after (the program must import it itself)
    try:
        arch, numbers = _SYSCALLS[machine]
        prog = _seccomp_program(arch, numbers, os.getpid(), max_processes, network)

        class Filter(ctypes.Structure):
            _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

        class Program(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

        filters = (Filter * len(prog))(*prog)
        program = Program(len(prog), ctypes.cast(filters, ctypes.POINTER(Filter)))
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS: required to install a filter without privileges
            return f"off (PR_SET_NO_NEW_PRIVS: {os.strerror(ctypes.get_errno())})"
        if libc.prctl(22, 2, ctypes.addressof(program), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
            return f"off (PR_SET_SECCOMP: {os.strerror(ctypes.get_errno())})"
        return "on"
    finally:
        for name in [m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))]:
            del sys.modules[name]


def _install_guard(workdir, read_roots, network, max_processes, seccomp_on):
    realpath, fsdecode, isdir = os.path.realpath, os.fsdecode, os.path.isdir
    write_roots = (workdir,)
    read_roots = tuple(read_roots) + write_roots
    busy = []  # re-entry guard: the checks below must not check themselves

    def inside(path, roots):
        if isinstance(path, int):  # an open descriptor: a file that passed this check (directories never get one)
            return True
        path = realpath(fsdecode(path))  # symbolic links followed, relative to the current directory
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
                    if not isinstance(path, int) and isdir(path):  # a path relative to a directory descriptor
                        # (dir_fd=) would be checked against the current directory, not against that directory
                        raise SandboxRefusal(f"open {fsdecode(path)}: a directory cannot be opened in the sandbox")
            elif event in _PATH_EVENTS:
                indices, writes, dir_fds = _PATH_EVENTS[event]
                if any(i < len(args) and args[i] not in (None, -1, -100) for i in dir_fds):  # -1: none given; -100: AT_FDCWD
                    raise SandboxRefusal(f"{event} with dir_fd: not available in the sandbox")
                for index in indices:
                    check_path(event, args[index] if len(args) > index else None, writes)
            elif event in _PROCESS_EVENTS and not max_processes:
                raise SandboxRefusal(f"{event}: no new processes in the sandbox")
            elif event in _SIGNAL_EVENTS:
                raise SandboxRefusal(f"{event}: no signals from the sandbox")
            elif event.startswith("ctypes."):
                raise SandboxRefusal(f"{event}: ctypes is not available in the sandbox")
            elif event in _INTROSPECTION_EVENTS:
                raise SandboxRefusal(f"{event}: not available in the sandbox")
            elif event == "import" and (args[0] in _REFUSED_IMPORTS or (args[0] == "_posixsubprocess" and not max_processes
                                                                       and not seccomp_on)):
                raise SandboxRefusal(f"import {args[0]}: not available in the sandbox")
            elif event.startswith("socket.") and not network:
                raise SandboxRefusal(f"{event}: no network in the sandbox")
        finally:
            busy.pop()

    sys.addaudithook(hook)


_LAYERS = {}  # how the layers came up (``seccomp``: "on" or why not), sent with the status


def _report(status, kind, detail=""):
    try:
        status.write(json.dumps({"kind": kind, "detail": " ".join(str(detail).split())[:300], **_LAYERS}))
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
    if limits.get("seccomp", True):
        _LAYERS["seccomp"] = _install_seccomp(int(limits["max_processes"]), bool(limits["network"]))
    if limits.get("audit_hook", True):
        import shutil  # deferred: only where the guard is on (tempfile imports it anyway)
        shutil._use_fd_functions = False  # rmtree by path: the guard refuses directory descriptors (dir_fd=)
        _install_guard(workdir, read_roots, bool(limits["network"]), int(limits["max_processes"]),
                       _LAYERS.get("seccomp") == "on")
    del read_roots, fd
    try:
        program = compile(code, "<program>", "exec")
        linecache.cache["<program>"] = (len(code), None, code.splitlines(True), "<program>")  # source lines in tracebacks
        del code
        exec(program, {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as stop:
        sys.stdout.flush()
        if stop.code not in (None, 0):
            _report(status, "exit", f"exited with status {stop.code}")
            os._exit(stop.code if isinstance(stop.code, int) else 1)
    except BaseException as err:  # everything the program raised: a traceback for the model, one line for the log
        try:  # the program's frames only: the launcher's and the guard's are not the model's business
            frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename != __file__]
            lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames)] if frames else []
            sys.stderr.write("".join(lines + traceback.format_exception_only(type(err), err)))
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
