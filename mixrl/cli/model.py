"""``mixrl model build-tiny``: build (or reuse) the warm-started tiny model, on the built-in task
or on a user's own training rows."""

from __future__ import annotations

import json
import sys
from typing import List, Optional

import typer

from mixrl.cli.console import err, out
from mixrl.cli.errors import user_errors
from mixrl.errors import ConfigError
from mixrl.options import check_number

model_app = typer.Typer(help="Built-in model utilities.", no_args_is_help=True)


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

    check_number(steps, "--steps", low=1, integer=True)  # Typer's range lets NaN through: checked again, one line
    check_number(target_accuracy, "--target-accuracy", low=0, high=1)
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
