"""`mixrl explain` never prints "None" (issue 27: chord's cutoff read "0 where p > None (None:
no cutoff)"). Every recipe's explain output is pinned in tests/pins/snapshots/explain (and
tests/pins/test_snapshots.py recomputes it in-process), so those are read; the algos that no
recipe uses are explained here in-process."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mixrl.cli.main import app
from mixrl.core import Registry

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = ROOT / "tests" / "pins" / "snapshots"
NONE = re.compile(r"\bNone\b")


def _recipe_algos() -> set[str]:
    """``algo.name`` of every recipe's config-show snapshot: the top-level ``algo:`` block's own ``name``
    key (its lines indented two spaces), read without parsing each whole snapshot as YAML, which cost
    every pytest process seconds at collection."""
    names = set()
    for p in (SNAPSHOTS / "config-show").rglob("*.txt"):
        block = re.search(r"^algo:\n((?:  .*\n|\n)*)", p.read_text(), re.M)
        name = block and re.search(r"^  name: (\S+)$", block.group(1), re.M)
        assert name, f"{p}: no algo.name"
        names.add(name.group(1))
    return names


def test_no_recipe_explain_says_none():
    files = sorted((SNAPSHOTS / "explain").rglob("*.txt"))
    assert len(files) == len(list((ROOT / "recipes").rglob("*.yaml")))
    bad = [f"{p.relative_to(SNAPSHOTS)}: {m.group(0)}" for p in files for m in [NONE.search(p.read_text())] if m]
    assert not bad, bad


@pytest.mark.parametrize("algo", sorted({p.stem for p in (ROOT / "conf" / "algo").glob("*.yaml")} - _recipe_algos()))
def test_explain_of_an_algo_without_recipe_never_says_none(algo):
    result = CliRunner().invoke(app, ["explain", f"algo={algo}"])
    assert result.exit_code == 0, result.output
    assert "L = " in result.output and not NONE.search(result.output)


def test_chord_cutoff_reads_as_words():
    result = CliRunner().invoke(app, ["explain", "algo=chord", "algo.token_weight.cutoff=0.9"])
    assert "0 where p > 0.9" in result.output
    result = CliRunner().invoke(app, ["explain", "algo=chord"])
    assert "0 where p > 1 (no cutoff)" in result.output and "None" not in result.output


def test_unset_parameters_render_without_none():
    reg = Registry("widget")

    @reg.register("w")
    def w(x, *, cap: float | None = None, tail: float | None = None):
        """Widget.

        Formula: ``y = min(x, {cap|inf (no cap)})``, scaled by {tail}
        """
        return x

    assert reg.formula("w") == "y = min(x, inf (no cap)), scaled by unset"
    assert reg.formula("w", {"cap": 2.0, "tail": 0.5}) == "y = min(x, 2), scaled by 0.5"
