"""``docs/peers.md`` cannot rot. Its table is data (``docs/peers.yaml``, read by
:mod:`mixrl.experiments.peers`) and:

* every row's overrides compose and validate (``compose_config``);
* every ``exact`` / ``exact-with`` row names tests that exist, name the row's peer and assert
  something (the ids are walked: file, function, its source);
* the committed page is what ``mixrl docs peers`` writes from the data.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mixrl.config.compose import compose_config
from mixrl.experiments.peers import CHECKED, load_peers, render_peers, rows

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "peers.yaml"
DOC = ROOT / "docs" / "peers.md"
TABLE = load_peers(DATA)
ROWS = rows(TABLE)
#: how a test names each peer (its source must mention it)
PEER_WORD = {"verl": "verl", "TRL": "TRL", "Trinity-RFT": "Trinity", "LUFFY": "LUFFY"}


def test_table_covers_every_peer_and_every_asked_option():
    peers = {r["peer"] for r in ROWS}
    assert peers == {"verl", "TRL", "Trinity-RFT", "LUFFY"}
    text = DOC.read_text()
    for option in ("seq-mean-token-sum-norm", "loss_mode=cispo", "loss_mode=clip_cov", "adv_estimator=gae",
                   "kl_loss_type=low_var_kl", "loss_type=bnpo", "importance_sampling_level", "top_entropy_quantile",
                   "vllm_importance_sampling_mode", "`sapo`", "`cispo`", "sft_phi cutoff_prob", "off_policy_max_clip",
                   "on_policy_reshape", "p_div_p_0.5"):
        assert option in text, option


def test_the_committed_page_is_generated_from_the_data():
    expected = render_peers(TABLE)
    assert DOC.read_text() == expected, "docs/peers.md is out of date; regenerate it with: mixrl docs peers"


def test_the_docs_peers_command_writes_the_page(tmp_path):
    out = tmp_path / "peers.md"
    subprocess.run([sys.executable, "-m", "mixrl.cli.main", "docs", "peers", "--data", str(DATA), "--out", str(out)],
                   check=True, capture_output=True, text=True, cwd=ROOT)
    assert out.read_text() == render_peers(TABLE)
    bad = tmp_path / "bad.yaml"
    bad.write_text(DATA.read_text().replace("status: differs", "status: close", 1))
    run = subprocess.run([sys.executable, "-m", "mixrl.cli.main", "docs", "peers", "--data", str(bad), "--out", "-"],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 2 and "status must be one of" in run.stderr and run.stdout == ""


def _test_source(test_id: str) -> tuple[str, str]:
    """(the test function's source, its module's docstring) for ``path::function[param]``."""
    path, _, name = test_id.partition("::")
    name = name.split("[", 1)[0]
    file = ROOT / path
    assert file.is_file(), f"{test_id}: no file {path}"
    source = file.read_text()
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(source, node), ast.get_docstring(tree) or ""
    raise AssertionError(f"{test_id}: {path} has no test function {name}")


CHECKED_ROWS = [r for r in ROWS if r["status"] in CHECKED]


@pytest.mark.parametrize("row", CHECKED_ROWS, ids=[f"{r['peer']}:{r['option']}" for r in CHECKED_ROWS])
def test_every_exact_row_names_tests_that_exist_and_check_its_peer(row):
    assert row.get("tests"), f"{row['peer']} {row['option']}: an {row['status']} row names its tests"
    word = PEER_WORD[row["peer"]]
    for test_id in row["tests"]:
        body, _ = _test_source(test_id)
        # an assert, or a call to the module's checking helper (_close, check)
        assert re.search(r"\bassert\b|\b_?close\(|assert_close|pytest\.raises|\bcheck\(", body), f"{test_id} asserts nothing"
        assert word.lower() in body.lower(), f"{test_id} does not name {row['peer']} (the peer whose code it checks)"


def test_the_check_catches_a_missing_test():
    with pytest.raises(AssertionError, match="no test function"):
        _test_source("tests/core/test_peer_parity.py::test_no_such_thing")
    with pytest.raises(AssertionError, match="no file"):
        _test_source("tests/core/no_such_file.py::test_x")


COMPOSED = [r for r in ROWS if r["overrides"] is not None]


@pytest.mark.parametrize("row", COMPOSED, ids=[f"{r['peer']}:{r['option']}" for r in COMPOSED])
def test_every_override_in_the_table_composes(row):
    compose_config(row["overrides"].split())  # raises ConfigError (one line) for an unknown key, name or value


def test_edge_differences_are_one_line_and_shown_on_the_page(tmp_path):
    """A row that still differs from its peer's code at an edge says so in one line (``edge``),
    shown in its note cell; the rows named in issue 49 carry one."""
    edged = {(r["peer"], r["option"]) for r in ROWS if r.get("edge")}
    assert {("verl", "`loss_mode=gspo`"), ("Trinity-RFT", "`asymre` (advantage, `baseline_shift`)"),
            ("TRL", "`PPOConfig` `cliprange_value=c`"), ("TRL", "`PPOConfig` `gamma=g lam=l`")} <= edged
    # every exact-with row is exact only under a condition: it says in one line where it still differs
    assert {(r["peer"], r["option"]) for r in ROWS if r["status"] == "exact-with"} <= edged
    page = render_peers(TABLE)
    assert page.count("**Differs at the edge:**") == len(edged)
    bad = tmp_path / "p.yaml"
    bad.write_text(DATA.read_text().replace("    edge: 'a row alone in its group", "    edge: 'two\n\n  lines; a row alone in its group", 1))
    with pytest.raises(ValueError, match="edge is one line"):
        load_peers(bad)
