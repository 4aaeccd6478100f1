"""docs/methods.md is generated from the presets, recipes and suites, and kept current."""

from __future__ import annotations

import json
import pathlib

from mixrl.config.compose import group_options
from mixrl.experiments.methods import render_methods, split_header

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "methods.md"


def test_methods_doc_is_current(monkeypatch):
    monkeypatch.chdir(ROOT)  # in this process: the other tests here reuse the composed objectives (cached)
    expected = render_methods()
    assert DOC.is_file() and DOC.read_text() == expected, (
        "docs/methods.md is out of date; regenerate it with: python -m mixrl.experiments.methods > docs/methods.md"
    )


def test_every_method_recipe_and_claim_is_listed(tmp_path):
    text = render_methods(tmp_path)  # no results: every claim is "not measured yet"
    for algo in group_options("algo"):
        assert f"## `{algo}`" in text
    assert "`luffy/authors-arith-tiny`" in text and "`chord/phi-arith-tiny`" in text
    assert "Learning to Reason under Off-Policy Guidance" in text
    assert "LUFFY (the authors' setting) learns problems on-policy RL cannot solve (level 5)" in text
    assert "agrees" not in text and text.count("not measured yet") >= 10


def test_measured_verdicts_are_shown(tmp_path):
    (tmp_path / "hard").mkdir()
    (tmp_path / "hard" / "compare.json").write_text(json.dumps({"claims": [{
        "paper": "Learning to Reason under Off-Policy Guidance", "claim": "LUFFY beats SFT",
        "method": "luffy/arith-tiny", "baseline": "sft/arith-tiny", "verdict": "disagrees", "test": "Welch t-test",
        "diff": -0.1, "low": -0.15, "high": -0.05, "p": 0.001,
    }]}))
    text = render_methods(tmp_path)
    line = next(x for x in text.splitlines() if "| hard |" in x and "LUFFY beats SFT" in x)
    assert "**disagrees** (Welch t-test; difference -0.100 [-0.150, -0.050], p = 0.001)" in line
    toy = next(x for x in text.splitlines() if "| toy |" in x and "LUFFY beats SFT" in x)
    assert toy.endswith("not measured yet |")


def test_header_split():
    assert split_header('LUFFY ("Learning to Reason", arXiv 1): k experts replace rollouts (inject: group_replace); more') == (
        'LUFFY ("Learning to Reason", arXiv 1)', "k experts replace rollouts (inject: group_replace)")
    assert split_header("SFT baseline: supervised fine-tuning only. No rollouts.") == ("SFT baseline", "supervised fine-tuning only")


def _synthetic_ledger(differs: bool):
    from mixrl.config.ledger import FIELDS, ledger_of

    rows = [{"field": f, "authors": 1, "source": "code a.py:1", "ours": {"trainer.seed": 1}, "verdict": "same"} for f in FIELDS]
    if differs:
        rows[FIELDS_INDEX] = {"field": "learning_rate", "authors": 1.0e-6, "source": "code train.sh:41",
                              "ours": "3e-6 | a sentence", "verdict": "differs", "why": "one update per batch"}
    return ledger_of({"ledger": {"sources": {"code": "owner/repo@0123456789abcdef0123456789abcdef01234567"}, "rows": rows}})


FIELDS_INDEX = 10  # learning_rate's row in FIELDS' order


def test_fidelity_lines_from_a_synthetic_ledger():
    """docs/methods.md says per recipe "as the authors' code" or each differing field (authors, ours, why)."""
    from mixrl.config.ledger import FIELDS
    from mixrl.experiments.methods import fidelity_lines

    assert list(FIELDS)[FIELDS_INDEX] == "learning_rate"
    n = len(FIELDS)
    lines = fidelity_lines([("x/same", _synthetic_ledger(False)), ("x/diff", _synthetic_ledger(True)), ("x/none", None)])
    assert lines[0].startswith("- **against the authors' code**")
    assert lines[1] == (f"  - `x/same`: as the authors' code, all {n} fields the same "
                        "(read from code: owner/repo@0123456789abcdef0123456789abcdef01234567)")
    assert lines[2].startswith(f"  - `x/diff`: 1 of {n} fields differ from the authors' code")
    assert lines[3] == "    - learning_rate: authors 1e-06; here 3e-6 | a sentence; why: one update per batch"
    assert lines[4] == "  - no ledger yet: `x/none`"
    assert fidelity_lines([("x/none", None)]) == []  # no recipe of the method has a ledger: nothing


def test_render_methods_shows_the_recipe_ledgers(tmp_path, monkeypatch):
    import mixrl.experiments.methods as methods

    monkeypatch.setattr(methods, "recipe_ledger", lambda r: _synthetic_ledger(True) if r == "luffy/arith-tiny" else None)
    text = render_methods(tmp_path)
    assert "  - `luffy/arith-tiny`: 1 of" in text and "why: one update per batch" in text
