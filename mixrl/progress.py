"""The one progress display of every long mixrl command (training, held-out evaluation,
model warm start, reproduce): a Rich bar with the time left, a few plain lines, or nothing.

:func:`progress_bar` decides, from the console it draws on:

* a terminal (``console.is_terminal``) and not quiet: a live Rich bar (label, bar, done/total,
  the caller's fields, elapsed time and an estimate of the time left);
* not a terminal (a log file, a pipe, CI) and not quiet: no bar and no control characters, one
  plain line each quarter of the way (``label: 50/100 (50%), 12s elapsed, ~12s left``);
* quiet (``--quiet``, ``logger.progress=false``): nothing.

Every form has the same methods (``add_task``, ``update``, ``advance``, ``start``/``stop``, and
is a context manager), so a caller never tests which one it got.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

from rich.console import Console
from rich.progress import (
    BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn,
)

#: fractions of the total at which the plain (non-terminal) form prints a line
PLAIN_MARKS = (0.25, 0.5, 0.75, 1.0)


def show_bar(console: Console, quiet: bool = False) -> bool:
    """A live bar only on a terminal and when not quiet."""
    return not quiet and console.is_terminal


def progress_bar(console: Console | None = None, *, quiet: bool = False, fields: tuple[str, ...] = (),
                 transient: bool = False):
    """The progress display for ``console`` (stderr by default): a Rich :class:`Progress` with
    :class:`TimeRemainingColumn` on a terminal, :class:`PlainProgress` elsewhere, :class:`NoProgress`
    when ``quiet``. ``fields``: extra text columns in Rich's format (``"loss {task.fields[loss]:.3f}"``)."""
    console = console or Console(stderr=True)
    if quiet:
        return NoProgress()
    if not show_bar(console):
        return PlainProgress(console, fields=fields)
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        *(TextColumn(f) for f in fields), TimeElapsedColumn(), TimeRemainingColumn(),
        console=console, transient=transient,
    )


class NoProgress:
    """Shows nothing (``--quiet``)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def start(self):
        pass

    def stop(self):
        pass

    def add_task(self, description: str, total: float | None = None, **fields) -> int:
        return 0

    def update(self, task: int, **kwargs) -> None:
        pass

    def advance(self, task: int, advance: float = 1) -> None:
        pass


class PlainProgress(NoProgress):
    """No bar, no control characters: a plain line at each mark of :data:`PLAIN_MARKS`."""

    def __init__(self, console: Console, *, fields: tuple[str, ...] = ()):
        self.console = console
        self.fields = fields
        self.tasks: list[dict] = []

    def add_task(self, description: str, total: float | None = None, completed: float = 0, **fields) -> int:
        self.tasks.append({"description": description, "total": total, "completed": completed, "fields": fields,
                           "start": time.monotonic(), "mark": 0})
        return len(self.tasks) - 1

    def update(self, task: int, *, total: float | None = None, completed: float | None = None,
               advance: float | None = None, description: str | None = None, **fields) -> None:
        t = self.tasks[task]
        if total is not None:
            t["total"] = total
        if description is not None:
            t["description"] = description
        if completed is not None:
            t["completed"] = completed
        if advance is not None:
            t["completed"] += advance
        t["fields"].update(fields)
        self._report(t)

    def advance(self, task: int, advance: float = 1) -> None:
        self.update(task, advance=advance)

    def _report(self, t: dict) -> None:
        total, done = t["total"], t["completed"]
        if not total or t["mark"] >= len(PLAIN_MARKS) or done < PLAIN_MARKS[t["mark"]] * total:
            return
        while t["mark"] < len(PLAIN_MARKS) and done >= PLAIN_MARKS[t["mark"]] * total:
            t["mark"] += 1
        elapsed = time.monotonic() - t["start"]
        left = elapsed * (total - done) / done if done else 0.0
        extra = "".join(", " + f.format(task=SimpleNamespace(fields=t["fields"])) for f in self.fields)
        extra = extra if extra.strip(", ") else ""
        self.console.print(
            f"{t['description']}: {done:g}/{total:g} ({100 * done / total:.0f}%){extra}, "
            f"{elapsed:.0f}s elapsed, ~{left:.0f}s left",
            markup=False, highlight=False, soft_wrap=True,
        )
