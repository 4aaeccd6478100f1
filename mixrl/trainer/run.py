"""One training run: held-out accuracy before/after, train, save, summary; a staged run's stages.

The run's steps (callbacks, the evaluation before training, fit, finish) are
:mod:`mixrl.trainer.run_steps`'s; :func:`train` takes the lock and the signals and turns a failure
into the ``FAILED`` marker around them.

The run directory (its layout, lock, saved config, the refusal of one in use, the FAILED
marker) is :mod:`mixrl.trainer.state.rundir`'s; the inputs and the trainer are assembled by
:mod:`mixrl.trainer.build` (:func:`~mixrl.trainer.build.prepare_inputs`,
:func:`~mixrl.trainer.build.trainer_from_config`).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
import warnings

from omegaconf import DictConfig
from rich.console import Console

from mixrl.errors import MixrlUserError, RunInterrupted, storage_error
from mixrl.trainer import build
from mixrl.trainer import run_steps as steps
from mixrl.trainer.build import RunInputs, prepare_inputs
from mixrl.trainer.run_steps import PREEMPTED_MARKER, stopped_error  # noqa: F401  (their home before the run's steps moved)
from mixrl.trainer.state.rundir import (
    LOCK_FILE,
    RunDirLock,
    last_checkpoint,
    last_checkpoint_note,
    mark_failed,
    prepare_run_dir,
    refuse_occupied,
    resume_checkpoint,
)


@dataclass
class RunResult:
    run_dir: Path
    summary: dict = field(default_factory=dict)


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def quiet_libraries() -> None:
    """mixrl draws its own progress bars: silence the libraries' bars and deprecation noise."""
    import datasets  # deferred: datasets is heavy; the light commands (--help, config show, plan) never load it
    import transformers  # deferred: transformers is heavy; the light commands (--help, config show, plan) never load it

    datasets.disable_progress_bars()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\..*")
    warnings.filterwarnings("ignore", message=r".*gradient_checkpointing.*")


def train(cfg: DictConfig, console: Console | None = None, *, before: dict | None = None,
          inputs: RunInputs | None = None) -> RunResult:
    """Train one config end to end; returns the run directory and summary. ``before``:
    held-out results already measured for the starting model (skips that evaluation);
    ``inputs``: already prepared by :func:`prepare_inputs`.

    Every check runs before the run directory is created (:func:`prepare_inputs`), so a
    failed start leaves nothing behind. ``cfg.resume`` set: continue that run from its last
    checkpoint (see :mod:`mixrl.trainer.state.resume`). A failure after the run directory exists
    writes the ``FAILED`` marker; SIGINT / SIGTERM / SIGUSR1 save a checkpoint and raise :class:`RunInterrupted`
    (:class:`~mixrl.errors.RunPreempted`, exit status 75, for SIGTERM / SIGUSR1: :func:`stopped_error`)
    (during a held-out evaluation they stop it within a batch: before training nothing is saved,
    after training the final model already is, since it is saved before that evaluation)."""
    from mixrl.trainer.guards import InterruptGuard  # deferred: trainer.guards imports transformers; `mixrl plan` imports this module and must not load it

    console = console or Console(stderr=True)
    quiet_libraries()
    lock = RunDirLock()  # taken by prepare_run_dir, held until the run ends: a second process on this run_dir is refused
    guard = InterruptGuard(say=console.print).install()  # a signal during the checks stops them too
    try:
        used = Path(cfg.resume) if cfg.get("resume") else Path(cfg.run_dir) if cfg.run_dir else None
        if used is not None and _rank() == 0 and (used / LOCK_FILE).is_file():
            lock.acquire(used)  # a directory mixrl ran in: a second process is refused before anything loads
        resume_from = resume_checkpoint(cfg) if cfg.get("resume") else None
        refuse_occupied(cfg, say=lambda text: console.print(text, soft_wrap=True, highlight=False))  # cheap, so before the inputs load
        if inputs is None:
            inputs = prepare_inputs(cfg, console)
        if guard.signum is not None:
            raise RunInterrupted(f"{guard.name} before training started; nothing was created")
        run_dir = prepare_run_dir(cfg, say=lambda text: console.print(text, soft_wrap=True, highlight=False), lock=lock)
    except BaseException:
        guard.restore()
        lock.release()
        raise
    try:
        return _train(cfg, console, run_dir, guard, resume_from, before, inputs)
    except RunInterrupted as e:
        if last_checkpoint(run_dir) is None and not (run_dir / "model").is_dir():  # the final model saved: not a failed run
            mark_failed(run_dir, str(e))
        raise
    except KeyboardInterrupt:
        msg = f"interrupted before a checkpoint could be saved; {last_checkpoint_note(run_dir)}"
        if last_checkpoint(run_dir) is None:
            mark_failed(run_dir, msg)
        raise RunInterrupted(msg) from None
    except BaseException as e:
        storage = storage_error(e) if isinstance(e, Exception) else None
        if storage is not None:  # disk full, read-only folder: one line naming the file (FAILED too, if it can be written)
            mark_failed(run_dir, str(storage))
            raise storage from None
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        mark_failed(run_dir, reason if isinstance(e, MixrlUserError) else f"{type(e).__name__}: {reason}")
        raise
    finally:
        guard.restore()
        lock.release()


def _train(cfg, console, run_dir: Path, guard, resume_from: Path | None, before: dict | None, inputs: RunInputs) -> RunResult:
    """The run's steps (:mod:`mixrl.trainer.run_steps`): begin, the trainer, its callbacks, the
    evaluation before training, fit, finish."""
    run = steps.begin(cfg, console, run_dir, guard, resume_from, before, inputs)
    run.trainer = build.trainer_from_config(cfg, inputs=inputs, run_dir=run_dir, for_run=True)  # config in checkpoints, sample rows kept
    steps.attach_callbacks(run)
    steps.evaluate_before(run)
    steps.fit(run)
    return RunResult(run_dir, steps.finish(run))


def train_stages(cfg: DictConfig, stages: list[tuple[str, DictConfig]], console: Console | None = None) -> RunResult:
    """Run a staged algo (e.g. sft_then_rl): each stage starts from the previous stage's
    weights. The outer run directory holds one folder per stage plus the combined
    ``metrics.jsonl`` (with ``stage`` and a continuous ``step``) and ``summary.json``."""
    if len(stages) == 1 and stages[0][1] is cfg:
        return train(cfg, console)
    console = console or Console(stderr=True)
    t0 = time.perf_counter()
    first_cfg = stages[0][1]
    first_cfg.seed = cfg.seed
    first_inputs = prepare_inputs(first_cfg, console)  # the first stage's data, reward and model, before any folder
    outer = prepare_run_dir(cfg)
    results, before, offset = [], None, 0
    combined = outer / "metrics.jsonl"
    for i, (name, scfg) in enumerate(stages):
        scfg.seed = cfg.seed
        scfg.run_dir = str(outer / f"stage{i + 1}-{name}")
        if results:
            scfg.model.path = results[-1].summary["model_dir"]
        console.print(f"[bold]stage {i + 1}/{len(stages)}: {name}[/] (algo={scfg.algo.name}, {scfg.trainer.max_steps} steps)")
        result = train(scfg, console, before=before, inputs=first_inputs if i == 0 else None)
        before = result.summary["eval_after"]
        with combined.open("a") as f, (result.run_dir / "metrics.jsonl").open() as rows:
            for line in rows:
                row = json.loads(line)
                row.update(stage=name, stage_step=row["step"], step=row["step"] + offset)
                f.write(json.dumps(row) + "\n")
        offset += result.summary["steps"]
        results.append(result)
    first, last = results[0].summary, results[-1].summary
    summary = {
        **last,
        "run_dir": str(outer),
        "algo": cfg.algo.name,
        "steps": sum(r.summary["steps"] for r in results),
        "rollouts": sum(r.summary["rollouts"] for r in results),
        "generated_tokens": sum(r.summary.get("generated_tokens") or 0 for r in results),
        "accuracy_before": first["accuracy_before"],
        "eval_before": first["eval_before"],
        "setup_seconds": round(sum(r.summary["setup_seconds"] for r in results), 2),
        "train_seconds": round(sum(r.summary["train_seconds"] for r in results), 2),
        "wall_seconds": round(time.perf_counter() - t0, 2),
        "cpu_seconds": round(sum(r.summary.get("cpu_seconds") or 0 for r in results), 2),
        "stages": [{"name": n, "run_dir": str(r.run_dir), "steps": r.summary["steps"], "accuracy_after": r.summary["accuracy_after"]} for (n, _), r in zip(stages, results)],
    }
    (outer / "summary.json").write_text(json.dumps(summary, indent=2))
    return RunResult(outer, summary)
