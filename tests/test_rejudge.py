"""Holm over a suite's claims (mixrl.experiments.claims.apply_holm) and ``mixrl rejudge`` of a results folder
from the per-seed values its compare.json holds."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from mixrl.cli.main import app
from mixrl.experiments.claims import apply_holm, rejudge
from mixrl.experiments.rejudge import rejudge_folder
from mixrl.experiments.stats import AGREES, DISAGREES, UNRESOLVED, welch

CLEAR = ([0.50, 0.52, 0.51, 0.49, 0.50], [0.10, 0.12, 0.11, 0.09, 0.13])  # p ~ 1e-10
BORDER = ([0.5, 0.6, 0.55, 0.7, 0.52], [0.4, 0.45, 0.5, 0.42, 0.48])  # p = 0.0216


def _row(claim, a, b, **kw):
    return {"paper": "P", "claim": claim, "method": "m", "baseline": "b", "metric": "accuracy", "stat": "final",
            "better": "higher", "test": "Welch t-test, two-sided, alpha 0.05", "target": None, "what": "final accuracy",
            "method_values": list(a), "baseline_values": list(b), "verdict": "?", **kw}


def test_holm_over_claims_by_hand():
    rows = rejudge([_row("clear", *CLEAR), _row("border", *BORDER), _row("none", [], [0.1, 0.2])])
    p_clear, p_border = welch(*CLEAR).p, welch(*BORDER).p
    # two measured claims (the unmeasured one is not in the family): p_(1) x 2, then max(that, p_(2) x 1)
    assert rows[0]["p_holm"] == pytest.approx(2 * p_clear)
    assert rows[1]["p_holm"] == pytest.approx(max(2 * p_clear, p_border))
    assert rows[2]["p_holm"] is None and rows[2]["verdict_holm"] == "not measured"
    assert [r["verdict"] for r in rows[:2]] == [AGREES, AGREES] and [r["verdict_holm"] for r in rows[:2]] == [AGREES, AGREES]
    # with two more borderline claims the family is 4: 0.0216 x 3 = 0.065 > 0.05, the claim no longer stands
    rows = rejudge([_row("clear", *CLEAR), *[_row(f"border{i}", *BORDER) for i in range(3)]])
    assert rows[1]["p_holm"] == pytest.approx(3 * p_border) and rows[1]["verdict"] == AGREES
    assert rows[1]["verdict_holm"] == UNRESOLVED and rows[0]["verdict_holm"] == AGREES
    assert apply_holm([]) == []


def test_rejudge_censoring_from_an_old_note():
    # rollouts_to, lower is better: the method needs fewer, but the old row noted that 1/5 of its runs missed
    base = dict(stat="rollouts_to", better="lower", target=0.15, what="rollouts to accuracy ≥ 0.15")
    fast, slow = [2560.0, 3840.0, 2560.0, 3000.0, 12800.0], [12800.0, 11520.0, 12800.0, 12800.0, 12000.0]
    note = "Welch t-test, two-sided, alpha 0.05; censored: m did not reach the target in 1/5 runs"
    row = rejudge([_row("faster", fast, slow, **base, test=note, verdict=UNRESOLVED)])[0]
    assert welch(fast, slow).p < 0.05 and row["verdict"] == UNRESOLVED and "1/5" in row["test"]
    # significant and uncensored before: the faster side reached the target every time
    row = rejudge([_row("faster", fast[:4] + [3200.0], slow, **base, verdict=AGREES)])[0]
    assert row["verdict"] == AGREES and row["method_missed"] == 0
    # no way to know: unresolved, said so
    row = rejudge([_row("faster", fast[:4] + [3200.0], slow, **base, verdict=UNRESOLVED)])[0]
    assert row["verdict"] == UNRESOLVED and "unknown whether m reached" in row["test"]


def _folder(tmp_path):
    d = tmp_path / "hard"
    d.mkdir()
    claims = [_row("clear", *CLEAR, verdict=AGREES), *[_row(f"border{i}", *BORDER, verdict=AGREES) for i in range(3)]]
    (d / "compare.json").write_text(json.dumps({"metric": "accuracy", "methods": [], "claims": claims}))
    for page in ("compare.md", "README.md"):
        (d / page).write_text("# title\n\n## Measurements\n\ntable\n\n## Claims\n\nold text\n\n| old table |\n\n## Runs\n\nruns\n")
    return d


def test_rejudge_folder_rewrites_claims_only(tmp_path):
    d = _folder(tmp_path)
    rows, changes = rejudge_folder(d)
    assert [(c.claim, c.old, c.new, c.holm) for c in changes] == [(f"border{i}", AGREES, AGREES, UNRESOLVED) for i in range(3)]
    data = json.loads((d / "compare.json").read_text())
    assert data["metric"] == "accuracy" and [c["verdict_holm"] for c in data["claims"]] == [AGREES] + [UNRESOLVED] * 3
    for page in ("compare.md", "README.md"):
        text = (d / page).read_text()
        assert "old table" not in text and "old text" not in text
        assert text.startswith("# title\n\n## Measurements\n\ntable\n\n## Claims\n") and text.endswith("\n\n## Runs\n\nruns\n")
        assert "| verdict | verdict (Holm) |" in text and "### Interval estimates" in text
    # a second pass changes nothing in the files
    before = (d / "README.md").read_text()
    rejudge_folder(d)
    assert (d / "README.md").read_text() == before


def test_rejudge_cli(tmp_path):
    d = _folder(tmp_path)
    r = CliRunner().invoke(app, ["rejudge", str(d), "--dry-run"])
    assert r.exit_code == 0 and "4 claims, 3 changed" in r.output
    assert "old table" in (d / "README.md").read_text()  # dry run: nothing written
    empty = tmp_path / "empty"
    empty.mkdir()
    r = CliRunner().invoke(app, ["rejudge", str(d), str(empty)])
    assert r.exit_code == 2 and "has no compare.json" in r.output
    assert "old table" in (d / "README.md").read_text()  # every folder is checked before any is written
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "compare.json").write_text(json.dumps({"claims": [{"method_values": [1.0], "baseline_values": [0.0]}]}))
    r = CliRunner().invoke(app, ["rejudge", str(broken)])
    assert r.exit_code == 2 and "claim 1 lacks paper" in r.output and len(r.output.strip().splitlines()) == 1
