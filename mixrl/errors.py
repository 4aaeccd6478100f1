"""User-facing errors.

Every error a user can cause (bad config, bad data, missing file) is raised as a
``MixrlUserError`` whose message is one line that names the problem and the fix.
The CLI prints it without a traceback and exits with code 2.
"""

from __future__ import annotations

import difflib
import errno
import re
from collections.abc import Callable, Iterable
from typing import Any


class MixrlUserError(Exception):
    """An error caused by the user's input; the message is one line with the fix."""

    exit_code = 2


class ConfigError(MixrlUserError):
    """Bad configuration: unknown key or option, wrong type, contradictory values."""


class DataError(MixrlUserError):
    """Bad data: missing file or column, unreadable rows."""


class RewardError(MixrlUserError):
    """A reward function raised, or returned something other than one finite number per completion."""


class UserFunctionError(MixrlUserError):
    """A function the user supplied (a feedback builder, ...) raised, or returned what it must not;
    the message names the function and what it returned (:func:`call_user_function`)."""


class RunStopped(MixrlUserError):
    """A run stopped before its last step; the message says what was saved and what to do."""

    exit_code = 1


class TrainingDiverged(RunStopped):
    """A non-finite loss, gradient or probability: training cannot continue."""

    exit_code = 3


class RunInterrupted(RunStopped):
    """SIGINT / SIGTERM: a checkpoint was saved (if any step had finished) and the run stopped."""

    exit_code = 130


#: the exit status of a run stopped by a preemption signal after it saved a checkpoint: EX_TEMPFAIL of
#: sysexits.h ("a temporary failure; the user is invited to retry"): running the same command again
#: (``resume=auto``) continues it; the sbatch script of ``mixrl plan --sbatch`` requeues the job on it
PREEMPTED_EXIT = 75


class RunPreempted(RunInterrupted):
    """SIGTERM or SIGUSR1 (a scheduler's preemption or time-limit warning) stopped the run after a
    checkpoint was saved: exit status :data:`PREEMPTED_EXIT`, so a job script can requeue it."""

    exit_code = PREEMPTED_EXIT


class StorageError(MixrlUserError):
    """A file of the run could not be written: the disk is full, or the folder is read-only."""


#: errno -> (what happened, the fix); the errors a user's machine causes, not mixrl
_STORAGE = {
    errno.ENOSPC: ("the disk is full", "free space on that disk or choose a run_dir on another disk"),
    errno.EDQUOT: ("the disk quota is exceeded", "free space or choose a run_dir on another disk"),
    errno.EROFS: ("the file system is read-only", "choose a writable run_dir"),
    errno.EACCES: ("permission denied", "make the run directory writable (chmod u+w) or choose another run_dir"),
    errno.EPERM: ("permission denied", "make the run directory writable (chmod u+w) or choose another run_dir"),
    errno.ENAMETOOLONG: ("the file name is too long", "choose a shorter run_dir (folder names at most 255 bytes)"),
    errno.EFBIG: ("the file is larger than this machine allows (a file-size limit or a full file system)",
                  "raise the file-size limit (ulimit -f) or choose a run_dir on another disk"),
}
#: how Rust libraries (safetensors, tokenizers) report an OS error in their message
_OS_ERROR_TEXT = re.compile(r"\(os error (\d+)\)")


def storage_error(exc: BaseException) -> StorageError | None:
    """The one-line :class:`StorageError` for a write that failed because of the machine (disk
    full, read-only folder, permission, name too long), found anywhere in ``exc``'s chain
    (a library may wrap the ``OSError``); None for anything else."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        code = getattr(e, "errno", None) if isinstance(e, OSError) else None
        if code is None and "No space left on device" in str(e):
            code = errno.ENOSPC
        if code is None and (m := _OS_ERROR_TEXT.search(str(e))):  # e.g. SafetensorError "I/O error: ... (os error 27)"
            code = int(m.group(1))
        if code in _STORAGE:
            what, fix = _STORAGE[code]
            where = getattr(e, "filename", None) if isinstance(e, OSError) else None
            return StorageError(f"could not write {where or 'a file of the run'}: {what}; {fix}")
        if "file write failed" in str(e):  # torch.save's stream writer drops the errno
            return StorageError("could not write a checkpoint file (torch.save: file write failed): the disk is probably "
                                "full; free space on the run directory's disk or choose a run_dir on another disk")
        e = e.__cause__ or e.__context__
    return None


def did_you_mean(word: str, choices: Iterable[str], n: int = 3) -> str:
    """Return ``" (did you mean: a, b?)"`` for the closest choices, or ``""`` if none is close."""
    choices = sorted(set(choices))
    # a choice that contains what was typed (a prefix or a fragment) beats an edit-distance match
    close = [c for c in choices if word and word in c][:n]
    if not close:
        close = difflib.get_close_matches(word, choices, n=n, cutoff=0.5)
    return f" (did you mean: {', '.join(close)}?)" if close else ""


# ----------------------------------------------------------------------------- the user's functions
def describe_value(value: Any) -> str:
    """A returned value in a few words: ``int 3``, ``str of 5000 characters``, ``list of 2 items``."""
    if value is None:
        return "None"
    kind = type(value).__name__
    if isinstance(value, str):
        return f"str of {len(value)} characters" if len(value) > 40 else f"str {value!r}"
    if isinstance(value, (bool, int, float)):
        return f"{kind} {value!r}"
    if hasattr(value, "__len__"):
        try:
            return f"{kind} of {len(value)} items"
        except TypeError:
            pass
    return kind


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else "(no message)"


def call_user_function(fn: Callable, name: str, *args: Any, expects: str,
                       accept: Callable[[Any], str | None] | None = None,
                       error: type[MixrlUserError] = UserFunctionError, **kwargs: Any) -> Any:
    """Call ``fn`` (a function the user supplied; ``name`` says where it was configured, e.g.
    ``algo.inject.feedback='judge.py:critique'``) and return what it returned. A raise becomes
    ``error`` with one line naming the function, the exception and ``expects`` (what it should
    return); so does a returned value that ``accept`` refuses (``accept(value)``: None when fine,
    else why not). A :class:`MixrlUserError`, ``KeyboardInterrupt`` and ``SystemExit`` pass through
    unchanged (a stop, not the function's fault). The reward functions have their own guard with
    the same message (:class:`mixrl.rewards.registry.CheckedReward`: it also finds the failing row)."""
    try:
        out = fn(*args, **kwargs)
    except MixrlUserError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's function: one line naming it
        raise error(f"{name} raised {type(e).__name__}: {_first_line(e)}; fix the function (it must return {expects})") from e
    why = accept(out) if accept is not None else None
    if why:
        raise error(f"{name} returned {describe_value(out)}: {why}; it must return {expects}")
    return out
