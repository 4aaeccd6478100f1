"""One training run: run directory, held-out accuracy before/after, train, save, summary.

Run directory layout::

    config.yaml      the resolved config
    metrics.jsonl    one row per logged step
    model/           final model and tokenizer (Hugging Face format)
    summary.json     accuracy before/after, wall-clock, steps, paths
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from mixrl.config.rules import geometry


@dataclass
class RunResult:
    run_dir: Path
    summary: dict = field(default_factory=dict)


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def default_run_dir(cfg: DictConfig, root: str | Path = "runs") -> Path:
    """``runs/<date>/<time>-<algo>-s<seed>``; under torchrun every rank derives the same
    name from the launcher's run id, so all processes share one directory."""
    now = datetime.now()
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    stamp = f"{now.strftime('%H%M')}-{run_id[:8]}" if run_id and int(os.environ.get("WORLD_SIZE", "1")) > 1 else now.strftime("%H%M%S-%f")[:-3]
    return Path(root) / now.strftime("%Y-%m-%d") / f"{stamp}-{cfg.algo.name}-s{cfg.seed}"


def prepare_run_dir(cfg: DictConfig) -> Path:
    """Create the run directory and write config.yaml (rank 0 only; other ranks share it)."""
    run_dir = Path(cfg.run_dir) if cfg.run_dir else default_run_dir(cfg)
    cfg.run_dir = str(run_dir)
    if _rank() != 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        return run_dir
    if run_dir.exists() and any(run_dir.iterdir()):
        from mixrl.errors import ConfigError

        raise ConfigError(f"run_dir '{run_dir}' already exists and is not empty; choose another run_dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    return run_dir


def quiet_libraries() -> None:
    """mixrl draws its own progress bars: silence the libraries' bars and deprecation noise."""
    import warnings

    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\..*")
    warnings.filterwarnings("ignore", message=r".*gradient_checkpointing.*")


def _set_threads(cfg: DictConfig) -> None:
    import torch

    if cfg.hardware.torch_threads:
        torch.set_num_threads(int(cfg.hardware.torch_threads))


def _eval(trainer, tokenizer, rows, reward_fn, cfg, console: Console, label: str) -> dict:
    from mixrl.trainer.evaluate import evaluate_accuracy

    if not rows:
        return {}
    show = cfg.logger.progress and trainer.accelerator.is_main_process
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    import torch

    # sampled pass@k must not move the training RNG: evaluate in a forked, seeded stream
    with torch.random.fork_rng(devices=[]), Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, disable=not show, transient=True) as prog:
        torch.manual_seed(int(cfg.seed) + 7919)
        task = prog.add_task(label, total=len(rows))
        return evaluate_accuracy(
            trainer.model, tokenizer, rows, reward_fn, max_new_tokens=int(cfg.trainer.max_completion_length),
            batch_size=int(cfg.trainer.eval_batch_size), pass_k=int(cfg.trainer.eval_pass_k),
            temperature=float(cfg.trainer.temperature), progress=lambda n: prog.advance(task, n),
        )


def train(cfg: DictConfig, console: Console | None = None, *, before: dict | None = None) -> RunResult:
    """Train one config end to end; returns the run directory and summary. ``before``:
    held-out results already measured for the starting model (skips that evaluation)."""
    from transformers import set_seed

    from mixrl.trainer import build
    from mixrl.trainer.callbacks import MetricsJsonlCallback, RichProgressCallback

    console = console or Console(stderr=True)
    quiet_libraries()
    t0 = time.perf_counter()
    geom = geometry(cfg)
    run_dir = prepare_run_dir(cfg)
    _set_threads(cfg)
    set_seed(int(cfg.seed))
    model_path = build.resolve_model_path(cfg, progress=cfg.logger.progress)
    tokenizer = build.load_tokenizer(model_path, cfg)
    train_ds = build.load_train_rows(cfg)
    eval_rows = build.load_eval_rows(cfg)
    reward_funcs, reward_weights = build.build_reward_funcs(cfg)
    metrics_cb = MetricsJsonlCallback(run_dir / "metrics.jsonl")
    callbacks = [metrics_cb]
    if cfg.logger.progress:
        callbacks.append(RichProgressCallback(console, description=f"{cfg.algo.name} s{cfg.seed}"))
    if cfg.trainer.eval_every > 0:  # held-out accuracy every N steps -> eval.jsonl (the lambda: trainer is built below)
        from mixrl.trainer.periodic_eval import PeriodicEvalCallback
        callbacks.append(PeriodicEvalCallback.from_config(cfg, run_dir, tokenizer, eval_rows, reward_funcs[0], trainer=lambda: trainer))
    trainer = build.build_trainer(
        cfg, model_path=model_path, tokenizer=tokenizer, train_ds=train_ds, reward_funcs=reward_funcs,
        reward_weights=reward_weights, run_dir=run_dir, callbacks=callbacks, geom=geom,
    )
    setup_s = time.perf_counter() - t0

    if before is None:
        before = _eval(trainer, tokenizer, eval_rows, reward_funcs[0], cfg, console, "held-out eval (before)")
    t1 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t1
    after = _eval(trainer, tokenizer, eval_rows, reward_funcs[0], cfg, console, "held-out eval (after)")

    model_dir = run_dir / "model"
    if trainer.accelerator.is_main_process:
        trainer.save_model(str(model_dir))
        tokenizer.save_pretrained(str(model_dir))
    summary = {
        "run_dir": str(run_dir),
        "algo": cfg.algo.name,
        "recipe": cfg.recipe_info.name,
        "seed": int(cfg.seed),
        "steps": int(trainer.state.global_step),
        "geometry": geom.describe(),
        "rollouts": trainer.mixrl_rollouts,  # on-policy rollouts trained on (expert rows excluded)
        "accuracy_before": before.get("accuracy"),
        "accuracy_after": after.get("accuracy"),
        "eval_before": before,
        "eval_after": after,
        "final_metrics": metrics_cb.rows[-1] if metrics_cb.rows else {},
        "setup_seconds": round(setup_s, 2),
        "train_seconds": round(train_s, 2),
        "wall_seconds": round(time.perf_counter() - t0, 2),
        "model_dir": str(model_dir),
        "machine": f"{platform.machine()} {os.cpu_count()} cpu",
    }
    if trainer.accelerator.is_main_process:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return RunResult(run_dir, summary)


def train_stages(cfg: DictConfig, stages: list[tuple[str, DictConfig]], console: Console | None = None) -> RunResult:
    """Run a staged algo (e.g. sft_then_rl): each stage starts from the previous stage's
    weights. The outer run directory holds one folder per stage plus the combined
    ``metrics.jsonl`` (with ``stage`` and a continuous ``step``) and ``summary.json``."""
    if len(stages) == 1 and stages[0][1] is cfg:
        return train(cfg, console)
    console = console or Console(stderr=True)
    t0 = time.perf_counter()
    outer = prepare_run_dir(cfg)
    results, before, offset = [], None, 0
    combined = outer / "metrics.jsonl"
    for i, (name, scfg) in enumerate(stages):
        scfg.seed = cfg.seed
        scfg.run_dir = str(outer / f"stage{i + 1}-{name}")
        if results:
            scfg.model.path = results[-1].summary["model_dir"]
        console.print(f"[bold]stage {i + 1}/{len(stages)}: {name}[/] (algo={scfg.algo.name}, {scfg.trainer.max_steps} steps)")
        result = train(scfg, console, before=before)
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
        "accuracy_before": first["accuracy_before"],
        "eval_before": first["eval_before"],
        "setup_seconds": round(sum(r.summary["setup_seconds"] for r in results), 2),
        "train_seconds": round(sum(r.summary["train_seconds"] for r in results), 2),
        "wall_seconds": round(time.perf_counter() - t0, 2),
        "stages": [{"name": n, "run_dir": str(r.run_dir), "steps": r.summary["steps"], "accuracy_after": r.summary["accuracy_after"]} for (n, _), r in zip(stages, results)],
    }
    (outer / "summary.json").write_text(json.dumps(summary, indent=2))
    return RunResult(outer, summary)
