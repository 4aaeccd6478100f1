"""The ``mixrl`` command line (Typer). Every command takes Hydra-style overrides."""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from mixrl.cli.errors import exit_launched_worker, freeze_at_exit, user_errors
from mixrl.config import hardware
from mixrl.config.recipe_index import group_options, list_recipe_names, recipe_summary, recipes_dir
from mixrl.config.schema import GROUPS
from mixrl.errors import ConfigError
from mixrl.progress import progress_bar

# Everything that imports torch, transformers, Hydra or TRL is imported inside the command that
# needs it (`# deferred:`): `mixrl --help` and `mixrl recipes list` answer in well under two
# seconds (tests/test_recipes_list.py checks that their path never imports torch).

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

freeze_at_exit()  # the process's last garbage collection skips the run's objects (mixrl.cli.errors)

app = typer.Typer(
    help="mixrl: train language models with on-policy RL mixed with off-policy data, declared in config.\n\n"
    "Overrides use Hydra syntax: group=option (algo=chord), key=value (trainer.max_steps=20), recipe=NAME.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Inspect the composed configuration.", no_args_is_help=True)
recipes_app = typer.Typer(help="Shipped recipes: paper methods as config overlays.", no_args_is_help=True)
model_app = typer.Typer(help="Built-in model utilities.", no_args_is_help=True)
docs_app = typer.Typer(help="Generated reference documentation.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(recipes_app, name="recipes")
app.add_typer(model_app, name="model")
app.add_typer(docs_app, name="docs")

out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)

OVERRIDES = typer.Argument(None, help="Hydra overrides, e.g. algo=chord trainer.max_steps=20 recipe=grpo/arith-tiny")


# --------------------------------------------------------------------------- train
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
    reward = final.get("reward_mean")
    reward_text = f"{reward:.3f}" if isinstance(reward, (int, float)) else "none (no rollout was scored)"
    table.caption = (
        f"{summary['steps']} steps, {summary['rollouts']} rollouts, {int(after.get('n') or 0)} held-out problems; "
        f"reward (last step) {reward_text}; wall-clock {summary['wall_seconds']:.0f}s "
        f"(setup {summary['setup_seconds']:.0f}s, train {summary['train_seconds']:.0f}s)"
    )
    from mixrl.trainer.callbacks import engine_mismatch_text  # deferred: trainer.callbacks imports transformers; `mixrl --help` never loads it

    engine = engine_mismatch_text(final)
    if engine is not None:
        table.caption += f"; vLLM vs trainer log-probs (last step): {engine}"
    return table


@app.command()
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
    from mixrl.config.checks import check_environment  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it
    from mixrl.config.compose import compose_config, compose_stages, expand_sweeps, parse_overrides  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it
    from mixrl.trainer import run as trainer_run  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it
    from mixrl.trainer.state.resume import resume_config  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it
    from mixrl.trainer.state.rundir import resume_checkpoint  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it

    overrides = list(overrides or [])
    overrides = _resolve_resume_auto(overrides, multirun)
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
    if quiet:
        for cfg in cfgs:
            cfg.logger.progress = False
    for cfg in cfgs:
        check_environment(cfg)  # what this machine lacks for it (the config itself is validated above)
    if any(hardware.needs_launch(cfg) for cfg in cfgs):  # hardware asks for processes: start them through the launcher
        # the launched processes load the resumed run's config again: they need the user's consent too
        launched = [[*job, "--trust-run-code"] for job in jobs] if trust_run_code and cfgs[0].resume else jobs
        if swaps is not None:
            _print_rehearsal(swaps)
            try:
                rc = _launch_jobs(cfgs, launched, overrides, multirun)
            finally:
                _write_rehearsal(cfgs[0], swaps)
            raise typer.Exit(rc)
        raise typer.Exit(_launch_jobs(cfgs, launched, overrides, multirun))
    if multirun:
        root = Path("runs") / "multirun" / datetime.now().strftime("%Y-%m-%d/%H%M%S")
        for i, (job, cfg) in enumerate(zip(jobs, cfgs)):
            tag = "_".join(o.replace("/", "-").replace("=", "-") for o in job if o not in overrides) or "job"
            cfg.run_dir = str(Path(cfg.run_dir) / f"{i}" if cfg.run_dir else root / f"{i}-{tag}")
        err.print(f"multirun: {len(cfgs)} jobs")
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
        table = Table(title="multirun")
        for col in ("job", "overrides", "acc before", "acc after", "run directory"):
            table.add_column(col)
        for i, r in enumerate(results):
            s = r.summary
            acc = [f"{a:.3f}" if isinstance(a, (int, float)) else "-" for a in (s.get("accuracy_before"), s.get("accuracy_after"))]
            table.add_row(str(i), " ".join(jobs[i]), *acc, str(r.run_dir))
        out.print(table)
    exit_launched_worker(0)


def _rehearsal_job(job: list[str]) -> tuple[list[list[str]], list]:
    """``--rehearse``: the job with the rehearsal's swaps appended (mixrl.config.rehearsal), and
    the swaps. The run directory is fixed here so that rehearsal.json lands in it."""
    from mixrl.config import rehearsal  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it
    from mixrl.config.compose import compose_config  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it
    from mixrl.trainer.state.rundir import default_run_dir  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it

    job = [f"recipe={o}" if "=" not in o and o in list_recipe_names() else o for o in job]
    cfg = compose_config(job)
    swaps = rehearsal.plan_rehearsal(cfg)
    job = [*job, *rehearsal.overrides(swaps)]
    if not cfg.run_dir:
        job.append(f"run_dir={default_run_dir(cfg)}")
    return [job], swaps


def _print_rehearsal(swaps: list) -> None:
    from mixrl.config import rehearsal  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it

    out.print(rehearsal.table(swaps))


def _write_rehearsal(cfg, swaps: list) -> None:
    """RUN_DIR/rehearsal.json: the swaps, once the run directory exists (also after a failed run)."""
    run_dir = Path(str(cfg.run_dir))
    if run_dir.is_dir():
        (run_dir / "rehearsal.json").write_text(json.dumps({"swaps": [s.row() for s in swaps]}, indent=2, default=str) + "\n")


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


def _resolve_resume_auto(overrides: list[str], multirun: bool) -> list[str]:
    """``resume=auto run_dir=PATH``: the command a requeued job runs again. With a complete checkpoint
    in PATH (:func:`mixrl.trainer.state.rundir.last_checkpoint`) it becomes ``resume=PATH`` (the
    other overrides are checked against the run's config as for any resume); with none, a new run
    into PATH, refused as any new run is when PATH holds something else (one line, exit 2)."""
    from mixrl.config.compose import parse_overrides  # deferred: imports torch; `mixrl --help` must not load it
    from mixrl.trainer.state.rundir import check_new_run_dir, last_checkpoint  # deferred: imports torch

    parsed = parse_overrides(list(overrides))
    resume = [ov.value() for ov in parsed if ov.key_or_group == "resume"]
    if not resume or resume[-1] != "auto":
        return overrides
    if multirun:
        raise ConfigError("resume=auto continues one run; drop -m (multirun)")
    run_dirs = [ov.value() for ov in parsed if ov.key_or_group == "run_dir"]
    if not run_dirs or not run_dirs[-1]:
        raise ConfigError("resume=auto needs run_dir=PATH: the run directory to continue if it holds a checkpoint, "
                          "or to start in if it is new")
    run_dir = Path(str(run_dirs[-1]))
    kept = [o for o, ov in zip(overrides, parsed) if ov.key_or_group != "resume"]
    if last_checkpoint(run_dir) is not None:
        err.print(f"resume=auto: continuing {run_dir} from its newest complete checkpoint", highlight=False, soft_wrap=True)
        return [*kept, f"resume={run_dir}"]
    ranks = [ov.value() for ov in parsed if ov.key_or_group == "hardware.machine_rank"]
    if ranks and str(ranks[-1]) != "0":
        return kept  # machine R>0 of a multi-node run joins the directory machine 0 checks (and may have created already)
    try:
        check_new_run_dir(run_dir, say=lambda text: None)
    except ConfigError as e:
        raise ConfigError(f"resume=auto: {run_dir} holds no complete checkpoint to continue from, and a new run cannot "
                          f"start there: {e}") from None
    if run_dir.is_dir() and any(p.name not in ("launch", ".mixrl.lock") for p in run_dir.iterdir()):
        err.print(f"resume=auto: {run_dir} holds no complete checkpoint; starting it again", highlight=False, soft_wrap=True)
    return kept


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


# --------------------------------------------------------------------------- plan
@app.command()
@user_errors
def plan(
    overrides: Optional[List[str]] = OVERRIDES,
    prompt_tokens: Optional[int] = typer.Option(None, "--prompt-tokens", help="Prompt length assumed by the memory estimate (tokens; default 512, the built-in task's longest prompt for builtin:arith)."),
    sbatch: Optional[Path] = typer.Option(None, "--sbatch", help="Also write a SLURM job script for this config to this file: "
                                          "hardware.num_machines nodes, one `mixrl train` per node, requeued on preemption "
                                          "(needs run_dir=PATH on a shared file system; see mixrl/slurm.py)."),
):
    """Geometry, per-GPU memory estimate and launch command of a config, without loading the model.

    `mixrl plan recipe=chord/qwen2.5-7b-openr1` (a bare recipe name works too). The estimate
    (weights, gradients, optimizer state per ZeRO stage / FSDP, activations per micro-batch,
    vLLM share) is explained in mixrl/plan.py."""
    from mixrl.config.compose import compose_config  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it
    from mixrl.planning.render import render_plan  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it

    overrides = [f"recipe={o}" if "=" not in o and o in list_recipe_names() else o for o in (overrides or [])]
    composed = overrides
    if sbatch is not None and not any(o.startswith("hardware.main_process_ip=") for o in overrides):
        composed = [*overrides, "hardware.main_process_ip=slurm-first-node"]  # the job reads it from SLURM on each node
    cfg = compose_config(composed)
    if sbatch is not None:
        from mixrl.slurm import sbatch_script  # deferred: keeps `mixrl --help` light

        text = sbatch_script(cfg, overrides)  # checked (run_dir) before anything is written
        sbatch.write_text(text)
        sbatch.chmod(0o755)
        err.print(f"wrote {sbatch}: sbatch {sbatch}", highlight=False, soft_wrap=True)
    sys.stdout.write(render_plan(cfg, overrides, prompt_tokens=prompt_tokens))


# --------------------------------------------------------------------------- config
@config_app.command("show")
@user_errors
def config_show(overrides: Optional[List[str]] = OVERRIDES):
    """Print the fully resolved config as YAML."""
    from mixrl.config.compose import compose_config, to_yaml  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it
    from mixrl.config.sampler import without_inactive_sampler  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it
    from mixrl.benchmarks.paper import without_unset  # deferred: keeps `mixrl --help` light

    # sampler=none is left out, and a recipe's unset paper table: configs print as before those keys existed
    sys.stdout.write(to_yaml(without_unset(without_inactive_sampler(compose_config(list(overrides or []))))))


@config_app.command("groups")
@user_errors
def config_groups():
    """List the config groups and their options."""
    table = Table(title="config groups")
    table.add_column("group")
    table.add_column("options")
    for g in GROUPS:
        table.add_row(g, ", ".join(group_options(g)))
    out.print(table)


# --------------------------------------------------------------------------- recipes
def _recipe_row(name: str) -> dict:
    """A recipe's table row (its files only) plus its composed config and overlay text."""
    from mixrl.config.compose import compose_config  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it

    return {**recipe_summary(name), "cfg": compose_config([f"recipe={name}"])}


def _recipe_path(name: str) -> Path:
    return recipes_dir() / f"{name}.yaml"


@recipes_app.command("list")
@user_errors
def recipes_list():
    """Table of shipped recipes: name, paper, model, data, hardware it needs."""
    table = Table(title="mixrl recipes (mixrl train recipe=NAME)")
    table.add_column("name", no_wrap=True)  # a name is what the user types: never cut
    for col in ("paper", "algo", "model", "data", "hardware"):
        table.add_column(col, overflow="fold")  # hub ids wrap whole, never cut with an ellipsis
    for name in list_recipe_names():
        r = recipe_summary(name)  # the YAML files only: no composition, no torch
        table.add_row(r["name"], r["paper"], r["algo"], r["model"], r["data"], r["hardware"])
    out.print(table)


@recipes_app.command("show")
@user_errors
def recipes_show(name: str = typer.Argument(..., help="Recipe name, e.g. grpo/arith-tiny")):
    """Print one recipe: its overlay file and what it resolves to."""
    from mixrl.config.compose import load_recipe  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it
    from mixrl.config.geometry import geometry  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it

    load_recipe(name)  # clear error for an unknown name
    r = _recipe_row(name)
    out.print(f"[bold]{name}[/] — {r['paper']}: {r['description']}")
    out.print(f"model {r['model']} | data {r['data']} | hardware {r['hardware']}")
    out.print(f"batch: {geometry(r['cfg']).describe()}")
    out.print(f"\n# {_recipe_path(name)}")
    sys.stdout.write(_recipe_path(name).read_text())


# --------------------------------------------------------------------------- model
@model_app.command("build-tiny")
@user_errors
def model_build_tiny(overrides: Optional[List[str]] = typer.Argument(
                         None, help="Hydra overrides naming your data, e.g. data.source=examples/caesar "
                                    "data.prompt_column=question: warm-start the tiny model on its training rows."),
                     force: bool = typer.Option(False, "--force", help="Rebuild even if cached."),
                     bpe: bool = typer.Option(False, "--bpe", help="Build the BPE chat model (model=tiny-bpe) instead."),
                     steps: Optional[int] = typer.Option(None, "--steps", min=1, help="Warm-start steps (default: the recipe's; with data.source, the most it runs)."),
                     target_accuracy: Optional[float] = typer.Option(
                         None, "--target-accuracy", min=0.0, max=1.0,
                         help="With data.source: stop the warm start once this fraction of the training rows is answered "
                              "exactly (greedy), checked every 10 steps; 1 runs every step (default 0.5: RL keeps something to learn)."),
                     quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar.")):
    """Build (or reuse) the warm-started tiny model and print its cache directory. With data.source=...:
    warm-start it on your own training rows (held-out rows excluded, by the rule `mixrl train` uses)."""
    from mixrl.models import tiny, tiny_bpe  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it

    overrides = list(overrides or [])
    if overrides:
        if bpe:
            raise ConfigError("--bpe builds the BPE chat model on arithmetic; it takes no overrides")
        from mixrl.config.compose import compose_config  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it

        cfg = compose_config(overrides)  # validated: a bad key or value exits 2 before anything is read
        if not str(cfg.data.source).startswith("builtin:"):
            progress = not quiet and sys.stderr.isatty()  # no bar in a log file or a pipe
            _build_tiny_on_data(cfg, overrides, force=force, steps=steps, progress=progress, target_accuracy=target_accuracy)
            return
    if target_accuracy is not None:
        raise ConfigError("--target-accuracy applies to a warm start on your data; add data.source=FILE (or drop it)")
    kwargs = {"force": force, "progress": not quiet, **({"steps": steps} if steps else {})}
    if bpe:
        path = tiny_bpe.warm_start(**kwargs)
        out.print(f"tiny BPE model: [bold]{path}[/]")
        return
    path = tiny.warm_start(**kwargs)
    out.print(f"tiny model: [bold]{path}[/]")


def _build_tiny_on_data(cfg, overrides: list[str], *, force: bool, steps: Optional[int], progress: bool,
                        target_accuracy: Optional[float] = None) -> None:
    """Warm-start the tiny model on ``cfg``'s training rows; print the folder and the override to train it."""
    from mixrl.models import tiny_data  # deferred: tiny_data imports the tiny model's builders (transformers); `mixrl --help` never loads it
    from mixrl.trainer import run as trainer_run  # deferred: imports torch; `mixrl --help` never loads it
    from mixrl.trainer.build import describe_heldout, heldout_rows  # deferred: trainer.build imports TRL; `mixrl --help` never loads it

    trainer_run.quiet_libraries()
    train_ds, _eval_rows, info = heldout_rows(cfg)  # the rows `mixrl train` would train on: held-out rows excluded
    err.print(describe_heldout(info), soft_wrap=True, highlight=False)
    path, built = tiny_data.warm_start_on_rows(
        [dict(r) for r in train_ds], source=str(cfg.data.source), steps=steps,
        max_completion_length=int(cfg.trainer.max_completion_length), force=force, progress=progress,
        target_accuracy=target_accuracy,
    )
    meta = json.loads((path / tiny_data.META_FILE).read_text())
    ws, ran = meta["warm_start"], meta.get("steps_run", meta["warm_start"]["steps"])
    goal = ws.get("target_accuracy", 1.0)
    why = (f"stopped at the target training accuracy {goal:g}" if ran < ws["steps"]
           else "every step run" + (f", target training accuracy {goal:g} not reached" if goal < 1 else ""))
    how = (f"{ran} of at most {ws['steps']} steps on {meta['data']['rows']} rows ({meta['data']['target']}), {why}; "
           f"training accuracy {meta.get('training_accuracy', float('nan')):.3f} (exact, greedy, on {meta.get('accuracy_rows', '?')} "
           f"training rows), final loss {meta['final_loss']:.3f}, {meta['train_seconds']:.0f}s")
    out.print(f"tiny model warm-started on your data: {path}" + ("" if built else " (cached; --force rebuilds)"),
              soft_wrap=True, highlight=False)
    out.print(how, soft_wrap=True, highlight=False)
    rest = " ".join(o for o in overrides if not o.startswith("model.path="))
    out.print(f"next: mixrl train model.path={path} {rest}", soft_wrap=True, highlight=False)


from mixrl.cli.explain import explain  # noqa: E402
app.command()(explain)
from mixrl.cli.compare import compare, eval_model, rejudge  # noqa: E402
app.command("compare")(compare)
app.command("rejudge")(rejudge)
from mixrl.cli.samples import samples  # noqa: E402
app.command("samples")(samples)
app.command("eval")(eval_model)


@app.command("reproduce")
@user_errors
def reproduce(
    suite: str = typer.Argument(..., help="A suite of conf/suites/ (toy, hard) or a path to a suite .yaml."),
    overrides: Optional[List[str]] = typer.Argument(None, help="Overrides applied to every run, after the suite's, e.g. trainer.max_steps=30"),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Where the runs, table, plots and README go (default: a new runs/reproduce/SUITE-<time>/)."),
    seeds: Optional[int] = typer.Option(None, "--seeds", help="Seeds per method (0..N-1); default: the suite's."),
    jobs: Optional[int] = typer.Option(None, "--jobs", help="Training processes at a time (one torch thread each when > 1); default: the suite's."),
    plots: bool = typer.Option(True, "--plots/--no-plots", help="Write PNG plots (needs matplotlib)."),
    only: Optional[str] = typer.Option(None, "--only", help="Comma-separated method labels to run (a smoke run), e.g. grpo,luffy-authors."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars (they show only on a terminal anyway)."),
):
    """Run a suite: its recipes x seeds at the suite's budget, then compare them (table, plots,
    claims judged over seeds) and write a README with the command, commit and machine."""
    from mixrl.experiments import reproduce as experiments_reproduce  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it
    from mixrl.experiments.suites import load_suite  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it

    s = load_suite(suite)
    if seeds is not None and seeds < 1:
        raise ConfigError("--seeds must be >= 1 (use --seeds N with N >= 1)")
    out_dir = out_dir or experiments_reproduce.default_out_dir(s.name)
    experiments_reproduce.check_out_dir(out_dir)  # a folder of the user's own (its README.md, compare.md) is refused before any run
    err.print(f"writing to [bold]{out_dir}[/]")
    result = experiments_reproduce.reproduce_suite(s, out_dir, seeds=seeds, jobs=jobs, extra=list(overrides or []), log=err.print, plots=plots,
                             only=[x.strip() for x in only.split(",") if x.strip()] if only else (),
                             progress=progress_bar(err, quiet=quiet))
    out.print(Path(result["compare"]).read_text())
    out.print(f"written: [bold]{out_dir}[/] (README.md, compare.md, plots, runs/)")


@docs_app.command("components")
@user_errors
def docs_components(
    out_path: Path = typer.Option(Path("docs/components.md"), "--out", help="Where to write the page ('-' for stdout)."),
):
    """Regenerate the reference page of every registered component from the code."""
    from mixrl.sources.docs import render_components_markdown  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it

    _write_page(render_components_markdown(), out_path)


def _write_page(text: str, out_path: Path) -> None:
    """Write a generated docs page (``-``: standard output)."""
    if str(out_path) == "-":
        sys.stdout.write(text)
        return
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(text)
    out.print(f"wrote {out_path}")


@docs_app.command("methods")
@user_errors
def docs_methods(
    out_path: Path = typer.Option(Path("docs/methods.md"), "--out", help="Where to write the page ('-' for stdout)."),
    results: Path = typer.Option(Path("docs/results"), "--results", help="Folder of suite results (<suite>/compare.json)."),
):
    """Regenerate docs/methods.md: every shipped method, its recipes, paper, claims and latest verdicts."""
    from mixrl.experiments.methods import render_methods  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it

    _write_page(render_methods(results), out_path)


@docs_app.command("peers")
@user_errors
def docs_peers(
    out_path: Path = typer.Option(Path("docs/peers.md"), "--out", help="Where to write the page ('-' for stdout)."),
    data: Path = typer.Option(Path("docs/peers.yaml"), "--data", help="The table's data: every peer option, its overrides, status and tests."),
):
    """Regenerate docs/peers.md from docs/peers.yaml: every verl, TRL, Trinity-RFT and LUFFY option, its mixrl overrides and how far they agree."""
    from mixrl.experiments.peers import load_peers, render_peers  # deferred: `mixrl --help` must stay fast

    if not data.is_file():
        raise ConfigError(f"--data {data}: no such file; run from the repository root or pass --data path/to/peers.yaml")
    try:
        table = load_peers(data)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    _write_page(render_peers(table), out_path)


from mixrl.cli.reference import docs_site  # noqa: E402
docs_app.command("site")(docs_site)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
