"""`mixrl recipes list` reads the recipe YAML only (issue 27: it took ~10 s composing every
recipe): its import path loads no torch, and its table agrees with the composed configs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

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
