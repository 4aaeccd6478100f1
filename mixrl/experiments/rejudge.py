"""``mixrl rejudge DIR...``: judge a results folder's claims again with today's statistics.

A results folder is what ``mixrl reproduce`` or ``mixrl compare`` wrote (``compare.json``, and
``compare.md`` / ``README.md`` beside it). Its ``compare.json`` holds every claim with the
per-seed values it was judged from, so the claims can be judged again without the runs (which
are not committed): :func:`mixrl.experiments.claims.rejudge`. The command rewrites the claims
of ``compare.json`` and the ``## Claims`` section of ``compare.md`` and ``README.md``; the rest
of the pages (tables, runs, plots) stays as it was. It returns every claim whose verdict changed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from mixrl.errors import ConfigError
from mixrl.options import read_user_text, replace_text
from mixrl.experiments.claims import rejudge
from mixrl.experiments.report import render_claims_section

PAGES = ("compare.md", "README.md")
#: what a claim row of compare.json must hold to be judged again
REQUIRED = ("paper", "claim", "method", "baseline", "metric", "stat", "better", "target", "what", "verdict")
#: from "## Claims" to the next level-2 heading (or the end)
_SECTION = re.compile(r"^## Claims\n.*?(?=^## |\Z)", re.S | re.M)


@dataclass
class Change:
    folder: str
    claim: str
    old: str  # the verdict compare.json held
    new: str  # the stated test's verdict now
    holm: str  # the verdict under Holm's adjustment


def check_folder(folder: Path) -> list[dict]:
    """The claims of ``folder/compare.json``; ConfigError (one line) when there is none to read.
    Reads only."""
    path = Path(folder) / "compare.json"
    if not path.is_file():
        raise ConfigError(f"{folder} has no compare.json; give a folder written by mixrl reproduce or mixrl compare")
    try:
        data = json.loads(read_user_text(path, "the results file"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON ({e}); restore it from git or run mixrl compare again") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds a JSON {type(data).__name__}, not the object mixrl compare writes; "
                          "restore it from git or run mixrl compare again")
    claims = data.get("claims") or []
    for i, c in enumerate(claims):
        if not isinstance(c, dict) or "method_values" not in c or "baseline_values" not in c:
            raise ConfigError(f"{path}: claim {i + 1} has no per-seed values (method_values, baseline_values); "
                              "run mixrl compare on the runs instead")
        missing = [k for k in REQUIRED if k not in c]
        if missing:
            raise ConfigError(f"{path}: claim {i + 1} lacks {', '.join(missing)}; restore compare.json from git or "
                              "run mixrl compare on the runs instead")
    return claims


def rejudge_folder(folder: Path, *, write: bool = True) -> tuple[list[dict], list[Change]]:
    """Judge ``folder``'s claims again; with ``write`` rewrite compare.json and the pages' Claims
    sections. Returns the new rows and the claims whose verdict changed or does not stand
    under Holm's adjustment."""
    folder = Path(folder)
    old = check_folder(folder)
    if not old:
        return [], []
    new = rejudge(old)
    changes = [Change(folder.name, n["claim"], o["verdict"], n["verdict"], n["verdict_holm"])
               for o, n in zip(old, new) if o["verdict"] != n["verdict"] or n["verdict"] != n["verdict_holm"]]
    if write:
        path = folder / "compare.json"
        data = json.loads(path.read_text())
        data["claims"] = new
        replace_text(path, json.dumps(data, indent=2))  # whole or not at all
        section = render_claims_section(new) + "\n\n"
        for page in PAGES:
            p = folder / page
            if p.is_file():
                text = p.read_text()
                if _SECTION.search(text):
                    text = _SECTION.sub(lambda _: section, text, count=1)
                    replace_text(p, text.rstrip("\n") + "\n")
    return new, changes
