"""Reading the JSON-lines logs a run writes (``metrics.jsonl``, ``eval.jsonl``, ``samples.jsonl``).

A log reader must not trust its file: a kill cuts the last line, a disk error or an editor
leaves bytes that are not UTF-8, and a hand-edited or foreign file holds lines that are JSON
but not rows (a list, a string, a row without its ``step``). :func:`read_jsonl` reads the file
as bytes, decodes each line on its own and keeps the lines that are rows; every other line
is counted with its line number and reason (:class:`JsonlRows`), so the caller can skip them
and say how many it skipped, or refuse the file in one line naming the first.

This module imports nothing heavy (``mixrl samples`` and ``mixrl compare`` are quick commands).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


_JSON_TYPES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


@dataclass
class JsonlRows:
    """The rows of a JSON-lines file and its unreadable lines, ``(line number, reason)``."""

    path: Path
    rows: list[dict] = field(default_factory=list)
    bad: list[tuple[int, str]] = field(default_factory=list)

    def bad_note(self) -> str:
        """``'3 unreadable lines skipped (line 2: not UTF-8 ...)'``; empty when none."""
        if not self.bad:
            return ""
        line, why = self.bad[0]
        n = len(self.bad)
        return f"{n} unreadable line{'s' if n > 1 else ''} of {self.path} skipped (line {line}: {why}{', ...' if n > 1 else ''})"


def step_row(row: dict) -> str | None:
    """Why ``row`` is not a row of a step log (None when it is): it needs an integer ``step``."""
    step = row.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        return "no integer 'step'" if step is None else f"'step' is {json.dumps(step)[:20]}, not an integer"
    return None


def read_jsonl(path: str | Path, check: Callable[[dict], str | None] | None = None) -> JsonlRows:
    """The JSON objects of ``path``, one a line; blank lines are ignored. A line that is not
    UTF-8, not JSON, not an object, or that ``check`` rejects (it returns the reason) is kept
    out of ``rows`` and recorded in ``bad``. A missing file reads as no rows."""
    path = Path(path)
    out = JsonlRows(path)
    if not path.is_file():
        return out
    for i, raw in enumerate(path.read_bytes().split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            out.bad.append((i, f"not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})"))
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as e:
            out.bad.append((i, f"not JSON ({e.msg})"))
            continue
        if not isinstance(row, dict):
            out.bad.append((i, f"a JSON {_JSON_TYPES.get(type(row), type(row).__name__)}, not an object"))
            continue
        why = check(row) if check is not None else None
        if why is not None:
            out.bad.append((i, why))
            continue
        out.rows.append(row)
    return out
