"""The sandbox holds against hostile code, and the built-in tools are what TRL takes.

Each hostile program runs under a small limit so the file stays fast; each must come back as
``ok=False`` with a one-line reason, and the test process itself is unaffected (same cwd, same
environment, nothing written where the program aimed). The kernel's layers are also checked with the
audit hook off (``_run(..., audit_hook=False)``) where this machine has them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from mixrl.errors import ConfigError
from mixrl.tools import TOOLS, Limits, ToolResult, calculator, python, resolve_tools, run_python
from mixrl.tools.sandbox import _isolation, _run, isolation, seccomp_status

FAST = Limits(cpu_seconds=1, wall_seconds=10, memory_mb=96, max_output_chars=2000)


def contained(result: ToolResult, reason_start: str) -> None:
    assert isinstance(result, ToolResult) and result.ok is False, result
    assert result.reason.startswith(reason_start), result.reason
    assert "\n" not in result.reason and len(result.reason) < 300, result.reason


@pytest.fixture(autouse=True)
def caller_unaffected():
    """Every test: the caller's working directory and environment are the same afterwards."""
    def environment():
        return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}

    cwd, env = os.getcwd(), environment()
    yield
    assert os.getcwd() == cwd and environment() == env


def test_normal_program_runs_in_a_private_directory_with_a_scrubbed_environment(monkeypatch):
    monkeypatch.setenv("MIXRL_SANDBOX_SECRET", "s3cret")
    code = "import os, sys\nprint(6 * 7)\nprint(os.getcwd() == os.environ['HOME'] == os.environ['TMPDIR'])\n" \
           "print(sorted(os.environ))\nprint(os.getcwd())\nprint('err', file=sys.stderr)\n" \
           "open('scratch.txt', 'w').write('kept inside')\nprint(open('scratch.txt').read())"
    result = run_python(code, FAST)
    assert result.ok and result.reason is None, result
    lines = result.text.splitlines()
    assert lines[:2] == ["42", "True"]
    assert "MIXRL_SANDBOX_SECRET" not in result.text and "s3cret" not in result.text
    assert eval(lines[2]) == ["HOME", "LANG", "LC_ALL", "PATH", "TMPDIR"]
    workdir = lines[3]
    assert os.path.basename(workdir).startswith("mixrl-sandbox-") and not os.path.exists(workdir)  # removed
    assert lines[4:] == ["err", "kept inside"]


def test_infinite_loop_stops_at_the_cpu_limit():
    contained(run_python("while True:\n    pass", FAST), "CPU time limit 1 s")


def test_sleeping_program_stops_at_the_wall_limit():
    contained(run_python("import time\ntime.sleep(60)", Limits(wall_seconds=1)), "timeout after 1 s (wall)")


def test_fork_bomb_is_refused():
    contained(run_python("import os\nwhile True:\n    os.fork()", FAST), "refused: os.fork: no new processes")
    by_popen = "refused: subprocess.Popen" if seccomp_status() == "on" else "refused: import _posixsubprocess"
    contained(run_python("import subprocess\nsubprocess.run(['true'])", FAST), by_popen)
    contained(run_python("import os\nos.system('true')", FAST), "refused: os.system")


@pytest.mark.skipif(os.geteuid() == 0, reason="the kernel does not apply RLIMIT_NPROC to root (a documented gap)")
def test_process_limit_holds_without_the_audit_hook_and_the_filter():
    contained(_run("import threading\nthreading.Thread(target=print).start()", FAST, audit_hook=False, seccomp=False),
              "RuntimeError: can't start new thread")


def test_the_seccomp_filter_holds_without_the_audit_hook():
    """With the hook off, the kernel itself refuses: one fork (safe to try: if it got through, two processes)."""
    if seccomp_status() != "on":
        pytest.skip(f"no seccomp filter here: {seccomp_status()}")
    refused = "PermissionError: [Errno 1] Operation not permitted"
    for code in ["import os\nos.fork()", "import os\nos.execv('/bin/true', ['true'])", "import socket\nsocket.socket()",
                 "import os\nos.kill(1, 0)", "import os\nos.kill(os.getppid(), 0)"]:
        contained(_run(code, FAST, audit_hook=False), refused)
    contained(_run("import threading\nthreading.Thread(target=print).start()", FAST, audit_hook=False),
              "RuntimeError: can't start new thread")
    # _posixsubprocess.fork_exec raises no audit event: with the filter on, its import is allowed and the fork is not
    fork_exec = ("import _posixsubprocess, os\nr, w = os.pipe()\n_posixsubprocess.fork_exec([b'/bin/true'], "
                 "[b'/bin/true'], True, (w,), None, None, -1, -1, -1, -1, -1, -1, r, w, False, False, -1, None, None, "
                 "None, -1, None, False)")
    contained(run_python(fork_exec, FAST), refused)
    assert _run("import ctypes, os\nprint(os.getpid() > 1)", FAST, audit_hook=False).text == "True\n"


def test_processes_it_may_start_die_with_it():
    """``max_processes > 0``: a child stays in the group (``setsid`` is refused) and is killed with it."""
    if seccomp_status() != "on":
        pytest.skip(f"no seccomp filter here: {seccomp_status()}")
    limits = Limits(max_processes=2, wall_seconds=5)
    contained(run_python("import subprocess\nsubprocess.Popen(['sleep', '30'], start_new_session=True)", limits),
              "PermissionError: [Errno 1] Operation not permitted")
    result = run_python("import subprocess\nprint(subprocess.Popen(['sleep', '30']).pid)", limits)
    assert result.ok, result
    for _ in range(100):  # SIGKILL was sent; give the kernel a moment to deliver it
        try:
            with open(f"/proc/{int(result.text)}/stat") as stat:
                state = stat.read().split(") ")[1][0]
        except FileNotFoundError:
            state = "gone"  # killed and reaped
        if state in ("Z", "gone"):  # a zombie until its new parent reaps it
            break
        time.sleep(0.02)
    assert state in ("Z", "gone"), state


def test_ten_gigabyte_allocation_hits_the_memory_limit():
    contained(run_python("x = bytearray(10 * 1024 ** 3)", FAST), "memory limit 96 MB")


def test_writing_outside_its_directory_is_refused(tmp_path):
    target = tmp_path / "escaped.txt"
    contained(run_python(f"open({str(target)!r}, 'w').write('x')", FAST), "refused: open ")
    contained(run_python(f"import os\nos.mkdir({str(tmp_path / 'd')!r})", FAST), "refused: os.mkdir ")
    contained(run_python("open('../escaped.txt', 'w').write('x')", FAST), "refused: open ../escaped.txt: writing outside")
    assert list(tmp_path.iterdir()) == []


def test_paths_that_lead_outside_are_refused(tmp_path):
    """Renames, links, symbolic links, a deeper current directory and a directory descriptor (``dir_fd=``)."""
    target = str(tmp_path / "escaped")
    for code, reason in [
        (f"open('f', 'w').write('x')\nimport os\nos.rename('f', {target!r})", f"refused: os.rename {target}: writing"),
        ("import os\nos.link('/etc/passwd', 'p')", "refused: os.link /etc/passwd: writing outside"),
        ("import os\nos.symlink('/etc', 'e')\nopen('e/passwd').read()", "refused: open e/passwd: reading outside"),
        ("import os\nos.makedirs('a/b/c')\nos.chdir('a/b/c')\nopen('../../../../x', 'w')", "refused: open ../../../../x"),
        ("import os\nfd = os.open('.', os.O_RDONLY)", "refused: open .: a directory cannot be opened"),
        ("import os\nos.mkdir('b', dir_fd=0)", "refused: os.mkdir with dir_fd"),
    ]:
        contained(run_python(code, FAST), reason)
    assert list(tmp_path.iterdir()) == []
    inside = "import os, tempfile\nos.makedirs('a/b')\nos.chdir('a/b')\nopen('../y', 'w').write('1')\n" \
             "fd, name = tempfile.mkstemp()\nprint(sorted(os.listdir('..')), [d for d, _, _ in os.walk('..')])"
    assert run_python(inside, FAST).text == "['b', 'y'] ['..', '../b']\n"


def test_writing_past_the_file_size_limit_stops():
    contained(run_python("open('big', 'wb').write(b'x' * (2 * 1024 * 1024))", FAST), "file size limit 1 MB")


def test_opening_a_socket_is_refused():
    contained(run_python("import socket\nsocket.socket()", FAST), "refused: socket.__new__: no network")
    contained(run_python("import socket\nsocket.create_connection(('example.com', 80))", FAST), "refused: socket.")


@pytest.mark.skipif(not _isolation(False), reason="no network namespace on this machine (audit hook only)")
def test_no_network_even_without_the_audit_hook_and_the_filter():
    """In the namespace the caller's loopback is not there: a server listening on it is unreachable."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)"
        contained(_run(code, FAST, audit_hook=False, seccomp=False), "OSError: [Errno 101] Network is unreachable")
    code = "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)"
    contained(_run(code, FAST, audit_hook=False, seccomp=False), "OSError: [Errno 101] Network is unreachable")


def test_reading_the_users_home_is_refused(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / "secret.txt").write_text("the user's secret")
    monkeypatch.setenv("HOME", str(home))
    by_home = run_python("import os\nprint(open(os.path.expanduser('~/secret.txt')).read())", FAST)
    contained(by_home, "FileNotFoundError")  # HOME is the sandbox's own directory
    by_path = run_python(f"print(open({str(home / 'secret.txt')!r}).read())", FAST)
    contained(by_path, "refused: open ")
    listing = run_python(f"import os\nprint(os.listdir({str(home)!r}))", FAST)
    contained(listing, "refused: os.listdir ")
    assert all("secret" not in r.text.replace("secret.txt", "") for r in (by_home, by_path, listing))


def test_huge_output_is_cut_and_the_program_stopped():
    result = run_python("while True:\n    print('x' * 1000)", FAST)
    contained(result, "output over 2000 characters: stopped")
    assert len(result.text) == 2000 and set(result.text) <= {"x", "\n"}


def test_crashes_are_contained():
    contained(run_python("import faulthandler\nfaulthandler._sigsegv()", FAST), "crashed: signal SIGSEGV")
    contained(run_python("import ctypes\nctypes.string_at(0)", FAST), "refused: import ctypes")
    contained(run_python("import _xxsubinterpreters", FAST), "refused: import _xxsubinterpreters")


def test_errors_and_exits_give_one_line_and_the_traceback_as_text():
    result = run_python("def f(x):\n    return 1 / x\nf(0)", FAST)
    contained(result, "ZeroDivisionError: division by zero")
    assert 'File "<program>", line 2, in f' in result.text and "return 1 / x" in result.text
    assert "_launcher" not in result.text
    contained(run_python("import sys\nsys.exit(3)", FAST), "exited with status 3")
    contained(run_python("def broken(:", FAST), "SyntaxError")
    assert run_python("import sys\nsys.exit(0)", FAST).ok


def test_the_python_tool_returns_text_with_the_reason():
    assert python("print(sum(range(10)))") == "45\n"
    assert python("print('partial')\n1/0").endswith("ZeroDivisionError: division by zero\nError: ZeroDivisionError: division by zero")
    assert python("import os\nos.fork()").endswith("Error: refused: os.fork: no new processes in the sandbox")


INTERRUPTED = """
import os, signal, subprocess, threading
signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C raises here even when the parent ignores SIGINT (a background job)
from mixrl.tools import sandbox
started = []
class Recorded(subprocess.Popen):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        started.append(self.pid)
sandbox.subprocess.Popen = Recorded
threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
try:
    sandbox.run_python("import time\\ntime.sleep(60)", sandbox.Limits(wall_seconds=60))
except KeyboardInterrupt:
    try:
        os.kill(started[-1], 0)
        print("still running")
    except ProcessLookupError:
        print("gone")
"""


def test_an_interrupted_caller_leaves_no_sandbox_behind():
    """Ctrl-C in the caller (a ``KeyboardInterrupt`` inside ``run_python``) kills and reaps the child."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", INTERRUPTED], capture_output=True, text=True, timeout=60, env=env)
    assert out.stdout.strip() == "gone", out


def test_isolation_is_described():
    assert isolation().startswith(("network namespace (unshare", "audit hook only"))
    assert seccomp_status() == "on" or seccomp_status().startswith("off (")


# the calculator ----------------------------------------------------------------------------------------


def test_calculator_is_exact_on_big_integers_and_keeps_precedence():
    a, b = 98765432109876543210987654321, 12345678901234567890123456789
    assert calculator(f"{a} * {b} + {a}") == str(a * b + a)
    assert calculator(f"{a} - {b} * 3") == str(a - b * 3)
    assert calculator("2 + 3 * 4") == "14" and calculator("(2 + 3) * 4") == "20"
    assert calculator("-2 ** 2") == "-4" and calculator("2 ** -1") == "0.5" and calculator("2 ** 3 ** 2") == "512"
    assert calculator("7 // 2") == "3" and calculator("-7 // 2") == "-4" and calculator("7 % 3") == "1"
    assert calculator("1 / 3") == repr(1 / 3) and calculator(f"{a * 6} / 6") == str(a)  # exact when it divides
    assert calculator("0.1 + 0.2") == repr(0.1 + 0.2) and calculator(" 1_000 + 1 ") == "1001"


def test_calculator_refuses_with_a_message_and_never_raises():
    assert calculator("1 / 0") == "Error: division by zero" and calculator("5 % 0") == "Error: division by zero"
    for expression, fragment in [("__import__('os').system('true')", "function calls"), ("x + 1", "names"),
                                 ("(1).real", "attributes"), ("'a' * 3", "'a' is not a number"),
                                 ("[1][0]", "Subscript"), ("lambda: 1", "Lambda"), ("2 ^ 3", "write ** for a power"),
                                 ("9 ** 9 ** 9", "more than 100000 bits"), ("1 +", "not an arithmetic expression"),
                                 ("True + 1", "True is not a number"), ("1" * 3000, "longer than 2000")]:
        answer = calculator(expression)
        assert answer.startswith("Error: ") and fragment in answer and "\n" not in answer, (expression, answer)


# the registry and TRL ----------------------------------------------------------------------------------


def test_resolve_tools_by_name_and_refuses_unknown_names():
    assert resolve_tools(["calculator", "python", "calculator"]) == [calculator, python]
    assert resolve_tools("python") == [python] and resolve_tools(None) == [] and TOOLS["calculator"] is calculator
    with pytest.raises(ConfigError) as err:
        resolve_tools(["calculater"])
    assert str(err.value) == ("unknown tool 'calculater' (did you mean: calculator?): "
                              "the built-in tools are calculator, python")


def test_trl_takes_both_tools():
    """TRL renders callables through transformers' ``get_json_schema`` (``apply_chat_template(tools=...)`` in
    ``GRPOTrainer._tokenize_prompts``; ``trl/generation/vllm_client.py`` calls it directly) and calls a tool
    by its ``__name__`` with the model's JSON arguments as keywords (``GRPOTrainer._tool_call_loop``)."""
    from transformers.utils import get_json_schema  # deferred: transformers is heavy; only this test needs it

    for name, tool in TOOLS.items():
        schema = get_json_schema(tool)["function"]
        argument = next(iter(schema["parameters"]["properties"]))
        assert schema["name"] == name == tool.__name__
        assert schema["parameters"]["required"] == [argument]
        assert schema["parameters"]["properties"][argument]["type"] == "string"
        assert schema["description"] and schema["parameters"]["properties"][argument]["description"]
    assert TOOLS["calculator"](**{"expression": "2 ** 70"}) == str(2 ** 70)
    assert TOOLS["python"](**{"code": "print(2 ** 70)"}) == f"{2 ** 70}\n"
