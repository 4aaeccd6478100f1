"""The command line's own values, checked before any work starts: where a command writes
(``--out``, ``--sbatch``, ``--plot``) and the numbers it is given (``--target``, ``--steps``,
``--timeout``, ...). Standard library and :mod:`mixrl.errors` only, so a script (``scripts/gpu_check.py``)
uses the same rules as the ``mixrl`` commands.

**One output-folder rule.** A folder a command fills with several files (``mixrl compare --out``,
``mixrl reproduce --out``) is written only when it is new, empty, or holds an earlier output of
that same command (its marker file, e.g. ``compare.json``); otherwise it is refused, naming the
first file the command did not write: mixrl never overwrites, or mixes its files with, files it
did not write (``run_dir`` follows the same rule: :func:`mixrl.trainer.state.rundir.check_new_run_dir`).
A single file (``--out FILE``, ``--sbatch FILE``) is refused when it is a directory, when no
writable folder would hold it (write-tested, not guessed from the mode bits), or when it exists and
the command did not write it (its mark: a generated page's note, the job script's "written by" line,
the JSON's keys); missing parent folders are created. Every file is written whole or not at all
(:func:`replace_text`), so a kill mid-write leaves the earlier file.

**Numbers** (:func:`check_number`) are refused like config keys (:mod:`mixrl.config.components`):
one line naming the option, the value and the range; NaN and infinities are never accepted.

Every refusal is a :class:`~mixrl.errors.ConfigError` (one line, exit 2), raised before the
command does anything that takes time, so nothing is lost to a destination found unwritable at
the end.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from mixrl.errors import ConfigError


# ----------------------------------------------------------------------------- numbers
def check_number(value, option: str, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False, integer: bool = False):
    """``value`` unchanged when it is a finite number in range (None passes: an option left unset);
    else ConfigError naming ``option``. ``low``/``high``: inclusive bounds (``low_open``/``high_open``:
    exclusive); ``integer``: a whole number."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{option} must be a number, got {value!r}") from None
    if not math.isfinite(value):
        raise ConfigError(f"{option} must be a finite number, got {value}; {_range_text(low, high, low_open, high_open)}")
    if integer and value != int(value):
        raise ConfigError(f"{option} must be a whole number, got {value}")
    bad = ((low is not None and (value <= low if low_open else value < low))
           or (high is not None and (value >= high if high_open else value > high)))
    if bad:
        raise ConfigError(f"{option}={value:g} is out of range: {_range_text(low, high, low_open, high_open)}")
    return value


def _range_text(low, high, low_open, high_open) -> str:
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        parts.append(f"{'<' if high_open else '<='} {high:g}")
    return "it must be " + " and ".join(parts) if parts else "give a finite number"


# ----------------------------------------------------------------------------- one output file
def can_write_in(folder: Path) -> bool:
    """Can a new file be made in the existing folder ``folder``? Tried, not guessed: a file is
    created and removed at once (``os.access`` says yes to root on a read-only folder, an immutable
    one or a read-only mount)."""
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        return False
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".mixrl-write-test-")
    except OSError:
        return False
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(name)
    return True


def _can_append(path: Path) -> bool:
    """Can the existing file ``path`` be written? Opened for appending and closed: nothing changes."""
    try:
        with open(path, "ab"):
            return True
    except OSError:
        return False


def _writable_ancestor(path: Path) -> tuple[Path, bool]:
    """The nearest existing ancestor of ``path`` and whether new entries can be made in it."""
    where = path.absolute().parent
    while not where.exists() and where != where.parent:
        where = where.parent
    return where, can_write_in(where)


def check_out_file(path: str | Path, option: str = "--out", *, example: str = "results.json",
                   written_by: Callable[[Path], bool] | None = None, command: str = "mixrl") -> Path:
    """A file the command writes once its work is done: refused now (ConfigError, one line) when it
    is a directory, a file that cannot be written, or under no writable folder, so the work is
    not lost at its end; and, given ``written_by`` (does this existing file carry ``command``'s
    mark?), an existing file ``command`` did not write. Reads only; missing parent folders are fine
    (:func:`write_out_file` creates them)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{option} {path} is a directory; give a file to write to, e.g. {option} {path / example}")
    if written_by is not None and path.is_file() and not written_by(path):
        raise ConfigError(f"{option} {path} exists and {command} did not write it; choose another path, or move that file "
                          "away (mixrl never overwrites a file it did not write)")
    if path.exists() and not _can_append(path):
        raise ConfigError(f"{option} {path} cannot be written (the file is read-only); choose another path or chmod u+w it")
    where, ok = _writable_ancestor(path)
    if not ok:
        what = "is a file, not a folder" if where.exists() and not where.is_dir() else "is not a writable folder"
        raise ConfigError(f"{option} {path} cannot be written ({where} {what}); choose a writable path")
    return path


def write_out_file(path: str | Path, text: str, option: str = "--out", *, mode: int | None = None,
                   written_by: Callable[[Path], bool] | None = None, command: str = "mixrl") -> Path:
    """Write ``text`` to ``path`` (checked first by :func:`check_out_file`, its folders created); a
    failure of the machine (disk full, read-only) is one line naming the option."""
    path = check_out_file(path, option, written_by=written_by, command=command)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_text(path, text, mode=mode)
    except OSError as e:  # the machine's (a disk that filled up, a folder made read-only meanwhile): one line
        raise ConfigError(f"{option} {path} could not be written ({e.strerror or e}); choose a writable path "
                          "on a disk with free space") from None
    return path


def replace_text(path: str | Path, text: str, *, mode: int | None = None) -> None:
    """Write ``text`` to ``path`` whole or not at all: into a hidden file beside it, then renamed over
    it, so a kill or a full disk mid-write leaves the earlier file (or none), never half of one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        if mode is not None:
            os.chmod(tmp, mode)
        elif path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ----------------------------------------------------------------------------- one output folder
def check_out_folder(path: str | Path, option: str, *, command: str, writes: Iterable[str], marker: str,
                     partial: Iterable[str] = (), is_marker: Callable[[Path], bool] | None = None) -> Path:
    """May ``command`` write its files into the folder ``path``? Reads only. Yes when it is missing
    or empty, holds an earlier output of ``command`` (its ``marker`` file, which ``is_marker`` may
    check further), or holds only entries ``command`` writes before its marker (``partial``: a run
    that was stopped; shell patterns allowed). Otherwise ConfigError naming the first entry it did not
    write, preferring one it would overwrite (``writes``). Also refused: a file, an unwritable folder."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{option} {path} is a file, not a folder; choose a new folder (or an earlier {command}'s)")
    if not path.exists():
        where, ok = _writable_ancestor(path / "x")
        if not ok:
            raise ConfigError(f"{option} {path} cannot be created ({where} is not a writable folder); choose a writable path")
        return path
    if not can_write_in(path):
        raise ConfigError(f"{option} {path} is not writable; choose a writable folder (or chmod u+w it)")
    entries = sorted(p.name for p in path.iterdir())
    mark = path / marker
    if not entries or (mark.is_file() and (is_marker is None or is_marker(mark))):
        return path
    writes = tuple(writes)
    partial = (*partial, *(f".{pat}.*.tmp" for pat in writes))  # a write of replace_text cut short by a kill
    foreign = [n for n in entries if not any(fnmatch.fnmatch(n, pat) for pat in partial)]
    if foreign:
        ours = [n for n in foreign if any(fnmatch.fnmatch(n, pat) for pat in writes)]
        first = (ours or foreign)[0]
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        raise ConfigError(f"{option} {path} holds '{first}'{more}, which {command} did not write (no {marker} there) "
                          "and would overwrite or mix with; choose a new or empty folder, or move those files out")
    return path


def text_with(mark: str, within: int = 4000) -> Callable[[Path], bool]:
    """A mark check: ``mark`` is in the file's first ``within`` characters (a generated page's note, a
    script's "written by" line)."""
    def check(p: Path) -> bool:
        try:
            with open(p, "rb") as f:
                return mark in f.read(within * 4).decode("utf-8", "replace")[:within]
        except OSError:
            return False
    return check


def json_object_with(*keys: str) -> Callable[[Path], bool]:
    """A marker check: the file is a JSON object holding ``keys`` (what the command writes)."""
    def check(p: Path) -> bool:
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            return False
        return isinstance(data, dict) and all(k in data for k in keys)
    return check


# ----------------------------------------------------------------------------- a file the user gives
def read_user_text(path: str | Path, what: str) -> str:
    """The text of a file the user named (a suite, a data table): ConfigError, one line naming
    ``what`` and the file, when it cannot be read or is not UTF-8 (with the first bad byte's place)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{what} {path} cannot be read ({e.strerror or e}); check the path") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise ConfigError(f"{what} {path} is not UTF-8 text (byte 0x{data[e.start]:02x} at line {line}, column {column}); "
                          "save it as UTF-8") from None
