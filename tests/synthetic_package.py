"""A synthetic package on disk for the tests of the code scanners (import graph, code shape, TRL scan)."""

from __future__ import annotations

from pathlib import Path


def write_package(root: Path, files: dict[str, str]) -> Path:
    """``files`` (path relative to ``root`` -> source text) written under ``root``; returns ``root``."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root
