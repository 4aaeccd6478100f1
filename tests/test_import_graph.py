"""``scripts/import_graph.py`` (the import-graph measurement of the architecture step) runs on
mixrl and finds what it claims to find in a small synthetic package: a cycle through a
function-level import, an upward import, relative imports, and the function-level counts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from synthetic_package import write_package

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import import_graph  # noqa: E402


def test_a_synthetic_package(tmp_path):
    pkg = write_package(tmp_path / "toy", {
        "__init__.py": "",
        "core/__init__.py": "",
        "core/math.py": "import os\n",
        "core/leaf.py": "from . import math\nfrom .math import *\n",  # relative, twice: one edge
        "config/__init__.py": "",
        "config/a.py": "from toy.config import b\n",
        "config/b.py": "def f():\n    from toy.config.a import x\n    import json\n    import numpy\n    return x\n",
        "trainer.py": "import toy.config.a\nfrom toy.core import leaf\n",
        "cli.py": "from toy import trainer\n",
        "core/bad.py": "import toy.cli\n",  # layer 0 -> layer 5, at module level
        "extra.py": "",  # not in the layer table
    })
    r = import_graph.analyse(pkg)
    assert r["modules"] == 11
    # a->b, b->a, leaf->math, trainer->a, trainer->leaf, cli->trainer, bad->cli
    assert r["import_edges"] == 7 and r["module_level_edges"] == 6
    assert r["cycles"] == [["toy.config.a", "toy.config.b"]]  # closed by the function-level import
    assert r["module_level_cycles"] == []
    assert r["upward_imports"] == [{"from": "toy.core.bad", "to": "toy.cli", "layers": [0, 5], "module_level": True}]
    assert r["function_level_imports"] == {"mixrl-internal": 1, "stdlib": 1, "third-party": 1}
    assert r["unplaced"] == ["toy.extra"]
    text = import_graph.report(r)
    assert "2 modules: toy.config.a, toy.config.b" in text and "toy.core.bad (layer 0) -> toy.cli (layer 5)" in text


def test_a_self_import_and_a_three_module_cycle(tmp_path):
    pkg = write_package(tmp_path / "loop", {
        "__init__.py": "", "x.py": "import loop.x\nimport loop.y\n", "y.py": "from loop import z\n",
        "z.py": "from . import x\n",
    })
    assert import_graph.analyse(pkg)["cycles"] == [["loop.x", "loop.y", "loop.z"]]
    pkg = write_package(tmp_path / "selfish", {"__init__.py": "", "s.py": "import selfish.s\n"})
    assert import_graph.analyse(pkg)["cycles"] == [["selfish.s"]]


def test_the_script_runs_on_mixrl():
    """The report and --json describe the same analysis of the real package."""
    import json

    run = [sys.executable, str(REPO / "scripts" / "import_graph.py")]
    out = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    r = json.loads(subprocess.run([*run, "--json"], capture_output=True, text=True, check=True).stdout)
    assert r == import_graph.analyse(REPO / "mixrl")
    assert r["modules"] == len(list((REPO / "mixrl").rglob("*.py")))
    assert out.startswith(f"package mixrl: {r['modules']} modules, {r['import_edges']} import edges")
    assert f"import cycles (all imports): {len(r['cycles'])}" in out
    assert f"function-level imports: {r['function_level_imports_total']} " in out


def test_evaluation_and_experiments_packages_keep_their_layers():
    """``mixrl.evaluation`` (layer 1) and ``mixrl.experiments`` (layer 4) are placed in LAYERS, import
    nothing above their layer (evaluation: never config nor the trainer), and sit in no import cycle."""
    r = import_graph.analyse(REPO / "mixrl")
    ours = ("mixrl.evaluation", "mixrl.experiments")
    modules = [m for m in import_graph.module_files(REPO / "mixrl") if m.startswith(ours)]
    assert {"mixrl.evaluation.accuracy", "mixrl.evaluation.periodic", "mixrl.experiments.compare",
            "mixrl.experiments.stats"} <= set(modules)
    assert not [m for m in r["unplaced"] if m.startswith(ours)]
    assert [import_graph.layer_of(m, "mixrl") for m in ("mixrl.evaluation.cache", "mixrl.experiments.runs")] == [1, 4]
    assert not [u for u in r["upward_imports"] if u["from"].startswith(ours)]
    assert not [c for c in r["cycles"] if any(m.startswith(ours) for m in c)]


def test_mixrl_has_no_import_cycle_no_upward_import_and_every_module_placed():
    """The architecture's rule over the whole package, every import statement counted (a
    function-level import dodges Python's import-time error, not the dependency)."""
    r = import_graph.analyse(REPO / "mixrl")
    assert r["cycles"] == [], f"import cycles: {r['cycles']}"
    assert r["upward_imports"] == [], f"upward imports: {r['upward_imports']}"
    assert r["unplaced"] == [], f"modules the layer table does not place: {r['unplaced']}"


def test_mixrl_has_no_upward_import_by_the_stricter_reading():
    """Two folders of one layer never import each other (issue 47: ``models`` and ``evaluation`` did,
    through a deferred import, which the layer table hid by putting both on layer 1)."""
    r = import_graph.analyse(REPO / "mixrl")
    assert r["folder_pairs_importing_each_other"] == [], r["folder_pairs_importing_each_other"]
    assert r["upward_imports_strict"] == [], r["upward_imports_strict"]


def test_the_stricter_reading_finds_folders_that_import_each_other(tmp_path):
    """In a synthetic package: ``models`` and ``evaluation`` (both layer 1) import each other, ``models``
    through one deferred import, ``evaluation`` through two module-level ones: the deferred direction is
    the one counted; a tie of module-level imports counts both directions; folders on different layers
    (``data`` -> ``config``) are the loose reading's business, and one direction alone is no pair."""
    pkg = write_package(tmp_path / "toy", {
        "__init__.py": "", "models/__init__.py": "", "evaluation/__init__.py": "", "tasks/__init__.py": "",
        "models/m.py": "def f():\n    from toy.evaluation import e  # deferred: test\n    return e\n",
        "models/n.py": "",
        "evaluation/e.py": "from toy.models import m, n\n",
        "tasks/t.py": "from toy.models import n\n",
        "sources/__init__.py": "", "sources/s.py": "from toy.data import d\n",
        "data/__init__.py": "", "data/d.py": "from toy.sources import s\nfrom toy.config import c\n",
        "config/__init__.py": "", "config/c.py": "",
    })
    r = import_graph.analyse(pkg)
    pairs = {tuple(p["folders"]): p["against"] for p in r["folder_pairs_importing_each_other"]}
    assert pairs == {("evaluation", "models"): [["toy.models.m", "toy.evaluation.e"]],
                     ("data", "sources"): [["toy.data.d", "toy.sources.s"], ["toy.sources.s", "toy.data.d"]]}
    assert r["upward_imports"] == [{"from": "toy.data.d", "to": "toy.config.c", "layers": [1, 2], "module_level": True}]
    assert [(u["from"], u["to"]) for u in r["upward_imports_strict"]] == [
        ("toy.data.d", "toy.config.c"), ("toy.data.d", "toy.sources.s"), ("toy.sources.s", "toy.data.d"),
        ("toy.models.m", "toy.evaluation.e")]
    text = import_graph.report(r)
    assert "folder pairs importing each other (one layer): 2; upward imports, strict (counting them): 4" in text
    assert "evaluation <-> models: 2 edges evaluation -> models, 1 edges models -> evaluation" in text


def test_every_function_level_import_in_mixrl_says_why_it_is_deferred():
    """Issue 23's rule: an import stays inside a function only to defer a heavy or optional package
    (torch, transformers, datasets, trl, vllm, matplotlib...) on a path that must stay light, and
    carries ``# deferred: <why>`` on its own line; every other import is at module level."""
    assert import_graph.undeferred_imports(REPO / "mixrl") == []


@pytest.mark.parametrize("folder", ["bench", "scripts"])
def test_every_function_level_import_in_bench_and_scripts_says_why_it_is_deferred(folder):
    """The same rule for the benchmarks (``bench/``) and the scripts (``scripts/``): light imports (the
    standard library, rich, numpy, yaml, mixrl's config and error modules) at module level, heavy or
    optional ones deferred with their reason (``scripts/gpu_check.py`` starts on a bare Python: mixrl,
    rich and omegaconf load inside the checks that need them, each saying so)."""
    assert import_graph.undeferred_imports(REPO / folder) == []


def test_the_deferral_check_finds_an_unexplained_import(tmp_path):
    """The check above can fail: in a synthetic package, a function-level import with no reason on
    its line is listed (a reason on the line above or on a neighbouring import does not count),
    module-level imports (also in ``try``/``if`` blocks and class bodies) are not, and a reason on
    any line of a parenthesised import counts."""
    pkg = write_package(tmp_path / "toy", {
        "__init__.py": "import json\ntry:\n    import numpy\nexcept ImportError:\n    numpy = None\n",
        "a.py": ("class C:\n    import os\n\n\n"
                 "def f():\n    x = 1\n    import json\n    return json, x\n\n\n"
                 "def g():\n    # deferred: heavy\n    import torch\n"
                 "    import numpy  # deferred: heavy too\n    return torch, numpy\n\n\n"
                 "def h():\n    from os.path import (\n        join,  # deferred: a reason on a continued line\n"
                 "    )\n    return (lambda: __import__('sys'))(), join\n"),
        "sub/__init__.py": "",
        "sub/b.py": "async def k():\n    from toy import a\n    return a\n",
    })
    assert import_graph.undeferred_imports(pkg) == [
        "toy/a.py:7: import json",
        "toy/a.py:13: import torch",
        "toy/sub/b.py:2: from toy import a",
    ]


def test_the_trainers_rooms_keep_to_themselves():
    """The trainer's parts (``mixrl/trainer/parts``) and generation modules import neither TRL nor
    transformers nor the TRL glue that builds them (``grpo``, ``assembly``, ``build``, ``run``), and
    generation imports no part; the run's state (``mixrl/trainer/state``) imports neither those nor
    a part nor generation; the vLLM plugin package imports neither TRL nor the trainer."""
    assert import_graph.room_violations(REPO / "mixrl") == []


def test_the_room_check_finds_a_forbidden_import(tmp_path):
    pkg = write_package(tmp_path / "toy", {
        "__init__.py": "", "glue.py": "", "parts/__init__.py": "",
        "parts/a.py": "import trl.trainer\nfrom toy import glue\nimport torch\n",
        "parts/b.py": "def f():\n    from ..glue import x  # deferred: test\n    return x\n",
    })
    rooms = {"toy.parts": ("trl", "toy.glue")}
    assert import_graph.room_violations(pkg, rooms) == ["toy.parts.a imports toy.glue", "toy.parts.a imports trl.trainer",
                                                        "toy.parts.b imports toy.glue"]
