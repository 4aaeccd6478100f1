"""Fail when the built documentation site needs the network to read: a page that loads a script,
stylesheet, font or image from ``http(s)://`` (``<script src>``, ``<link href>`` other than a plain
link, ``<img src>``, CSS ``@import`` / ``url()``). Plain ``<a href>`` links to other sites are fine.

``python scripts/check_docs_site.py site`` (after ``mkdocs build``; ``make docs`` and ``make docs-check``
run it). Prints every offending file and asset, exit 1; else one line, exit 0.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ASSET = re.compile(r"""<(?:script|img|iframe|source|video|audio)\b[^>]*\bsrc=["']?(https?:)?//[^"'\s>]+"""
                   r"""|<link\b(?=[^>]*\brel=["']?(?:stylesheet|preload|preconnect|icon|modulepreload|manifest))[^>]*\bhref=["']?(?:https?:)?//[^"'\s>]+""",
                   re.IGNORECASE)
CSS = re.compile(r"""@import\s+(?:url\()?["']?(?:https?:)?//|url\(\s*["']?(?:https?:)?//""", re.IGNORECASE)


def network_assets(site: Path) -> list[tuple[str, str]]:
    """``[(file, the offending text)]`` for every network asset in the built site's HTML and CSS."""
    found = []
    for path in sorted(site.rglob("*")):
        if path.suffix not in (".html", ".css") or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for m in (ASSET if path.suffix == ".html" else CSS).finditer(text):
            found.append((str(path.relative_to(site)), m.group(0)[:160]))
        if path.suffix == ".html":
            for style in re.findall(r"<style\b[^>]*>(.*?)</style>", text, re.S | re.I):
                found.extend((str(path.relative_to(site)), m.group(0)) for m in CSS.finditer(style))
    return found


def main(argv: list[str]) -> int:
    site = Path(argv[1] if len(argv) > 1 else "site")
    if not (site / "index.html").is_file():
        print(f"{site}/index.html not found: build the site first (mkdocs build)", file=sys.stderr)
        return 2
    found = network_assets(site)
    for file, text in found:
        print(f"{file}: loads from the network: {text}")
    if found:
        print(f"{len(found)} network asset(s): the site must read offline (theme.font: false, no CDN scripts)")
        return 1
    pages = sum(1 for _ in site.rglob("*.html"))
    print(f"{pages} pages, no asset loaded from the network")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
