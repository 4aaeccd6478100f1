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
