"""`make tolerances` (scripts/tolerances.py, tests/tolerance_record.py) finds the tolerances that hold on
one CPU kernel set only: the recorder writes each kind of numeric assertion, and the comparison flags a
margin under 10x the difference between kernel sets, by hand-built records."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import EXACT_DIRS

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("tolerances", ROOT / "scripts" / "tolerances.py")
tolerances = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tolerances)


def _write(folder: Path, *records: dict) -> None:
    folder.mkdir(parents=True)
    (folder / "main.jsonl").write_text("".join(json.dumps({"markers": [], "n": 0, **r}) + "\n" for r in records))


def _compare(tmp_path, capsys, default: list[dict], avx2: list[dict]) -> str:
    _write(tmp_path / "default", *default)
    _write(tmp_path / "avx2", *avx2)
    tolerances.compare(tmp_path, 10)
    return capsys.readouterr().out


def _approx(test: str, actual: float, atol: float, markers=()) -> dict:
    return {"test": test, "site": f"tests/x.py:{len(test)}", "kind": "approx", "actual": [actual],
            "expected": [1.0], "rtol": 0.0, "atol": atol, "form": "max", "markers": list(markers)}


def _bound(test: str, value: float, bound: float) -> dict:
    return {"test": test, "site": f"tests/y.py:{len(test)}", "kind": "compare", "op": "<", "left": value,
            "right": bound, "expr": f"v < {bound}"}


def test_margins_under_ten_times_the_spread_are_flagged(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tolerances, "hidden_comparisons", lambda tests: [])  # the repository's sources: not under test here
    out = _compare(tmp_path, capsys,
                   # approx(1.0, abs=1e-5): 1.000001 vs 1.000002 -> spread 1e-6, margin 8e-6 < 1e-5: flagged
                   [_approx("t::tight", 1.000001, 1e-5), _approx("t::wide", 1.000001, 1e-4),
                    # the OPD case: a bound of 1e-6 on 9.5e-7 (avx2) and 1.8e-6 (default), failing on default
                    _bound("t::opd", 1.8e-6, 1e-6), _bound("t::loose", 1.8e-6, 1e-3),
                    _approx("t::same", 0.5, 1e-12), _approx("t::pinned", 1.1, 0.2, markers=["exact"])],
                   [_approx("t::tight", 1.000002, 1e-5), _approx("t::wide", 1.000002, 1e-4),
                    _bound("t::opd", 9.5e-7, 1e-6), _bound("t::loose", 9.5e-7, 1e-3),
                    _approx("t::same", 0.5, 1e-12), _approx("t::pinned", 1.05, 0.2, markers=["exact"])])
    flagged = [line for line in out.splitlines() if line.startswith("FLAG")]
    assert len(flagged) == 2, out
    assert "[t::tight]" in flagged[0] and "worst margin 8e-06 < 10 x spread 1e-06" in flagged[0]  # sorted by site
    assert "[t::opd]" in flagged[1] and "worst margin -8e-07 < 10 x spread 8.5e-07" in flagged[1]
    assert "6 numeric assertions recorded in every run" in out and "1 of tests marked exact" in out
    assert "1 identical under every set, 4 that differ between sets" in out


def test_the_elements_of_a_tensor_comparison_are_judged_one_by_one():
    # torch.allclose form: |a - e| <= atol + rtol * |e|, element by element
    rec = {"kind": "close", "actual": [1.0, 2.0005], "expected": [1.0, 2.0], "rtol": 1e-3, "atol": 0.0, "form": "sum"}
    margins, values = tolerances._margins(rec)
    assert margins == pytest.approx([1e-3, 2e-3 - 5e-4])
    assert values == pytest.approx([0.0, 0.0005])  # the bounded quantity, actual - expected


def test_comparisons_inside_a_comprehension_are_listed_as_unseen(tmp_path):
    (tmp_path / "test_a.py").write_text(
        "def test_a(rows):\n"
        "    assert all(abs(r['x']) < 1e-6 for r in rows)\n"      # a float bound no hook sees
        "    assert any(r.get('n', 0.0) > 0 for r in rows)\n"     # 0.0 is a default, not a bound
        "    for r in rows:\n"
        "        assert abs(r['x']) < 1e-6\n")                    # recorded one by one
    for folder in EXACT_DIRS:  # the exact folders are make test-other-cpu's
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "test_b.py").write_text("def test_b(xs):\n    assert all(x < 0.5 for x in xs)\n")
    found = tolerances.hidden_comparisons(tmp_path)
    assert found == [(f"{tmp_path.name}/test_a.py:2", "all(abs(r['x']) < 1e-6 for r in rows)")]


RECORDED = '''
import math, os
import numpy as np
import pytest
import torch

def test_kinds():
    x = 5e-7 if os.environ["ATEN_CPU_CAPABILITY"] == "default" else 1e-7   # stands for a kernel-bound value
    assert x < 1e-6
    assert 1.0 + x == pytest.approx(1.0, abs=1e-3)
    assert math.isclose(1.0, 1.0 + x, abs_tol=1e-4)
    assert torch.allclose(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + x]), atol=1e-5)
    np.testing.assert_allclose(np.array([3.0]), np.array([3.0]), atol=1e-9)
    assert 3 == 3   # two integers: not recorded
'''


def test_the_recorder_writes_each_kind_of_assertion_and_the_test_cost(tmp_path):
    """One pytest process on a stand-in test module (its folder stands for tests/): every kind is recorded."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_kinds.py").write_text(RECORDED)
    (tests / "conftest.py").write_text(
        "from pathlib import Path\nimport tolerance_record\ntolerance_record.TESTS_DIR = Path(__file__).parent\n"
        "def pytest_configure(config):\n    tolerance_record.configure(config)\n")
    record = tmp_path / "default"
    # the inner pytest runs as one process: an xdist worker's own PYTEST_XDIST_* variables (this test under
    # `make test`) would name its record file after the worker instead of main.jsonl
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}, "ATEN_CPU_CAPABILITY": "default", "MIXRL_TOLERANCE_RECORD": str(record),
           "PYTHONPATH": str(ROOT / "tests"), "PYTHONPYCACHEPREFIX": str(tmp_path / "pycache")}
    done = subprocess.run([sys.executable, "-m", "pytest", str(tests), "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-o", "enable_assertion_pass_hook=true", "--rootdir", str(tmp_path)],
                          env=env, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in (record / "main.jsonl").read_text().splitlines()]
    kinds = [(r["kind"], r.get("fn") or r.get("op")) for r in rows]
    assert kinds == [("compare", "<"), ("approx", None), ("close", "math.isclose"), ("close", "torch.allclose"),
                     ("close", "numpy.testing.assert_allclose"), ("cost", None)], kinds
    compare, approx, isclose, allclose, np_close, cost = rows
    assert compare["left"] == 5e-7 and compare["right"] == 1e-6 and compare["site"] == "tests/test_kinds.py:9"
    assert approx["actual"] == [1.0000005] and approx["atol"] == 1e-3
    assert isclose["atol"] == 1e-4 and allclose["actual"] == [1.0, 2.0] and allclose["expected"][1] == pytest.approx(2.0)
    assert np_close["atol"] == 1e-9 and cost["cpu_s"] >= 0


def test_a_passing_comparison_is_read_from_pytests_explanation():
    from tolerance_record import _comparison

    assert _comparison("1.79e-06 < (20 * 5e-05)") == (1.79e-06, "<", 20 * 5e-05, True)   # arithmetic of numbers
    assert _comparison("tensor(1.2e-06, grad_fn=<AbsBackward0>) < 1e-05") == (1.2e-06, "<", 1e-05, True)
    assert _comparison("np.float64(0.25) >= -1.0") == (0.25, ">=", -1.0, True)
    assert _comparison("3 == 3") == (3.0, "==", 3.0, False)                               # integers: not recorded
    assert _comparison("'a' == 'a'") is None and _comparison("[1.0] == [1.0]") is None
