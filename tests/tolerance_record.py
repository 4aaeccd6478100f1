"""Record every numeric assertion's observed values, for `make tolerances` (scripts/tolerances.py).

A pytest plugin, registered by ``tests/conftest.py`` only when ``MIXRL_TOLERANCE_RECORD`` names a
folder. It writes one JSON line per numeric assertion a test makes into
``$MIXRL_TOLERANCE_RECORD/<worker>.jsonl``; scripts/tolerances.py runs the tests once per CPU kernel
set (``ATEN_CPU_CAPABILITY``) and compares the lines, so that a tolerance that holds on one kind of
CPU only is found on any machine that has two kernel sets.

What is recorded, each with the test's id, its call site (``tests/<file>:<line>``) and the n-th
call at that site within the test:

- ``approx``: every scalar ``pytest.approx`` compares (a sequence, mapping or array element by
  element): actual, expected, and the tolerance approx computes;
- ``close``: ``math.isclose``, ``torch.isclose`` / ``allclose`` / ``testing.assert_close`` and
  ``numpy.isclose`` / ``allclose`` / ``testing.assert_allclose`` called from a test file: the
  elements (the first ``MAX_ELEMENTS``), the expected ones and each element's tolerance;
- ``compare``: every *passing* plain ``assert a < b`` (``<=``, ``>``, ``>=``, ``==``) whose two
  sides print as numbers or arithmetic of numbers, at least one a float (of a chained comparison,
  the last pair: what pytest explains) (pytest's ``pytest_assertion_pass`` hook: the
  finder turns on ``enable_assertion_pass_hook``); a failing one fails its test, which the
  finder reports as such;
- ``cost``: each test's CPU seconds (this process and the children it waited for), setup and
  teardown included, so that the costs of two runs on a busy machine can be compared.

Comparisons inside a comprehension (``all(x < 1e-6 for x in xs)``) reach no hook:
scripts/tolerances.py lists them from the source instead.
"""

from __future__ import annotations

import ast
import json
import math
import numbers
import os
import re
import resource
import sys
import time
from pathlib import Path

import pytest

#: elements of one tensor/array comparison kept (the first ones, flattened)
MAX_ELEMENTS = 4096
TESTS_DIR = Path(__file__).resolve().parent
_WRAPPED = re.compile(r"(?:np\.float(?:16|32|64)|tensor)\(([^(),]+)(?:,[^()]*(?:\([^()]*\))?[^()]*)?\)")
_OPS = ("<=", ">=", "==", "<", ">")


def _number(text: str) -> float | None:
    """A side of a comparison as pytest prints it, as a number: ``0.5``, ``np.float32(0.5)``,
    ``tensor(0.5, grad_fn=...)``, or arithmetic of those (``(20 * 5e-05)``); None for anything else."""
    text = _WRAPPED.sub(r"\1", text.strip())
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node, ast.Name) and node.id in ("inf", "nan"):
            return float(node.id)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            inner = value(node.operand)
            return None if inner is None else (-inner if isinstance(node.op, ast.USub) else inner)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
            a, b = value(node.left), value(node.right)
            if a is None or b is None:
                return None
            try:
                return {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}.get(type(node.op)) if not isinstance(node.op, ast.Div) else a / b
            except ZeroDivisionError:
                return None
        return None

    return value(tree)


def _comparison(line: str) -> tuple[float, str, float, bool] | None:
    """``(left, op, right, floats)`` of an explanation's first line ``<left> <op> <right>`` (one
    operator outside brackets), or None."""
    depth, found = 0, []
    i = 0
    while i < len(line):
        c = line[i]
        depth += c in "([{"
        depth -= c in ")]}"
        if depth == 0 and c in "<>=" and line[i - 1:i] == " ":
            op = next((o for o in _OPS if line.startswith(o + " ", i)), None)
            if op:
                found.append((i, op))
                i += len(op)
                continue
        i += 1
    if len(found) != 1:
        return None
    at, op = found[0]
    left_text, right_text = line[:at], line[at + len(op):]
    left, right = _number(left_text), _number(right_text)
    if left is None or right is None:
        return None
    floats = any(ch in t for t in (left_text, right_text) for ch in ".eEin")
    return left, op, right, floats


class Recorder:
    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.out = (folder / f"{worker}.jsonl").open("a")
        self.test: str | None = None
        self.markers: list[str] = []
        self.counts: dict[str, int] = {}
        self.cpu0 = 0.0

    # -- the records -------------------------------------------------------------------------
    def site(self, immediate: bool = True) -> str | None:
        """Where the assertion is: ``tests/<file>:<line>``. ``immediate``: the caller of the recorded
        function (past pytest's own frames) must be a test file; a library's own call of
        ``torch.isclose`` during a training run is no assertion. Otherwise the innermost frame in a
        test file (the pass hook: the frame that asserted)."""
        frame = sys._getframe(2)
        while frame is not None:
            name = frame.f_code.co_filename
            if name.startswith(str(TESTS_DIR)) and name != __file__:
                return f"{Path(name).resolve().relative_to(TESTS_DIR.parent).as_posix()}:{frame.f_lineno}"
            if immediate and f"{os.sep}_pytest{os.sep}" not in name:
                return None
            frame = frame.f_back
        return None

    def write(self, kind: str, site: str, **fields) -> None:
        n = self.counts[site] = self.counts.get(site, -1) + 1
        self.out.write(json.dumps({"test": self.test, "site": site, "n": n, "kind": kind,
                                   "markers": self.markers, **fields}, default=_plain) + "\n")

    # -- the tests' lifetime -----------------------------------------------------------------
    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.test, self.counts = item.nodeid, {}
        self.markers = sorted({m.name for m in item.iter_markers()} & {"exact", "slow", "rehearse", "vllm"})
        cpu0, wall0 = _cpu(), time.perf_counter()
        try:
            return (yield)
        finally:
            self.out.write(json.dumps({"test": item.nodeid, "kind": "cost", "markers": self.markers,
                                       "cpu_s": round(_cpu() - cpu0, 3),
                                       "wall_s": round(time.perf_counter() - wall0, 3)}) + "\n")
            self.out.flush()
            self.test = None

    def pytest_assertion_pass(self, item, lineno, orig, expl):
        parsed = _comparison(expl.split("\n", 1)[0].strip())
        if parsed is None or not parsed[3] or "approx" in orig:  # not two numbers, two integers, or approx's own
            return
        left, op, right, _ = parsed
        site = self.site(immediate=False)  # the frame that asserted (a helper module of tests/ or the test's own)
        if not site:
            return
        site = f"{site.rsplit(':', 1)[0]}:{lineno}"
        self.write("compare", site, op=op, left=left, right=right, expr=orig)


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _plain(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return repr(value)


def _flat(value) -> list[float] | None:
    """The first MAX_ELEMENTS numbers of a number, tensor, array or list of numbers."""
    try:
        import torch

        if isinstance(value, torch.Tensor):
            if value.is_complex() or value.dtype == torch.bool:
                return None
            return value.detach().reshape(-1)[:MAX_ELEMENTS].double().tolist()
    except ImportError:
        pass
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return [float(value)]
    try:
        import numpy as np

        arr = np.asarray(value)
        if arr.dtype.kind in "fiu":
            return arr.reshape(-1)[:MAX_ELEMENTS].astype(float).tolist()
    except Exception:
        return None
    return None


def _recording(recorder: Recorder, name: str, original, tolerances):
    """Wrap a closeness function: record its arguments when a test file calls it, then call it."""

    def wrapper(*args, **kwargs):
        site = recorder.test and recorder.site()
        if site:
            try:
                actual = next((kwargs[k] for k in ("actual", "input", "a") if k in kwargs), args[0] if args else None)
                expected = next((kwargs[k] for k in ("expected", "desired", "other", "b") if k in kwargs),
                                args[1] if len(args) > 1 else None)
                a, e = _flat(actual), _flat(expected)
                if a is not None and e is not None:
                    if len(e) == 1 and len(a) > 1:
                        e = e * len(a)
                    if len(a) == 1 and len(e) > 1:
                        a = a * len(e)
                    if len(a) == len(e):
                        rtol, atol, form = tolerances(actual, args, kwargs)
                        recorder.write("close", site, fn=name, actual=a, expected=e, rtol=rtol, atol=atol,
                                       form=form)
            except Exception as exc:  # never let the recorder change a test's outcome
                recorder.write("unrecorded", site, fn=name, why=repr(exc)[:200])
        return original(*args, **kwargs)

    wrapper.__wrapped__ = original
    return wrapper


def _torch_default(actual, key: str, fallback: float) -> float:
    """torch.testing.assert_close's default rtol/atol for the dtype of ``actual``."""
    import torch

    if fallback is not None:
        return fallback
    table = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5), torch.float32: (1.3e-6, 1e-5),
             torch.float64: (1e-7, 1e-7)}
    dtype = actual.dtype if isinstance(actual, torch.Tensor) else torch.float64
    if dtype not in table:
        return 0.0
    return table[dtype][0 if key == "rtol" else 1]


def install(recorder: Recorder, monkeypatch_targets: list) -> None:
    """Patch approx and the closeness functions (undone by nothing: the process records until it ends)."""
    from _pytest import approx as approx_mod

    original_eq = approx_mod.ApproxScalar.__eq__

    def approx_eq(self, actual):
        result = original_eq(self, actual)
        if recorder.test and not isinstance(actual, bool) and _flat(actual) is not None \
                and isinstance(self.expected, numbers.Real) and not isinstance(self.expected, bool) \
                and len(_flat(actual)) == 1:
            site = recorder.site()
            if site:
                try:
                    tol = float(self.tolerance)
                except Exception:
                    tol = float("nan")
                recorder.write("approx", site, actual=_flat(actual), expected=[float(self.expected)],
                               rtol=0.0, atol=tol, form="max")
        return result

    approx_mod.ApproxScalar.__eq__ = approx_eq
    monkeypatch_targets.append((approx_mod.ApproxScalar, "__eq__", original_eq))

    def patch(owner, attr, name, tolerances):
        original = getattr(owner, attr)
        setattr(owner, attr, _recording(recorder, name, original, tolerances))
        monkeypatch_targets.append((owner, attr, original))

    patch(math, "isclose", "math.isclose",
          lambda actual, args, kw: (kw.get("rel_tol", 1e-9), kw.get("abs_tol", 0.0), "math"))
    try:
        import torch

        def torch_tols(actual, args, kw, rtol=1e-5, atol=1e-8):
            return (kw.get("rtol", args[2] if len(args) > 2 else rtol), kw.get("atol", args[3] if len(args) > 3 else atol),
                    "sum")

        patch(torch, "isclose", "torch.isclose", torch_tols)
        patch(torch, "allclose", "torch.allclose", torch_tols)
        patch(torch.testing, "assert_close", "torch.testing.assert_close",
              lambda actual, args, kw: (_torch_default(actual, "rtol", kw.get("rtol")),
                                        _torch_default(actual, "atol", kw.get("atol")), "sum"))
        torch.set_printoptions(precision=12)  # a failing/passing compare prints tensors in full
    except ImportError:
        pass
    try:
        import numpy as np

        def np_tols(actual, args, kw, rtol=1e-5, atol=1e-8):
            return (kw.get("rtol", args[2] if len(args) > 2 else rtol), kw.get("atol", args[3] if len(args) > 3 else atol),
                    "sum")

        patch(np, "isclose", "numpy.isclose", np_tols)
        patch(np, "allclose", "numpy.allclose", np_tols)
        patch(np.testing, "assert_allclose", "numpy.testing.assert_allclose",
              lambda actual, args, kw: (kw.get("rtol", args[2] if len(args) > 2 else 1e-7),
                                        kw.get("atol", args[3] if len(args) > 3 else 0.0), "sum"))
    except ImportError:
        pass


def configure(config) -> None:
    """Called by tests/conftest.py's pytest_configure when MIXRL_TOLERANCE_RECORD is set."""
    recorder = Recorder(Path(os.environ["MIXRL_TOLERANCE_RECORD"]))
    install(recorder, [])
    config.pluginmanager.register(recorder, "mixrl-tolerance-record")
