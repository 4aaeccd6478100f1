"""The CLI's handling of user errors, shared by every command module."""

from __future__ import annotations

import functools
import gc
import os
import sys

import typer
from rich.console import Console
from typer.core import TyperGroup
from typer.exceptions import Abort

try:  # Click's exception classes as Typer raises them: Typer >= 0.20 carries its own copy of Click
    from typer._click import exceptions as click_exceptions
except ImportError:  # an older Typer: the click package's
    from click import exceptions as click_exceptions
from rich.markup import escape

from mixrl.errors import MixrlUserError, RunInterrupted, storage_error


def launched_worker() -> bool:
    """Is this one of several processes a launcher started (:mod:`mixrl.launch`)?"""
    return os.environ.get("MIXRL_LAUNCHED") == "1" and int(os.environ.get("WORLD_SIZE", "1")) > 1


def exit_launched_worker(code: int) -> None:
    """End a launched process now, its work done or its error printed: atexit handlers run
    (trackers flush), standard streams are flushed, then ``os._exit(code)`` skips the
    interpreter's teardown. That teardown destroys the gloo process group objects that FSDP's
    device mesh still references, with their threads live: under load it can abort the process
    (SIGABRT, 'terminate called without an active exception') after a run that succeeded, and
    turn its exit status into a signal. Outside a launch it returns."""
    if not launched_worker():
        return
    import atexit  # deferred: only a launched process ends this way

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _end(code: int) -> typer.Exit:
    """The exit of a command that failed or was stopped (a launched process ends at once:
    :func:`exit_launched_worker`)."""
    exit_launched_worker(code)
    return typer.Exit(code=code)


def quick_exit() -> None:
    """Let an interrupted command exit in moments: the interpreter's last garbage collection
    walks every object a training process made (tens of seconds on a loaded machine, past a
    scheduler's grace period between SIGTERM and SIGKILL); ``gc.freeze`` leaves them out of it.
    Files, atexit handlers (trackers' flushes) and the exit code are unchanged."""
    gc.freeze()


def freeze_at_exit() -> None:
    """Every ``mixrl`` command ends in moments: the interpreter's last garbage collection would
    walk every object a training process made (20-60 s on a loaded machine after a run's last
    line); an atexit handler registered first runs last, after the trackers' flushes, and freezes
    them out of it (:func:`quick_exit`). Registered by the CLI module; in a test process it only
    runs when that process exits."""
    import atexit  # deferred: only the CLI registers it

    atexit.register(quick_exit)


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
            raise _end(getattr(e, "exit_code", 2)) from None
        except KeyboardInterrupt:
            Console(stderr=True).print("[yellow]interrupted[/]")
            quick_exit()
            raise _end(130) from None
        except (OSError, RuntimeError) as e:  # a disk full or read-only folder: the machine's, one line
            err = storage_error(e)
            if err is None:
                raise
            Console(stderr=True).print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
            raise _end(err.exit_code) from None

    return wrapper


class OneLineUsageErrors(TyperGroup):
    """The ``mixrl`` app's command group: a usage error Typer would draw as a box with the usage
    (an unknown option, a value of the wrong type such as ``--steps abc``, a missing argument) is
    one line on stderr instead, ``error: ...; see `mixrl CMD --help```, exit 2, like every other user
    error (:func:`user_errors`). A command group called without a command still prints its help."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click_exceptions.NoArgsIsHelpError as e:  # `mixrl config`: its help, as Typer shows it
            from typer import rich_utils  # deferred: only a bare command group needs it

            rich_utils.rich_format_error(e)
            sys.exit(e.exit_code)
        except click_exceptions.ClickException as e:
            ctx = getattr(e, "ctx", None)
            hint = f"; see `{ctx.command_path} --help`" if ctx is not None and isinstance(e, click_exceptions.UsageError) else ""
            Console(stderr=True).print(f"[bold red]error:[/] {escape(e.format_message().rstrip('.'))}{escape(hint)}",
                                       highlight=False, soft_wrap=True)
            sys.exit(e.exit_code)
        except Abort:
            Console(stderr=True).print("Aborted.")
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)

