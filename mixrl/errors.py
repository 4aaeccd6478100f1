"""User-facing errors.

Every error a user can cause (bad config, bad data, missing file) is raised as a
``MixrlUserError`` whose message is one line that names the problem and the fix.
The CLI prints it without a traceback and exits with code 2.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class MixrlUserError(Exception):
    """An error caused by the user's input; the message is one line with the fix."""

    exit_code = 2


class ConfigError(MixrlUserError):
    """Bad configuration: unknown key or option, wrong type, contradictory values."""


class DataError(MixrlUserError):
    """Bad data: missing file or column, unreadable rows."""


class RewardError(MixrlUserError):
    """A reward function raised, or returned something other than one finite number per completion."""


class RunStopped(MixrlUserError):
    """A run stopped before its last step; the message says what was saved and what to do."""

    exit_code = 1


class TrainingDiverged(RunStopped):
    """A non-finite loss, gradient or probability: training cannot continue."""

    exit_code = 3


class RunInterrupted(RunStopped):
    """SIGINT / SIGTERM: a checkpoint was saved (if any step had finished) and the run stopped."""

    exit_code = 130


def did_you_mean(word: str, choices: Iterable[str], n: int = 3) -> str:
    """Return ``" (did you mean: a, b?)"`` for the closest choices, or ``""`` if none is close."""
    choices = sorted(set(choices))
    # a choice that contains what was typed (a prefix or a fragment) beats an edit-distance match
    close = [c for c in choices if word and word in c][:n]
    if not close:
        close = difflib.get_close_matches(word, choices, n=n, cutoff=0.5)
    return f" (did you mean: {', '.join(close)}?)" if close else ""
