"""docs/peers.md from docs/peers.yaml: every peer option (verl, TRL, Trinity-RFT, LUFFY), its
mixrl overrides, how far they agree, and the tests that check it (``mixrl docs peers``).

The data file, not the page, is what is edited and tested: ``tests/test_peers_table.py``
composes every row's overrides, fails when a row is ``exact`` or ``exact-with`` without a test
that exists and names its peer, and fails when the committed page is not what
:func:`render_peers` writes from the data.

A row: ``peer``, ``option`` (markdown), ``overrides`` (space-separated overrides, or null where
mixrl has no counterpart), ``status`` (one of :data:`STATUSES`), ``note`` (markdown) and, for
the ``exact`` / ``exact-with`` rows, ``tests`` (pytest ids, ``path::function``), and ``edge``: one line saying where mixrl still differs
from the peer's code as written at an edge (a row with no trainable token, a group of one row, a
clamp), shown in the note cell as "Differs at the edge: ...". A row whose agreement holds
everywhere has none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from mixrl.options import read_user_text

#: status -> what it means (the page's legend)
STATUSES: dict[str, str] = {
    "exact": "the same per-token loss and gradient (or the same advantage, the same update) on the same "
             "tensors, checked by the tests named against a transcription of the peer's code",
    "exact-with": "exact under the conditions the note states (e.g. one micro-batch per step, a value left at "
                  "its default), checked by the tests named",
    "differs": "mixrl's closest counterpart; the note says how it differs",
    "unchecked": "mixrl's counterpart as the note describes it, read from the peer's code but not checked "
                 "against it by a test",
    "none": "no counterpart in mixrl",
}
#: statuses that must name tests
CHECKED = ("exact", "exact-with")
PEERS = ("verl", "TRL", "Trinity-RFT", "LUFFY")
ROW_KEYS = {"peer", "option", "overrides", "status", "note", "tests", "edge"}


def load_peers(path: str | Path) -> dict[str, Any]:
    """The data file, checked: every row has its keys, a known peer and status, tests where
    its status claims a check, and overrides exactly when it has a counterpart (ValueError,
    one line, otherwise)."""
    try:
        data = yaml.safe_load(read_user_text(path, "the peers table"))
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("sections"), list):
        raise ValueError(f"{path}: expected a mapping with a list 'sections' (each with a title and rows), "
                         f"got {type(data).__name__ if data is not None else 'an empty file'}")
    for section in data["sections"]:
        for row in section["rows"]:
            where = f"{path}: {section['title']!r}, {row.get('peer')} {row.get('option')}"
            if set(row) - ROW_KEYS or {"peer", "option", "overrides", "status"} - set(row):
                raise ValueError(f"{where}: a row has the keys {sorted(ROW_KEYS)} (tests optional), got {sorted(row)}")
            if row["peer"] not in PEERS:
                raise ValueError(f"{where}: peer must be one of {', '.join(PEERS)}")
            if row["status"] not in STATUSES:
                raise ValueError(f"{where}: status must be one of {', '.join(STATUSES)}, got {row['status']!r}")
            if row["status"] in CHECKED and not row.get("tests"):
                raise ValueError(f"{where}: an {row['status']} row names the tests that check it (tests: [path::function])")
            if (row["overrides"] is None) != (row["status"] == "none"):
                raise ValueError(f"{where}: overrides is null exactly when the status is 'none'")
            edge = row.get("edge")
            if edge is not None and (not isinstance(edge, str) or not edge.strip() or "\n" in edge.strip()):
                raise ValueError(f"{where}: edge is one line saying where mixrl differs from the peer's code at an edge")
    return data


def rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Every row of every section, in order."""
    return [row for section in data["sections"] for row in section["rows"]]


def _cell(text: str | None) -> str:
    return (text or "").replace("\n", " ").replace("|", "\\|").strip()


def _test_names(ids: list[str]) -> str:
    return ", ".join(f"`{i.split('::', 1)[-1]}`" for i in ids)


def render_peers(data: dict[str, Any]) -> str:
    """The page: title, introduction, the status legend, then one table per section."""
    lines = [f"# {data['title']}", "", data["intro"].strip(), ""]
    lines += ["Status:", ""]
    lines += [f"- **{name}**: {meaning}." for name, meaning in STATUSES.items()]
    lines += ["", "The last column names the test functions that check a row; `docs/peers.yaml`, from which "
              "`mixrl docs peers` writes this page, holds their full ids (`path::function`).", ""]
    for section in data["sections"]:
        lines += [f"## {section['title']}", ""]
        if section.get("intro"):
            lines += [section["intro"].strip(), ""]
        lines += ["| peer | option = value | overrides | status | note | checked by |", "|---|---|---|---|---|---|"]
        for row in section["rows"]:
            overrides = f"`{row['overrides']}`" if row["overrides"] is not None else "—"
            note = _cell(row.get("note")) + (f" **Differs at the edge:** {_cell(row['edge'])}" if row.get("edge") else "")
            lines.append(f"| {row['peer']} | {_cell(row['option'])} | {overrides} | {row['status']} | "
                         f"{note.strip()} | {_test_names(row.get('tests') or [])} |")
        lines.append("")
    return "\n".join(lines)
