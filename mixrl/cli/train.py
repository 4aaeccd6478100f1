"""``mixrl train``: compose and check the jobs (a sweep, a resume, a rehearsal), then run them in
this process or through the launcher, and print the summary table of each run."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from mixrl.cli.console import OVERRIDES, err, out
from mixrl.cli.errors import exit_launched_worker, user_errors
from mixrl.cli.rehearse import _print_rehearsal, _rehearsal_job, _write_rehearsal
from mixrl.cli.resume import _resolve_resume_auto
from mixrl.config import hardware
from mixrl.errors import ConfigError


def _summary_table(summary: dict) -> Table:
    table = Table(title=f"mixrl {summary['algo']} (seed {summary['seed']})", show_lines=False)
    table.add_column("held-out metric")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    before, after = summary.get("eval_before", {}), summary.get("eval_after", {})
    for key in after:
        if key in ("n", "samples"):
            continue
        b, a = before.get(key), after.get(key)
        table.add_row(key, f"{b:.3f}" if b is not None else "-", f"[bold]{a:.3f}[/]" if a is not None else "-")
    final = summary.get("final_metrics", {})
    from mixrl.trainer.callbacks import engine_mismatch_text, reward_text  # deferred: trainer.callbacks imports transformers; `mixrl --help` never loads it

    table.caption = (
        f"{summary['steps']} steps, {summary['rollouts']} rollouts, {int(after.get('n') or 0)} held-out problems; "
        f"reward (last step) {reward_text(summary)}; wall-clock {summary['wall_seconds']:.0f}s "
        f"(setup {summary['setup_seconds']:.0f}s, train {summary['train_seconds']:.0f}s)"
    )

    engine = engine_mismatch_text(final)
    if engine is not None:
        table.caption += f"; vLLM vs trainer log-probs (last step): {engine}"
    return table


@user_errors
def train(
    overrides: Optional[List[str]] = OVERRIDES,
    multirun: bool = typer.Option(False, "-m", "--multirun", help="Sweep: one run per combination (seed=1,2,3)."),
    trust_run_code: bool = typer.Option(
        False, "--trust-run-code",
        help="With resume=RUN_DIR: run the code the run's config.yaml names (plugins, a reward file or module, "
             "model.trust_remote_code); without it such a run is refused.",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars (they show only on a terminal anyway)."),
    rehearse: bool = typer.Option(
        False, "--rehearse",
        help="Rehearse the config on this CPU machine: the built-in BPE model and teacher, the dataset's shipped schema "
             "sample, the CPU equivalent of the hardware, a few steps; everything else as configured. Prints what it swaps "
             "(also RUN_DIR/rehearsal.json).",
    ),
):
    """Train. With no overrides: GRPO on the built-in arithmetic task with the tiny model (CPU, minutes)."""
    from mixrl.config.compose import compose_stages  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it
    from mixrl.trainer import run as trainer_run  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it

    overrides = list(overrides or [])
    overrides = _resolve_resume_auto(overrides, multirun)
    jobs, cfgs, swaps = _compose_jobs(overrides, multirun, rehearse, trust_run_code)
    if quiet:
        for cfg in cfgs:
            cfg.logger.progress = False
    _check_jobs(cfgs, jobs, rehearsed=swaps is not None)
    if any(hardware.needs_launch(cfg) for cfg in cfgs):  # hardware asks for processes: start them through the launcher
        raise typer.Exit(_launch_all(cfgs, jobs, overrides, multirun, swaps, trust_run_code))
    if multirun:
        _name_multirun_dirs(cfgs, jobs, overrides)
    staged = [compose_stages(cfg, job) for cfg, job in zip(cfgs, jobs)]  # stages are checked up front too
    if swaps is not None:
        raise typer.Exit(_run_rehearsal(cfgs[0], staged[0], swaps, trainer_run))
    results = []
    for i, cfg in enumerate(cfgs):
        if multirun:
            err.print(f"[bold]job {i + 1}/{len(cfgs)}[/]: {' '.join(jobs[i])}")
        result = trainer_run.train_stages(cfg, staged[i], console=err)
        results.append(result)
        if int(os.environ.get("RANK", "0")) != 0:
            continue  # under torchrun only rank 0 reports
        out.print(_summary_table(result.summary))
        out.print(f"run directory: [bold]{result.run_dir}[/]")
    _close_process_group()
    if int(os.environ.get("RANK", "0")) != 0:
        exit_launched_worker(0)
        return
    if multirun:
        out.print(_multirun_table(jobs, results))
    exit_launched_worker(0)


def _compose_jobs(overrides: list[str], multirun: bool, rehearse: bool, trust_run_code: bool) -> tuple[list, list, list | None]:
    """``(jobs, cfgs, swaps)``: the jobs' override lists (one per sweep point), each job's composed and
    validated config (a resumed run's own config, with the overrides checked against it), and a
    rehearsal's swaps (None when not rehearsing). Every job is validated before any model loads."""
    from mixrl.config.compose import compose_config, expand_sweeps, parse_overrides  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it
    from mixrl.trainer.state.resume import resume_config  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it
    from mixrl.trainer.state.rundir import resume_checkpoint  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it

    jobs = expand_sweeps(overrides) if multirun else [overrides]
    resume = [ov.value() for ov in parse_overrides(list(overrides)) if ov.key_or_group == "resume"]
    swaps = None
    if rehearse:
        if multirun or (resume and resume[-1]):
            raise ConfigError("--rehearse rehearses one new run; drop " + ("-m (multirun)" if multirun else "resume="))
        jobs, swaps = _rehearsal_job(jobs[0])
    if resume and resume[-1]:  # the run's own config, with the overrides checked against it
        if multirun:
            raise ConfigError("resume=RUN_DIR continues one run; drop -m (multirun)")
        cfgs = [resume_config(str(resume[-1]), jobs[0], trust_run_code=trust_run_code)]
        resume_checkpoint(cfgs[0])  # something to continue from: checked before anything is written
    else:
        cfgs = [compose_config(job) for job in jobs]  # validate every job before loading any model
    return jobs, cfgs, swaps


def _check_jobs(cfgs: list, jobs: list, *, rehearsed: bool) -> None:
    """Before any model, data or run directory: each stage's completion fits its model's context
    (a warning; a rehearsal checked the real model before swapping in the tiny one), and this
    machine has what each run needs."""
    from mixrl.config.checks import check_environment  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it
    from mixrl.config.compose import compose_stages  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it
    from mixrl.config.context import check_context  # deferred: with compose_config

    for cfg, job in zip(cfgs, jobs):
        if not rehearsed:  # a rehearsal checked the real model's context before swapping in the tiny one
            for _, stage_cfg in compose_stages(cfg, job):
                checked = check_context(stage_cfg)  # the completion fits the model's context: before any model, data or run directory
                for role, pos in checked.too_short():
                    err.print(f"warning: {role}={pos.path} holds {pos.n} positions, fewer than the {checked.need} of a "
                              f"{checked.prompt}-token prompt budget + trainer.max_completion_length={checked.completion}",
                              highlight=False, soft_wrap=True)
        check_environment(cfg)  # what this machine lacks for it (the config itself is validated above)


def _launch_all(cfgs: list, jobs: list, overrides: list[str], multirun: bool, swaps: list | None, trust_run_code: bool) -> int:
    """The jobs through the launcher (the hardware asks for processes); its exit status. A rehearsal
    prints its swaps first and writes rehearsal.json whatever happens."""
    # the launched processes load the resumed run's config again: they need the user's consent too
    launched = [[*job, "--trust-run-code"] for job in jobs] if trust_run_code and cfgs[0].resume else jobs
    if swaps is None:
        return _launch_jobs(cfgs, launched, overrides, multirun)
    _print_rehearsal(swaps)
    try:
        return _launch_jobs(cfgs, launched, overrides, multirun)
    finally:
        _write_rehearsal(cfgs[0], swaps)


def _name_multirun_dirs(cfgs: list, jobs: list, overrides: list[str]) -> None:
    """Each sweep job's run directory: ``<run_dir>/<i>``, or ``runs/multirun/<date>/<time>/<i>-<its overrides>``."""
    root = Path("runs") / "multirun" / datetime.now().strftime("%Y-%m-%d/%H%M%S")
    for i, (job, cfg) in enumerate(zip(jobs, cfgs)):
        tag = "_".join(o.replace("/", "-").replace("=", "-") for o in job if o not in overrides) or "job"
        cfg.run_dir = str(Path(cfg.run_dir) / f"{i}" if cfg.run_dir else root / f"{i}-{tag}")
    err.print(f"multirun: {len(cfgs)} jobs")


def _multirun_table(jobs: list, results: list) -> Table:
    """One row per sweep job: its overrides, held-out accuracy before and after, its run directory."""
    table = Table(title="multirun")
    for col in ("job", "overrides", "acc before", "acc after", "run directory"):
        table.add_column(col)
    for i, r in enumerate(results):
        s = r.summary
        acc = [f"{a:.3f}" if isinstance(a, (int, float)) else "-" for a in (s.get("accuracy_before"), s.get("accuracy_after"))]
        table.add_row(str(i), " ".join(jobs[i]), *acc, str(r.run_dir))
    return table


def _run_rehearsal(cfg, staged, swaps: list, trainer_run) -> int:
    """One rehearsed run in this process: the table, the run, rehearsal.json, the summary."""
    _print_rehearsal(swaps)
    try:
        result = trainer_run.train_stages(cfg, staged, console=err)
    finally:
        if int(os.environ.get("RANK", "0")) == 0:
            _write_rehearsal(cfg, swaps)
    out.print(_summary_table(result.summary))
    out.print(f"run directory: [bold]{result.run_dir}[/]")
    _close_process_group()
    exit_launched_worker(0)
    return 0


def _close_process_group() -> None:
    """Under a launcher: every process waits until rank 0 has written the run, then the process
    group closes. (A gloo process left to the interpreter's exit while its peer still works
    may abort: seen with FSDP on CPU, 'terminate called without an active exception'.)"""
    import torch.distributed as dist  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _launch_jobs(cfgs, jobs, overrides, multirun: bool) -> int:
    """Each job through :func:`mixrl.launch.launch` (one after another); the first failure stops."""
    from mixrl import launch  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it

    for i, (cfg, job) in enumerate(zip(cfgs, jobs)):
        if multirun:
            tag = "_".join(o.replace("/", "-").replace("=", "-") for o in job if o not in overrides) or "job"
            root = Path("runs") / "multirun" / datetime.now().strftime("%Y-%m-%d/%H%M%S")
            cfg.run_dir = str(Path(cfg.run_dir) / f"{i}" if cfg.run_dir else root / f"{i}-{tag}")
            job = [o for o in job if not o.startswith("run_dir=")] + [f"run_dir={cfg.run_dir}"]
            err.print(f"[bold]job {i + 1}/{len(cfgs)}[/]: {' '.join(jobs[i])}")
        rc = launch.launch(cfg, list(job), say=lambda text: err.print(text, soft_wrap=True, highlight=False, markup=False))
        if rc != 0:
            err.print(f"[red]the launched run failed (exit status {rc})[/]")
            return rc
    return 0
