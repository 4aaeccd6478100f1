"""The CLI's handling of user errors, shared by every command module."""

from __future__ import annotations

import functools
import gc

import typer
from rich.console import Console
from rich.markup import escape

from mixrl.errors import MixrlUserError, RunInterrupted, storage_error


def quick_exit() -> None:
    """Let an interrupted command exit in moments: the interpreter's last garbage collection
    walks every object a training process made (tens of seconds on a loaded machine, past a
    scheduler's grace period between SIGTERM and SIGKILL); ``gc.freeze`` leaves them out of it.
    Files, atexit handlers (trackers' flushes) and the exit code are unchanged."""
    gc.freeze()


def user_errors(fn):
    """Print a MixrlUserError as one line on stderr and exit with its code (2 for bad
    config or data; non-zero codes of their own for a run that diverged or was
    interrupted), without a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except MixrlUserError as e:
            Console(stderr=True).print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
            if isinstance(e, RunInterrupted):
                quick_exit()
            raise typer.Exit(code=getattr(e, "exit_code", 2)) from None
        except KeyboardInterrupt:
            Console(stderr=True).print("[yellow]interrupted[/]")
            quick_exit()
            raise typer.Exit(code=130) from None
        except (OSError, RuntimeError) as e:  # a disk full or read-only folder: the machine's, one line
            err = storage_error(e)
            if err is None:
                raise
            Console(stderr=True).print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
            raise typer.Exit(code=err.exit_code) from None

    return wrapper
