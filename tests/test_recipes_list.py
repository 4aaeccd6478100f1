"""`mixrl recipes list` reads the recipe YAML only (issue 27: it took ~10 s composing every
recipe): its import path loads no torch, and its table agrees with the composed configs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from typer.testing import CliRunner

from mixrl.cli.main import app
from mixrl.config.recipe_index import list_recipe_names, recipe_summary

SNAPSHOTS = Path(__file__).parent / "pins" / "snapshots" / "config-show"

PROBE = """
import sys
from typer.testing import CliRunner
from mixrl.cli.main import app
for args in (["--help"], ["recipes", "list"]):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
assert "grpo/arith-tiny" in result.output
print(sorted(m for m in ("torch", "transformers", "trl", "hydra", "datasets") if m in sys.modules))
"""


def test_recipes_list_and_help_import_no_torch():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_recipe_table_matches_the_composed_configs():
    """Against the pinned `mixrl config show recipe=NAME` of every recipe (tests/pins/test_snapshots.py
    keeps those equal to the composition)."""
    names = list_recipe_names()
    assert len(names) > 10
    for name in names:
        composed = OmegaConf.create((SNAPSHOTS / f"{name}.txt").read_text().split("\n[exit")[0])
        expected = {
            "algo": composed.algo.name, "model": composed.model.path, "data": composed.data.source,
            "hardware": composed.recipe_info.hardware or composed.hardware.name,
            "paper": composed.recipe_info.paper or "-",
        }
        got = recipe_summary(name)
        assert {k: got[k] for k in expected} == expected, name


# --------------------------------------------------------------------------- piped: ids never break
@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return [recipe_summary(name) for name in list_recipe_names()]


def _broken(text: str, rows: list[dict]) -> list[str]:
    """The recipes whose name, algo, model and data are NOT all whole on one line of ``text``."""
    from mixrl.cli.recipes_table import ID_COLUMNS

    lines = text.splitlines()
    return [r["name"] for r in rows if not any(all(f" {r[c]} " in line for c in ID_COLUMNS) for line in lines)]


def test_piped_recipes_table_never_breaks_an_id(rows):
    """Not a terminal (a pipe, CI): the table takes the width its ids need, whatever the console's
    (mixrl.cli.main.out is 160 wide there); rich used to fold Qwen/Qwen2.5-7B-Instr|uct at 160."""
    import io

    from rich.console import Console

    from mixrl.cli.recipes_table import print_recipes

    for width in (160, 80):
        console = Console(file=io.StringIO(), width=width, force_terminal=False)
        print_recipes(console, rows)
        assert _broken(console.file.getvalue(), rows) == [], width
        assert console.width == width  # the console is left as it was


def test_mixrl_recipes_list_piped_never_breaks_an_id(rows):
    result = CliRunner().invoke(app, ["recipes", "list"])
    assert result.exit_code == 0, result.output
    assert _broken(result.output, rows) == []
