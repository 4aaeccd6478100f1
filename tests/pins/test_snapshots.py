"""``mixrl explain``, ``mixrl plan`` and ``mixrl config show`` print, for every shipped recipe,
exactly the text stored under ``tests/pins/snapshots/`` (written by ``make_snapshots.py``; read
its docstring for what is normalised and when to regenerate).

All 3 x (number of recipes) outputs are rendered in this process through Typer's ``CliRunner``
(the CLI's own command functions), with each recipe composed once (``memoised_composition``).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import make_snapshots  # noqa: E402


def test_every_recipe_prints_its_snapshot():
    names = make_snapshots.recipes()
    assert len(names) >= 42 and "chord/arith-tiny" in names
    rendered = make_snapshots.render_all(memoise=True)
    assert len(rendered) == 3 * len(names)
    bad = make_snapshots.differences(rendered)
    assert not bad, (f"{len(bad)} snapshot(s) differ: " + "; ".join(bad[:10])
                     + " (if the change is intended: python tests/pins/make_snapshots.py, and say why in the commit)")


def test_a_changed_output_is_caught():
    """The comparison is exact: one changed character in one output is reported, by name, and
    a stored snapshot of a recipe that no longer exists is reported too."""
    rendered = make_snapshots.render_all(["grpo/arith-tiny"], memoise=True)
    assert make_snapshots.differences(rendered, complete=False) == []
    key = ("plan", "grpo/arith-tiny")
    assert "16 prompts" in rendered[key]
    rendered[key] = rendered[key].replace("16 prompts", "17 prompts", 1)
    assert make_snapshots.differences(rendered, complete=False) == ["snapshots/plan/grpo/arith-tiny.txt: differs"]
    assert "snapshots/plan/chord/arith-tiny.txt: no such recipe any more" in make_snapshots.differences(rendered)
