"""A run directory's bookkeeping: its layout, creating it, its lock, its saved config, refusing
one that is in use, replacing a failed run, and finding the checkpoint a resume continues from.

Run directory layout::

    config.yaml      the resolved config (:func:`config_text`)
    metrics.jsonl    one row per logged step
    eval.jsonl       held-out results every trainer.eval_every steps
    samples.jsonl    a few prompts/completions per logged step and evaluation (mixrl samples RUN_DIR)
    eval_before.json held-out results of the starting model (reused by a resumed run)
    trainer/         checkpoints: checkpoint-<step>/ every trainer.save_steps (newest kept)
    model/           final model and tokenizer (Hugging Face format)
    model-merged/    a LoRA adapter merged into its base model (model.lora.save_merged=true)
    summary.json     accuracy before/after, wall-clock, steps, paths
    FAILED           only if the run failed: the one-line reason (a rerun with the same
                     run_dir removes the files mixrl wrote there, nothing else; resume=RUN_DIR continues it)
    .mixrl.lock      held (flock) by the process writing the run: a second one is refused
    launch/          the launcher's files of a multi-process run (:mod:`mixrl.launch`)
    stage<i>-<name>/ a staged run's stages, each a run directory of its own

The lock (:class:`RunDirLock`): a run holds an exclusive ``flock`` on ``RUN_DIR/.mixrl.lock`` (created by the first run and
left in place; it holds the holder's pid) from before it writes anything until it ends, so a
second ``mixrl train resume=RUN_DIR`` (or a new run with the same ``run_dir``) started
meanwhile is refused with one line instead of writing the same metrics and checkpoints. The
kernel drops the lock when the process dies, even under SIGKILL, so a killed run never
leaves a stale lock behind. Only rank 0 of a multi-process run takes it; a resume started
through the launcher (:mod:`mixrl.launch`) takes it in the launching process, before it
writes ``launch/``, and tells the processes it starts (``MIXRL_RUN_DIR_LOCK_HELD``) not to.

Whether a resume may go on (the config comparison) is :mod:`mixrl.trainer.state.resume`'s job; which
checkpoint it continues from, and whether that checkpoint is readable, is this module's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from datetime import datetime
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from mixrl.errors import ConfigError, storage_error
from mixrl.jsonl import read_jsonl, step_row
from mixrl.models.files import unreadable_file

FAILED = "FAILED"
EVAL_BEFORE = "eval_before.json"
CONFIG_FILE = "config.yaml"
MERGED_DIR = "model-merged"

LOCK_FILE = ".mixrl.lock"
#: set by the launcher for the processes it starts: the run directory whose lock it holds for them
HELD_ENV = "MIXRL_RUN_DIR_LOCK_HELD"


class RunDirLock:
    """``acquire(run_dir)`` takes the lock (ConfigError when another process holds it);
    ``release()`` drops it (idempotent)."""

    def __init__(self):
        self.fd: int | None = None

    def acquire(self, run_dir: str | Path) -> None:
        if self.fd is not None:
            return  # held already (taken early, before the run's inputs were loaded)
        if os.environ.get(HELD_ENV) == os.path.realpath(run_dir):
            return  # the launcher that started this process holds it
        try:
            import fcntl  # deferred: fcntl is POSIX only; without it no lock is taken
        except ImportError:  # not a POSIX system: no locking
            return
        path = Path(run_dir) / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ConfigError(f"run_dir '{run_dir}' cannot be written ({e.strerror or e}); choose a writable run_dir") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            pid = f" (pid {holder})" if holder.isdigit() else ""
            raise ConfigError(
                f"run_dir '{run_dir}' is in use by another mixrl process{pid}; wait until it ends (or stop it), "
                "then run the command again"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is None:
            return
        import fcntl  # deferred: fcntl is POSIX only (see acquire); this module must import on any system

        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            os.close(self.fd)
            self.fd = None


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


# --------------------------------------------------------------------------- create
def default_run_dir(cfg: DictConfig, root: str | Path = "runs") -> Path:
    """``runs/<date>/<time>-<algo>-s<seed>``; under torchrun every rank derives the same
    name from the launcher's run id, so all processes share one directory."""
    now = datetime.now()
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    stamp = f"{now.strftime('%H%M')}-{run_id[:8]}" if run_id and int(os.environ.get("WORLD_SIZE", "1")) > 1 else now.strftime("%H%M%S-%f")[:-3]
    return Path(root) / now.strftime("%Y-%m-%d") / f"{stamp}-{cfg.algo.name}-s{cfg.seed}"


def config_text(cfg: DictConfig) -> str:
    """What a run directory's ``config.yaml`` holds: the resolved config as YAML. Resume and
    ``mixrl eval`` load it back and validate it; every shipped algo and recipe is
    tested to survive the round trip (``tests/test_config_roundtrip.py``)."""
    return OmegaConf.to_yaml(cfg, resolve=True)


def prepare_run_dir(cfg: DictConfig, say=print, lock=None) -> Path:
    """Create the run directory and write config.yaml (rank 0 only; other ranks share it).

    ``lock`` (a :class:`RunDirLock`) is taken before anything is
    written. A resumed run (``cfg.resume``) reuses its directory: once the lock is held and its
    checkpoint checked, its ``FAILED`` marker goes and ``config.yaml`` is rewritten only when a
    resume override changed it (e.g. a raised max_steps). A new run may use a missing or empty
    directory, or one marked ``FAILED`` that holds only what mixrl writes (those files are
    removed, nothing else: see :func:`check_new_run_dir`)."""
    if cfg.get("resume"):
        run_dir = Path(cfg.resume)
        if _rank() == 0:
            if lock is not None:
                lock.acquire(run_dir)
            resume_checkpoint(cfg)  # nothing left to train: refused before anything changes
            text = config_text(cfg)
            (run_dir / FAILED).unlink(missing_ok=True)
            if (run_dir / CONFIG_FILE).read_text() != text:
                (run_dir / CONFIG_FILE).write_text(text)
        return run_dir
    run_dir = Path(cfg.run_dir) if cfg.run_dir else default_run_dir(cfg)
    cfg.run_dir = str(run_dir)
    if _rank() != 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        return run_dir
    replace = check_new_run_dir(run_dir, say)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        if lock is not None:
            lock.acquire(run_dir)
        if replace:
            clear_failed_run(run_dir, say)
        (run_dir / CONFIG_FILE).write_text(config_text(cfg))
    except OSError as e:
        raise storage_error(e) or ConfigError(f"run_dir '{run_dir}' cannot be written ({e.strerror or e}); choose a writable run_dir") from None
    return run_dir


#: what mixrl writes at the top of a run directory (``stage<i>-<name>/``: a staged run's stages)
MIXRL_ENTRIES = frozenset({CONFIG_FILE, "metrics.jsonl", "eval.jsonl", "samples.jsonl", EVAL_BEFORE, "summary.json", FAILED,
                           "trainer", "model", MERGED_DIR, "launch", LOCK_FILE})
_STAGE_DIR = re.compile(r"^stage\d+-[\w.-]+$")
#: kept when a failed run is replaced: the lock the new run holds and the launcher's files of this launch
_KEPT = ("launch", LOCK_FILE)


def written_by_mixrl(path: Path) -> bool:
    """Is this top-level entry of a run directory one that mixrl writes?"""
    return path.name in MIXRL_ENTRIES or (path.is_dir() and bool(_STAGE_DIR.match(path.name)))


def check_new_run_dir(run_dir: Path, say=print) -> bool:
    """May a new run use ``run_dir``? Reads only. Yes (False returned) when it is missing,
    empty, or holds only the launcher's ``launch/`` folder (:mod:`mixrl.launch`) and mixrl's
    lock file; yes with a replacement (True returned: :func:`clear_failed_run` once the lock
    is held) when it is marked ``FAILED`` and holds nothing but what mixrl writes. Any other
    non-empty directory is refused (ConfigError); a failed run beside files of someone else's
    too, naming the first of them: mixrl never deletes what it did not write."""
    run_dir = Path(run_dir)
    if not run_dir.exists() or all(p.name in _KEPT for p in run_dir.iterdir()):
        return False
    failed = run_dir / FAILED
    if failed.is_file():
        foreign = sorted(p.name for p in run_dir.iterdir() if not written_by_mixrl(p))
        if foreign:
            more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
            raise ConfigError(
                f"run_dir '{run_dir}' holds a failed run and '{foreign[0]}'{more}, which mixrl did not write; "
                "move that out of the directory or choose another run_dir"
            )
        return True
    hint = f", or continue it with resume={run_dir}" if last_checkpoint(run_dir) else ""
    raise ConfigError(f"run_dir '{run_dir}' already exists and is not empty; choose another run_dir{hint}")


def clear_failed_run(run_dir: Path, say=print) -> None:
    """Remove a failed run's files (only those :func:`written_by_mixrl`; the directory, the
    lock and this launch's ``launch/`` stay), with a note."""
    run_dir = Path(run_dir)
    failed = run_dir / FAILED
    reason = failed.read_text().strip() if failed.is_file() else "?"
    say(f"replacing run_dir {run_dir}: it is marked FAILED ({reason})")
    for p in run_dir.iterdir():
        if p.name in _KEPT or not written_by_mixrl(p):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def mark_failed(run_dir: Path, reason: str) -> None:
    """Write the ``FAILED`` marker (rank 0; never raises)."""
    if _rank() != 0:
        return
    try:
        (Path(run_dir) / FAILED).write_text(reason.strip().splitlines()[0] + "\n" if reason.strip() else "failed\n")
    except OSError:
        pass


def refuse_occupied(cfg: DictConfig, say=print) -> None:
    """A new run's ``run_dir`` that is already in use is refused before anything is loaded.
    Only the refusal (:func:`check_new_run_dir` reads only): the files of a run marked FAILED are
    removed by :func:`prepare_run_dir`, after the inputs passed their checks, so a refused start
    changes nothing."""
    if cfg.get("resume") or not cfg.run_dir or _rank() != 0:
        return
    check_new_run_dir(Path(cfg.run_dir), say)


# --------------------------------------------------------------------------- checkpoints
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_dir(run_dir: str | Path) -> Path:
    """Where a run's Trainer checkpoints live."""
    return Path(run_dir) / "trainer"


def last_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete ``checkpoint-<step>`` folder of a run, or None."""
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return None
    found = []
    for p in folder.iterdir():
        m = CHECKPOINT_RE.match(p.name)
        if m and p.is_dir() and (p / "trainer_state.json").is_file():  # written last: the checkpoint is complete
            found.append((int(m.group(1)), p))
    return max(found)[1] if found else None


def checkpoint_step(path: str | Path) -> int:
    """The step of a ``checkpoint-<step>`` folder."""
    return int(CHECKPOINT_RE.match(Path(path).name).group(1))


def last_checkpoint_note(run_dir: Path) -> str:
    """What a failure message says a user can continue from: the last checkpoint, or that there is none."""
    ckpt = last_checkpoint(run_dir)
    return f"last checkpoint: step {checkpoint_step(ckpt)} (resume={run_dir})" if ckpt else "no checkpoint was saved"


def resume_checkpoint(cfg: DictConfig) -> Path:
    """The checkpoint ``cfg.resume`` continues from; ConfigError when there is none, when
    ``trainer.max_steps`` leaves nothing to train, when a file of it is unreadable or when
    ``cfg`` trains something else than it was trained under
    (:func:`mixrl.trainer.state.resume.check_trained_config`). Reads only."""
    run_dir = Path(cfg.resume)
    ckpt = last_checkpoint(run_dir)
    if ckpt is None:
        raise ConfigError(
            f"resume={run_dir}: no checkpoint under {run_dir / 'trainer'} to continue from; "
            "start a new run (checkpoints are written every trainer.save_steps steps)"
        )
    step = checkpoint_step(ckpt)
    if step >= int(cfg.trainer.max_steps):
        raise ConfigError(
            f"resume={run_dir}: its last checkpoint is step {step} and trainer.max_steps={cfg.trainer.max_steps}; "
            f"nothing left to train (set trainer.max_steps above {step} to extend it)"
        )
    bad = unreadable_checkpoint_file(ckpt)
    if bad is not None:
        name, reason = bad
        raise ConfigError(
            f"resume={run_dir}: {ckpt.name}/{name} is unreadable ({reason}); delete {ckpt} to resume from the "
            "checkpoint before it (if one is kept), or start a new run"
        )
    from mixrl.trainer.state.resume import check_trained_config  # deferred: trainer.state.resume imports the config composition

    check_trained_config(cfg, ckpt)  # config.yaml edited since (another algo): refused as on the command line
    return ckpt


def unreadable_checkpoint_file(ckpt: Path) -> tuple[str, str] | None:
    """The first file of checkpoint ``ckpt`` that cannot be read, as ``(name, reason)``; None when
    all can (:func:`mixrl.models.files.unreadable_file`, the check ``mixrl eval`` and
    ``model.path`` share). Cheap, so it runs before anything of a resume is written."""
    return unreadable_file(ckpt)


def cut_logs_back(run_dir: str | Path, last_step: int, names: tuple[str, ...]) -> None:
    """On resume, the run's JSON-lines logs ``names`` cut back to ``last_step`` (:func:`truncate_jsonl`)
    by rank 0 alone, their one writer: every process of a launched run resumes, and two processes
    cutting one log back raced (one wrote back the other's half-emptied file)."""
    if _rank() != 0:
        return
    for name in names:
        truncate_jsonl(Path(run_dir) / name, last_step)


def truncate_jsonl(path: str | Path, last_step: int) -> int:
    """Drop rows with ``step > last_step`` and unreadable lines (a torn last line, bytes that are
    not UTF-8, JSON that is not a row with an integer ``step``); returns rows kept. The kept rows
    replace the file in one rename, so a reader sees the old file or the new one, never a file
    emptied half-way (two processes that cut the same log back once raced there: one read the
    other's emptied file and wrote it back empty)."""
    path = Path(path)
    if not path.is_file():
        return 0
    kept = [row for row in read_jsonl(path, step_row).rows if row["step"] <= last_step]  # unreadable lines (one cut by the kill) go
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in kept))
    os.replace(tmp, path)
    return len(kept)
