"""Where the commands print: ``out`` (standard output; 160 columns when it is not a terminal)
and ``err`` (standard error), and the overrides argument the commands share."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)

OVERRIDES = typer.Argument(None, help="Hydra overrides, e.g. algo=chord trainer.max_steps=20 recipe=grpo/arith-tiny")
