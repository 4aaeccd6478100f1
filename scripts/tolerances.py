"""Find the tolerances that hold on one kind of CPU only (`make tolerances`).

PyTorch runs its own kernels in the widest SIMD set the CPU has (avx512, avx2 or plain
``default``; ``ATEN_CPU_CAPABILITY`` selects a narrower one), and a value that comes out of
training, sampling or a chain of float kernels differs in its last bits, sometimes much more,
from one set to another. A test whose tolerance is tighter than that difference passes on the
machine that wrote it and fails on another.

``run`` runs the given tests once per kernel set (all the sets this CPU has, or ``--sets``) with
the recorder of tests/tolerance_record.py on: every ``pytest.approx``, ``math.isclose``, torch
and numpy closeness call and passing plain numeric ``assert a < b`` writes its values.
``compare`` joins the runs assertion by assertion (test id, file and line, n-th call) and flags
every one whose margin (the part of the tolerance the value leaves unused: ``tol - |a - e|``, or
``bound - value`` for a one-sided bound, the smallest over the runs) is under ``FACTOR`` times the
difference measured between the kernel sets (of the bounded quantity: ``actual - expected``, or
``bound - value``). Tests marked ``exact`` are left to
`make test-other-cpu`, and an assertion whose line carries ``# not kernel-bound: <why>`` (a clock
reading, which differs between any two runs) is counted apart. It also lists the numeric comparisons that no hook sees (inside a
comprehension: ``all(x < 1e-6 for x in xs)``) and the tests that failed under some kernel set.

    python scripts/tolerances.py run tests/test_tiny_bpe.py --out .tolerances
    python scripts/tolerances.py compare --out .tolerances      # exit 1 when anything is flagged
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import math
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

#: a margin must be at least this many times the difference measured between kernel sets
FACTOR = 10
ROOT = Path(__file__).resolve().parent.parent
#: the next narrower kernel sets of each (what ATEN_CPU_CAPABILITY accepts on x86)
#: an assertion whose line says this compares a value that differs between any two runs (a clock reading:
#: tokens per second), not between kernel sets; the line says why after it
PRAGMA = "not kernel-bound"
#: tests/ folders whose tests are all marked exact (tests/conftest.py EXACT_DIRS): make test-other-cpu's
EXACT_DIRS = ("pins", "core")
NARROWER = {"avx512": ["avx2", "default"], "avx2": ["default"]}


def kernel_sets() -> list[str]:
    """This CPU's best kernel set and every narrower one it can select."""
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                         capture_output=True, text=True, check=True, env={**os.environ, "ATEN_CPU_CAPABILITY": ""})
    best = out.stdout.strip().lower()
    return [best, *NARROWER.get(best, [] if best == "default" else ["default"])]


def run(paths: list[str], out: Path, sets: list[str], marker: str, workers: str) -> int:
    rc = 0
    if out.is_dir():  # a kernel set of an earlier run that this one does not redo would be compared too
        for old in out.iterdir():
            if old.is_dir() and old.name not in (*sets, "pycache"):
                shutil.rmtree(old)
    for cap in sets:
        folder = out / cap
        if folder.exists():
            for old in folder.iterdir():
                old.unlink()
        folder.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "ATEN_CPU_CAPABILITY": cap, "MIXRL_TOLERANCE_RECORD": str(folder.resolve()),
               # the rewritten test modules differ with the pass hook on: keep them apart from the usual ones
               "PYTHONPYCACHEPREFIX": str((out / "pycache").resolve())}
        got = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                             capture_output=True, text=True, env=env).stdout.strip().lower()
        if got != cap:
            print(f"tolerances: torch ignored ATEN_CPU_CAPABILITY={cap} (runs {got})", file=sys.stderr)
            return 2
        cmd = [sys.executable, "-m", "pytest", *paths, "-m", marker, "-o", "enable_assertion_pass_hook=true",
               "-p", "no:cacheprovider", f"--junitxml={folder / 'junit.xml'}", "-q", "--no-header", "-rN"]
        if workers != "0":
            cmd += ["-n", workers, "--dist", "loadscope"]
        print(f"tolerances: ATEN_CPU_CAPABILITY={cap}: {' '.join(cmd[3:])}", flush=True)
        rc = max(rc, subprocess.run(cmd, env=env, cwd=ROOT).returncode)
    return rc


# -- compare ---------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _lines(path: str) -> list[str]:
    try:
        return (ROOT / path).read_text().splitlines()
    except OSError:
        return []


def _source_line(site: str) -> str:
    """The source line of ``tests/<file>:<line>`` ("" when gone)."""
    path, line = site.rsplit(":", 1)
    lines = _lines(path)
    return lines[int(line) - 1] if 0 < int(line) <= len(lines) else ""


def _load(folder: Path) -> tuple[dict, dict, set]:
    records, costs = {}, {}
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            if rec["kind"] == "cost":
                costs[rec["test"]] = rec
            else:
                records[(rec["test"], rec["site"], rec["n"])] = rec
    failed = set()
    junit = folder / "junit.xml"
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed.add(f"{case.get('classname')}::{case.get('name')}")
    return records, costs, failed


def _margins(rec: dict) -> tuple[list[float], list[float]]:
    """(margin per element: the unused tolerance; the bounded quantity per element, whose movement
    between kernel sets is the spread: ``actual - expected``, or ``right - left`` of a comparison. Two
    computed values that move together, as two implementations on the same kernels, do not spread)."""
    if rec["kind"] == "compare":
        left, right, op = rec["left"], rec["right"], rec["op"]
        margin = {"<": right - left, "<=": right - left, ">": left - right, ">=": left - right,
                  "==": 0.0 if left == right else -abs(left - right)}[op]
        return [margin], [right - left]
    actual, expected = rec["actual"], rec["expected"]
    rtol, atol = float(rec["rtol"]), float(rec["atol"])
    margins = []
    for a, e in zip(actual, expected):
        if rec["form"] == "max":
            tol = max(atol, rtol * abs(e))
        elif rec["form"] == "math":
            tol = max(rtol * max(abs(a), abs(e)), atol)
        else:
            tol = atol + rtol * abs(e)
        margins.append(tol - abs(a - e) if math.isfinite(a) and math.isfinite(e) else (0.0 if a == e else -math.inf))
    return margins, [a - e if math.isfinite(a) and math.isfinite(e) else 0.0 for a, e in zip(actual, expected)]


def compare(out: Path, factor: float) -> int:
    sets = sorted(p.name for p in out.iterdir() if p.is_dir() and p.name != "pycache")
    if len(sets) < 2:
        print(f"tolerances: {out} holds {len(sets)} run(s); `run` first, with two kernel sets or more")
        return 2
    loaded = {cap: _load(out / cap) for cap in sets}
    keys = set.intersection(*(set(loaded[c][0]) for c in sets))
    only = set.union(*(set(loaded[c][0]) for c in sets)) - keys
    flagged, exact, kernel_bound, same, clock, unequal = [], 0, 0, 0, 0, 0
    for key in sorted(keys):
        recs = [loaded[c][0][key] for c in sets]
        if "exact" in recs[0]["markers"]:
            exact += 1
            continue
        line = _source_line(key[1])
        if PRAGMA in line:  # a clock reading or the like: differs between any two runs
            clock += 1
            continue
        if recs[0]["kind"] != "compare" and "!=" in line:  # `x != approx(y)`: passes when some element is far
            unequal += 1
            continue
        per_set = [_margins(r) for r in recs]
        if len({len(m) for m, _ in per_set}) != 1 or len({len(v) for _, v in per_set}) != 1:
            flagged.append((key, recs, math.nan, math.nan, "shapes differ between kernel sets"))
            continue
        values = list(zip(*(v for _, v in per_set)))
        spreads = [max(v) - min(v) if all(map(math.isfinite, v)) else 0.0 for v in values]
        worst = None
        for i, margin in enumerate(zip(*(m for m, _ in per_set))):
            spread = spreads[i]
            low = min(margin)
            if spread > 0 and (worst is None or low - factor * spread < worst[0] - factor * worst[1]):
                worst = (low, spread)
        if worst is None:
            same += 1
            continue
        kernel_bound += 1
        if worst[0] < factor * worst[1]:
            flagged.append((key, recs, worst[0], worst[1], ""))
    tests_failed = {c: loaded[c][2] for c in sets}
    print(f"tolerances: kernel sets {', '.join(sets)}; {len(keys)} numeric assertions recorded in every run "
          f"({len(only)} in some runs only), {exact} of tests marked exact (left to make test-other-cpu), "
          f"{same} identical under every set, {kernel_bound} that differ between sets, "
          f"{clock} on lines marked '{PRAGMA}', {unequal} not-close assertions (!=)")
    for cap, names in tests_failed.items():
        for name in sorted(names):
            print(f"FAILED under {cap}: {name}")
    by_site = defaultdict(list)  # one line per test and assertion site: its calls/elements flagged, the worst
    for (test, site, n), recs, margin, spread, why in flagged:
        by_site[(site, test)].append((margin - factor * spread if math.isfinite(margin) else -math.inf,
                                      margin, spread, recs[0], why))
    for (site, test), items in sorted(by_site.items()):
        _, margin, spread, rec, why = min(items, key=lambda item: item[0])
        what = rec.get("expr") or rec.get("fn", rec["kind"])
        print(f"FLAG {site} [{test}] {rec['kind']}: {what}: {len(items)} call(s)/element(s), worst margin "
              f"{margin:.3g} < {factor:g} x spread {spread:.3g} {why}".rstrip())
    hidden = hidden_comparisons(ROOT / "tests")
    for site, text in hidden:
        print(f"UNSEEN {site}: a numeric comparison inside a comprehension: {text}")
    costs = {c: loaded[c][1] for c in sets}
    total = {c: sum(r["cpu_s"] for r in costs[c].values()) for c in sets}
    print("tolerances: CPU seconds of the tests: " + ", ".join(f"{c} {total[c]:.0f} s" for c in sets))
    bad = len(flagged) + len(hidden) + sum(map(len, tests_failed.values()))
    print(f"tolerances: {len(flagged)} flagged ({len(by_site)} assertion sites), {len(hidden)} unseen, "
          f"{sum(map(len, tests_failed.values()))} failed")
    return 1 if bad else 0


def _has_float(node: ast.AST) -> bool:
    """A float literal in an expression, outside any call's arguments (``r.get(k, 0.0)`` is no bound)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, float)
    if isinstance(node, ast.Call):
        return False
    return any(_has_float(child) for child in ast.iter_child_nodes(node))


def _float_bound(cmp: ast.AST) -> bool:
    """An ordering comparison with a float literal on one side (``x < 1e-6``, ``abs(d) <= 0.5 * t``)."""
    return isinstance(cmp, ast.Compare) and any(isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) for op in cmp.ops) \
        and any(_has_float(side) for side in (cmp.left, *cmp.comparators))


def hidden_comparisons(tests: Path) -> list[tuple[str, str]]:
    """Assertions that compare with a float literal inside a comprehension: no hook records them."""
    found = []
    for path in sorted(tests.rglob("*.py")):
        if path.relative_to(tests).parts[0] in EXACT_DIRS:
            continue
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Assert) and any(
                    isinstance(comp, (ast.GeneratorExp, ast.ListComp, ast.SetComp))
                    and any(_float_bound(c) for c in ast.walk(comp.elt)) for comp in ast.walk(node.test)):
                found.append((f"{path.relative_to(tests.parent).as_posix()}:{node.lineno}",
                              ast.get_source_segment(source, node.test)))
    return found


def costs(out: Path, top: int) -> None:
    """The costliest tests (CPU seconds) of the first run, with their markers."""
    cap = sorted(p.name for p in out.iterdir() if p.is_dir() and p.name != "pycache")[0]
    _, rows, _ = _load(out / cap)
    by_module = defaultdict(float)
    for test, rec in rows.items():
        by_module[(test.split("::")[0], "slow" in rec["markers"])] += rec["cpu_s"]
    for test, rec in sorted(rows.items(), key=lambda kv: -kv[1]["cpu_s"])[:top]:
        print(f"{rec['cpu_s']:8.1f} {'slow ' if 'slow' in rec['markers'] else '     '}{test}")
    print("-- by module (CPU s, slow?)")
    for (module, slow), secs in sorted(by_module.items(), key=lambda kv: -kv[1]):
        print(f"{secs:8.1f} {'slow ' if slow else '     '}{module}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run tests once per kernel set, recording numeric assertions")
    r.add_argument("paths", nargs="*", default=["tests"])
    r.add_argument("--out", type=Path, default=ROOT / ".tolerances")
    r.add_argument("--sets", default="", help="comma-separated ATEN_CPU_CAPABILITY values (default: every set this CPU has)")
    r.add_argument("-m", dest="marker", default="not exact and not rehearse and not vllm")
    r.add_argument("-n", dest="workers", default="0", help="pytest-xdist processes (0: one process)")
    c = sub.add_parser("compare", help="flag margins under FACTOR x the spread between kernel sets")
    c.add_argument("--out", type=Path, default=ROOT / ".tolerances")
    c.add_argument("--factor", type=float, default=FACTOR)
    k = sub.add_parser("costs", help="the costliest tests of a recorded run (CPU seconds)")
    k.add_argument("--out", type=Path, default=ROOT / ".tolerances")
    k.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)
    if args.cmd == "run":
        sets = [s for s in args.sets.split(",") if s] or kernel_sets()
        return run(args.paths, args.out, sets, args.marker, args.workers)
    if args.cmd == "costs":
        costs(args.out, args.top)
        return 0
    return compare(args.out, args.factor)


if __name__ == "__main__":
    sys.exit(main())
