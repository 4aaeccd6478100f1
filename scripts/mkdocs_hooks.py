"""MkDocs hooks of the documentation site (``mkdocs.yml``: ``hooks: [scripts/mkdocs_hooks.py]``).

* **Pages found on disk join the nav**, so that a page dropped into a folder appears without editing
  ``mkdocs.yml``: every ``docs/guides/*.md`` goes under "How-to guides" (titled by its first ``# ``
  heading), every generated recipe page ``docs/reference/recipes/**.md`` under "Reference > Recipes",
  and every suite folder ``docs/results/<suite>/`` (its ``README.md`` and the other pages in it)
  under "Results".
* **Links out of the docs** (a relative link that leaves ``docs/``, e.g. ``../mixrl/core/losses.py`` or
  ``../../conf/suites/hard.yaml``) point at files of the repository that the site does not carry:
  they become the path in code type (``mixrl/core/losses.py``) instead of a dead link. Links inside
  ``docs/`` are left alone, so that ``mkdocs build --strict`` still fails on a broken one.
"""

from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path

LINK = re.compile(r"(?<!\!)\[([^\]]+)\]\((?!https?://|mailto:|#)([^)\s]+)\)")


def _title(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip().strip("`")
    return path.stem.replace("-", " ").replace("_", " ").capitalize()


def _section(nav: list, title: str) -> list | None:
    for entry in nav:
        if isinstance(entry, dict) and title in entry and isinstance(entry[title], list):
            return entry[title]
    return None


def _listed(nav) -> set[str]:
    out: set[str] = set()
    for entry in nav if isinstance(nav, list) else [nav]:
        if isinstance(entry, str):
            out.add(entry)
        elif isinstance(entry, dict):
            for v in entry.values():
                out |= _listed(v) if isinstance(v, list) else ({v} if isinstance(v, str) else set())
    return out


def guide_entries(docs: Path) -> list[dict[str, str]]:
    """``[{title: guides/NAME.md}]`` for every page of ``docs/guides/`` (README.md excepted), by title."""
    pages = [p for p in sorted((docs / "guides").glob("*.md")) if p.name != "README.md"]
    return sorted(({_title(p): p.relative_to(docs).as_posix()} for p in pages), key=lambda e: next(iter(e)).lower())


def recipe_entries(docs: Path) -> list:
    """The recipe pages as nav entries, one sub-section per method folder."""
    root = docs / "reference" / "recipes"
    if not root.is_dir():
        return []
    out: list = [{"All recipes": "reference/recipes/index.md"}]
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        pages = [{p.relative_to(folder).with_suffix("").as_posix(): p.relative_to(docs).as_posix()}
                 for p in sorted(folder.rglob("*.md"))]
        out.append({folder.name: pages})
    return out


def results_entries(docs: Path) -> list:
    """Every suite folder under ``docs/results/`` (one holding a README.md) as a nav section."""
    root = docs / "results"
    out: list = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and (p / "README.md").is_file()):
        pages = [{_title(folder / "README.md"): (folder / "README.md").relative_to(docs).as_posix()}]
        pages += [{p.stem if p.stem != "compare" else "compare (table)": p.relative_to(docs).as_posix()}
                  for p in sorted(folder.glob("*.md")) if p.name != "README.md"]
        out.append({f"Suite: {folder.name}": pages})
    return out


def on_config(config, **kwargs):
    docs = Path(config["docs_dir"])
    nav = config["nav"]
    listed = _listed(nav)
    howto = _section(nav, "How-to guides")
    if howto is not None:
        howto.extend(e for e in guide_entries(docs) if next(iter(e.values())) not in listed)
    reference = _section(nav, "Reference")
    if reference is not None:
        for i, entry in enumerate(reference):
            if isinstance(entry, dict) and any(v == "reference/recipes/index.md" for v in entry.values()):
                reference[i] = {"Recipes (generated)": recipe_entries(docs)}
    results = _section(nav, "Results")
    if results is not None:
        results.extend(results_entries(docs))
    return config


def _outside(src_uri: str, target: str, docs: Path) -> str | None:
    """The repository path a relative link leaves ``docs/`` for, else None."""
    path = target.split("#", 1)[0]
    if not path:
        return None
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(src_uri), path))
    if not joined.startswith("../"):
        return None
    repo = Path(os.path.normpath(docs / joined)).resolve()
    try:
        return repo.relative_to(docs.resolve().parent).as_posix()
    except ValueError:
        return None


def on_page_markdown(markdown, page, config, files, **kwargs):
    docs = Path(config["docs_dir"])

    def swap(m: re.Match) -> str:
        where = _outside(page.file.src_uri, m.group(2), docs)
        if where is None:
            return m.group(0)
        text = m.group(1)
        return text if text.strip("`") == where else f"{text} (`{where}`)"

    return LINK.sub(swap, markdown)
