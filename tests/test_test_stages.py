"""The Makefile's test stages select what they claim: `make test-other-cpu` collects only the folders
whose tests conftest marks ``exact`` (EXACT_PATHS), so an ``exact`` mark anywhere else would be missed."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import EXACT_DIRS, NOT_KERNEL_BOUND

TESTS = Path(__file__).resolve().parent
MAKEFILE = TESTS.parent / "Makefile"


def test_other_cpu_collects_exactly_the_exact_folders():
    (line,) = [ln for ln in MAKEFILE.read_text().splitlines() if ln.startswith("EXACT_PATHS")]
    assert line.split(":=")[1].split() == [f"tests/{d}" for d in EXACT_DIRS]
    assert "$(EXACT_PATHS)" in MAKEFILE.read_text().split("test-other-cpu: install")[1].split("\n\n")[0]


def test_no_exact_mark_outside_the_exact_folders():
    mark = re.compile(r"mark\.exact\b")
    outside = [p.relative_to(TESTS).as_posix() for p in TESTS.rglob("*.py")
               if p.relative_to(TESTS).parts[0] not in EXACT_DIRS and p.name not in ("conftest.py", Path(__file__).name) and mark.search(p.read_text())]
    assert outside == [], f"marked exact but not collected by make test-other-cpu: {outside}"
    assert all((TESTS / m).is_file() for m in NOT_KERNEL_BOUND), NOT_KERNEL_BOUND
