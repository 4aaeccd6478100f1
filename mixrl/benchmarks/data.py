"""A benchmark's problems: read from its source with the loader training data uses
(:func:`mixrl.data.reading._load_raw`: a hub id through ``datasets.load_dataset(id, subset,
split=...)``, a local ``.jsonl`` / ``.parquet`` file or folder through the same library), then
mapped through the benchmark's ``columns`` / ``choices`` onto :class:`Problem` rows.

The fixtures in ``tests/fixtures/benchmarks/NAME.jsonl`` hold a few rows in each hub dataset's
schema (same column names, types and nesting); ``benchmarks.source_dir=tests/fixtures/benchmarks``
(or ``benchmarks.NAME.source=PATH``) reads them through this same code.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass, field
from typing import Any

from mixrl.benchmarks.spec import Benchmark
from mixrl.data import reading
from mixrl.errors import DataError


@dataclass
class Problem:
    index: int
    id: str
    problem: str  # the user message (template applied, options listed)
    answer: str  # the gold answer (a letter for multiple choice)
    labels: list[str] = field(default_factory=list)  # option labels (multiple choice)
    row: dict = field(default_factory=dict)  # the built-in task's row (its reward's keyword arguments)


def column(row: dict, path: str, where: str) -> Any:
    """``row``'s value at a dotted ``path`` (``choices.text``, ``final_answer.0``)."""
    node: Any = row
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, (list, tuple)) and part.lstrip("-").isdigit() and -len(node) <= int(part) < len(node):
            node = node[int(part)]
        else:
            have = ", ".join(sorted(row)) if isinstance(row, dict) else type(row).__name__
            raise DataError(f"{where}: column '{path}' not found in the rows (columns: {have}); fix {where}.columns")
    return node


def render_choices(options: list[str], labels: list[str]) -> str:
    """``A) first\\nB) second`` (the layout of LUFFY's ARC-c / GPQA prompts)."""
    return "\n".join(f"{lab}) {str(opt).strip()}" for lab, opt in zip(labels, options))


def problems(bench: Benchmark, rows: list[dict]) -> list[Problem]:
    """The benchmark's problems from raw rows in its source's schema. A row without a gold answer
    (null or blank in the answer column) is refused, naming the rows: it would be scored against
    the text ``None``."""
    where = f"benchmarks.{bench.name}"
    golds = [column(row, bench.columns["answer"], where) for row in rows]
    missing = [i for i, g in enumerate(golds) if g is None or (isinstance(g, str) and not g.strip())]
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
        rows_have = f"rows {shown} have" if len(missing) > 1 else f"row {shown} has"
        raise DataError(f"{where}: {rows_have} no gold answer in {bench.source}"
                        f" (column '{bench.columns['answer']}' is null or empty); fix those rows, "
                        f"or {where}.columns.answer if another column holds the answer")
    out = []
    for i, row in enumerate(rows):
        text = str(column(row, bench.columns["problem"], where))
        gold = golds[i]
        ident = str(column(row, bench.columns["id"], where)) if "id" in bench.columns else str(i)
        labels: list[str] = []
        user = bench.template.replace("{problem}", text)
        if bench.choices is not None:
            ch = bench.choices
            if "columns" in ch:
                options = [column(row, c, where) for c in ch["columns"]]
                order = list(range(len(options)))
                random.Random(f"{ch.get('shuffle_seed', 0)}:{ident}").shuffle(order)
                labels = list(string.ascii_uppercase[:len(options)])
                gold = labels[order.index(int(ch.get("correct", 0)))]
                options = [options[j] for j in order]
            else:
                options = list(column(row, ch["column"], where))
                labels = ([str(x) for x in column(row, ch["labels"], where)] if ch.get("labels")
                          else list(string.ascii_uppercase[:len(options)]))
                if len(labels) != len(options):
                    raise DataError(f"{where}: row {i} has {len(options)} options but {len(labels)} labels; fix {where}.choices")
            user = user.replace("{choices}", render_choices(options, labels))
            if str(gold).strip() not in labels:
                raise DataError(f"{where}: row {i}'s answer {gold!r} is not one of its option labels {labels}; fix {where}.columns.answer")
        out.append(Problem(index=i, id=ident, problem=user, answer=str(gold), labels=labels))
    return out


def load_problems(bench: Benchmark, limit: int | None = None) -> list[Problem]:
    """Read ``bench.source`` (hub id, file or folder) and map its rows; ``limit``: the first N."""
    ds, _ = reading._load_raw(bench.source, split=bench.split, subset=bench.subset, config_prefix=f"benchmarks.{bench.name}")
    n = len(ds) if limit is None else min(int(limit), len(ds))
    rows = [ds[i] for i in range(n)]
    if not rows:
        raise DataError(f"benchmarks.{bench.name}: {bench.source} ({bench.split}) has no rows; fix benchmarks.{bench.name}.source")
    return problems(bench, rows)
