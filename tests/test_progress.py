"""The progress display (issue 27): a Rich bar with the time left on a terminal, plain lines and
no control characters elsewhere, nothing under --quiet; every long command takes --quiet."""

from __future__ import annotations

import io
import re
import time

import pytest
from rich.console import Console
from typer.testing import CliRunner

from mixrl.cli.main import app
from mixrl.progress import NoProgress, PlainProgress, progress_bar

CONTROL = re.compile(r"[\x1b\r]")  # ANSI escapes and carriage returns: what a live bar writes


def _run(console: Console, quiet: bool = False, total: int = 8) -> str:
    with progress_bar(console, quiet=quiet, fields=("loss {task.fields[loss]:.2f}",)) as bar:
        task = bar.add_task("warm start", total=total, loss=1.0)
        for i in range(total):
            time.sleep(0.01)
            bar.update(task, advance=1, loss=1.0 / (i + 2))
    return console.file.getvalue()


def test_not_a_terminal_plain_lines_without_control_characters():
    console = Console(file=io.StringIO(), force_terminal=False, width=120)
    assert isinstance(progress_bar(console), PlainProgress)
    text = _run(console)
    assert not CONTROL.search(text)
    lines = text.splitlines()
    assert [ln.split(" (")[0] for ln in lines] == ["warm start: 2/8", "warm start: 4/8", "warm start: 6/8", "warm start: 8/8"]
    assert lines[1].startswith("warm start: 4/8 (50%), loss 0.20, ") and lines[1].endswith("s left")


@pytest.mark.parametrize("terminal", [False, True])
def test_quiet_prints_nothing(terminal):
    console = Console(file=io.StringIO(), force_terminal=terminal, width=120)
    assert isinstance(progress_bar(console, quiet=True), NoProgress)
    assert _run(console, quiet=True) == ""


def test_terminal_bar_shows_the_time_left():
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    text = _run(console)
    assert "\x1b" in text  # a live bar
    last = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).replace("\r", "\n").strip().splitlines()[-1]
    # done/total, the field, then elapsed and remaining time (TimeRemainingColumn): two H:MM:SS
    assert "8/8" in last and "loss 0.11" in last
    assert len(re.findall(r"\d+:\d\d:\d\d", last)) == 2, last


@pytest.mark.parametrize("command", [["train"], ["eval"], ["reproduce"], ["model", "build-tiny"]])
def test_every_long_command_takes_quiet(command):
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "--quiet" in result.output
