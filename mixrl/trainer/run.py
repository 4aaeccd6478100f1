"""One training run: held-out accuracy before/after, train, save, summary; a staged run's stages.

The run directory (its layout, lock, saved config, the refusal of one in use, the FAILED
marker) is :mod:`mixrl.trainer.state.rundir`'s; the inputs and the trainer are assembled by
:mod:`mixrl.trainer.build` (:func:`~mixrl.trainer.build.prepare_inputs`,
:func:`~mixrl.trainer.build.trainer_from_config`).
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
import warnings

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
import torch

from mixrl.config.geometry import geometry
from mixrl.progress import progress_bar
from mixrl.errors import (PREEMPTED_EXIT, MixrlUserError, RewardError, RunInterrupted, RunPreempted, TrainingDiverged, UserFunctionError,
                          storage_error)
from mixrl.trainer import build
from mixrl.trainer.build import RunInputs, prepare_inputs
from mixrl.trainer.magnitude import MagnitudeExceeded
from mixrl.trainer.sample_log import SAMPLES_FILE
from mixrl.trainer.state.resume import load_run_state
from mixrl.trainer.state.rundir import (
    EVAL_BEFORE,
    LOCK_FILE,
    MERGED_DIR,
    RunDirLock,
    checkpoint_step,
    last_checkpoint,
    last_checkpoint_note,
    mark_failed,
    prepare_run_dir,
    refuse_occupied,
    resume_checkpoint,
    truncate_jsonl,
)
from mixrl.evaluation import cache as eval_cache
from mixrl.evaluation.accuracy import EvaluationInterrupted, evaluate_accuracy
from mixrl.evaluation.acting import acting_generator
from mixrl.models import tiny_bpe
from mixrl.rewards.components import heldout_reward
from mixrl.rewards.deadline import RewardInterrupted, RewardTooSlow


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


def _eval(trainer, tokenizer, rows, reward_fn, cfg, console: Console, label: str, examples: list | None = None,
          stop=None) -> dict:
    """Held-out results of the trainer's model; ``stop`` (the interrupt guard's
    ``stop_requested``) ends it within a batch with :class:`EvaluationInterrupted`."""
    if not rows:
        return {}
    show = cfg.logger.progress and trainer.accelerator.is_main_process
    # sampled pass@k must not move the training RNG: evaluate in a forked, seeded stream
    with torch.random.fork_rng(devices=[]), progress_bar(console, quiet=not show, transient=True) as prog:
        torch.manual_seed(int(cfg.seed) + 7919)
        task = prog.add_task(label, total=len(rows))
        return evaluate_accuracy(
            trainer.model, tokenizer, rows, reward_fn, max_new_tokens=int(cfg.trainer.max_completion_length),
            batch_size=int(cfg.trainer.eval_batch_size), pass_k=int(cfg.trainer.eval_pass_k),
            samples=int(cfg.trainer.eval_samples), ks=[int(k) for k in cfg.trainer.eval_pass_at], temperature=float(cfg.trainer.temperature), progress=lambda n: prog.advance(task, n),
            examples=examples, stop=stop, generate=acting_generator(cfg.get("env")),
        )


def _eval_start(trainer, tokenizer, rows, reward_fn, cfg, console: Console, model_path: str, stop=None) -> dict:
    """The starting model's held-out results; with ``trainer.eval_before_cache`` they are read
    from (or stored into) that cache (:mod:`mixrl.evaluation.cache`). The evaluation runs in a
    forked RNG, so skipping it leaves training unchanged."""
    cache_dir = cfg.trainer.get("eval_before_cache")
    if not cache_dir or not rows:
        return _eval(trainer, tokenizer, rows, reward_fn, cfg, console, "held-out eval (before)", stop=stop)
    key = eval_cache.cache_key(cfg, model_path, rows)
    cached = eval_cache.load(cache_dir, key)
    if cached is not None:
        console.print(f"held-out eval (before): reused {cache_dir}/{key}.json", highlight=False, soft_wrap=True)
        return cached
    result = _eval(trainer, tokenizer, rows, reward_fn, cfg, console, "held-out eval (before)", stop=stop)
    if trainer.accelerator.is_main_process:
        eval_cache.store(cache_dir, key, result)
    return result


#: written under RUN_DIR/launch/ by a launched run's first process on each machine when a preemption
#: signal stopped it after a checkpoint: that machine's launcher then exits with PREEMPTED_EXIT too
#: (torchrun itself reports any failed process as 1)
PREEMPTED_MARKER = "preempted-node{machine}"


def stopped_error(guard, cfg, run_dir: Path, message: str, *, saved: bool) -> RunInterrupted:
    """The error a signalled run ends with: :class:`RunPreempted` (exit status
    :data:`~mixrl.errors.PREEMPTED_EXIT`, requeue) for SIGTERM / SIGUSR1 once a checkpoint is saved,
    :class:`RunInterrupted` (130) otherwise. A preempted launched process leaves
    :data:`PREEMPTED_MARKER` for its machine's launcher."""
    if not (saved and guard.preempted):
        return RunInterrupted(message)
    launch_dir = Path(run_dir) / "launch"
    if launch_dir.is_dir() and int(os.environ.get("LOCAL_RANK", "0")) == 0 and "WORLD_SIZE" in os.environ:
        marker = launch_dir / PREEMPTED_MARKER.format(machine=int(cfg.hardware.machine_rank))
        try:
            marker.write_text(message + "\n")
        except OSError:
            pass
    return RunPreempted(f"{message} (exit status {PREEMPTED_EXIT}: preempted; the same command with resume=auto continues it)")


def _barrier() -> None:
    import torch.distributed as dist  # deferred: only a launched run has a process group

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _finite_params(model) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


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
    from mixrl.trainer.callbacks import MetricsJsonlCallback, RichProgressCallback, SampleLogCallback, last_reward  # deferred: trainer.callbacks imports transformers; `mixrl plan` imports this module and must not load it
    from mixrl.trainer.guards import CollapseWatch, DivergenceGuard  # deferred: trainer.guards imports transformers; `mixrl plan` imports this module and must not load it

    t0, cpu0 = time.perf_counter() - inputs.seconds, time.process_time() - inputs.cpu_seconds  # setup includes the inputs
    geom = geometry(cfg)
    start_step = 0
    if resume_from is not None:
        start_step = checkpoint_step(resume_from)
        truncate_jsonl(run_dir / "metrics.jsonl", start_step)
        from mixrl.evaluation.periodic import EVAL_FILE  # deferred: evaluation.periodic imports transformers; `mixrl plan` imports this module and must not load it

        truncate_jsonl(run_dir / EVAL_FILE, start_step)
        truncate_jsonl(run_dir / SAMPLES_FILE, start_step)
        if before is None and (run_dir / EVAL_BEFORE).is_file():
            before = json.loads((run_dir / EVAL_BEFORE).read_text())
        console.print(f"resuming {run_dir} from step {start_step} ({resume_from.name})")
    model_path, tokenizer, eval_rows, heldout, reward_funcs = (inputs.model_path, inputs.tokenizer, inputs.eval_rows,
                                                               inputs.heldout, inputs.reward_funcs)
    metrics_cb = MetricsJsonlCallback(run_dir / "metrics.jsonl")
    collapse = CollapseWatch(warn=lambda text: console.print(f"[yellow]{text}[/]", highlight=False, soft_wrap=True))

    def save_now() -> str | None:  # a checkpoint of the current (finite) state, before the optimizer step
        if not _finite_params(trainer.model):
            return None
        trainer._save_checkpoint(trainer.model, None)  # mixrl's counters and source state included
        ckpt = last_checkpoint(run_dir)
        return str(ckpt) if ckpt else None

    callbacks = [metrics_cb, guard, DivergenceGuard(save=save_now), collapse]
    if cfg.logger.progress:
        callbacks.append(RichProgressCallback(console, description=f"{cfg.algo.name} s{cfg.seed}"))
    if cfg.logger.report_to:  # the starting model's held-out results open the trackers' eval/* curves
        from mixrl.trainer.publish import HeldoutBeforeCallback  # deferred: trainer.publish imports transformers; `mixrl plan` imports this module and must not load it

        callbacks.append(HeldoutBeforeCallback(lambda: before, trainer=lambda: trainer))
    if cfg.trainer.eval_every > 0:  # held-out accuracy (and benchmarks) every N steps -> eval.jsonl (the lambda: trainer is built below)
        from mixrl.evaluation.periodic import PeriodicEvalCallback  # deferred: evaluation.periodic imports transformers; `mixrl plan` imports this module and must not load it
        callbacks.append(PeriodicEvalCallback.from_config(cfg, run_dir, tokenizer, eval_rows, heldout_reward(reward_funcs[0]), trainer=lambda: trainer,
                                                          stop=guard.stop_requested, benchmarks=inputs.benchmarks))
    samples_cb = None
    if cfg.logger.samples_per_step > 0 or cfg.logger.samples_eval > 0:  # what the model writes -> samples.jsonl, trackers
        periodic = next((cb for cb in callbacks if hasattr(cb, "last_examples")), None)
        lg = cfg.logger
        samples_cb = SampleLogCallback(run_dir, trainer=lambda: trainer, per_step=lg.samples_per_step, eval_rows=lg.samples_eval,
                                       max_chars=lg.samples_max_chars, keep_steps=lg.samples_keep_steps,
                                       eval_examples=(lambda: periodic.last_examples) if periodic is not None else None)
        callbacks.append(samples_cb)
    trainer = build.trainer_from_config(cfg, inputs=inputs, callbacks=callbacks, run_dir=run_dir)
    trainer.mixrl_config = OmegaConf.to_container(cfg, resolve=True)  # recorded in each checkpoint (the trainer's progress state)
    if cfg.logger.report_to:
        from mixrl.trainer.publish import route_to_trackers, tensorboard_dir  # deferred: trainer.publish imports transformers; `mixrl plan` imports this module and must not load it

        route_to_trackers(trainer)  # held-out eval/* stays eval/* in the trackers (not train/eval/*)
        events = tensorboard_dir(trainer, run_dir)
        if events is not None and trainer.accelerator.is_main_process:
            console.print(f"TensorBoard events: {events} (tensorboard --logdir {events})", highlight=False, soft_wrap=True)
    setup_s = time.perf_counter() - t0

    if before is None:
        try:
            with guard.during("the held-out evaluation before training; nothing to save yet"):
                before = _eval_start(trainer, tokenizer, eval_rows, heldout_reward(reward_funcs[0]), cfg, console, model_path, stop=guard.stop_requested)
        except EvaluationInterrupted:
            raise RunInterrupted(f"{guard.name} during the held-out evaluation before training; nothing to resume; "
                                 "run the command again") from None
        if trainer.accelerator.is_main_process:
            (run_dir / EVAL_BEFORE).write_text(json.dumps(before, indent=2))
    collapse.observe(start_step, {"eval/accuracy": before.get("accuracy")})  # the starting model is a "best" too
    if guard.signum is not None:
        raise RunInterrupted(f"{guard.name} before the first training step; nothing to resume; run the command again")
    if resume_from is not None:
        load_run_state(trainer, resume_from)
    t1 = time.perf_counter()
    try:
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    except RuntimeError as e:
        text = str(e)
        if "inf" not in text and "nan" not in text:
            raise
        from mixrl.trainer.guards import likely_cause  # deferred: trainer.guards imports transformers; `mixrl plan` imports this module and must not load it

        raise TrainingDiverged(
            f"training diverged at step {trainer.state.global_step + 1}: the policy's probabilities are not finite "
            f"(generation failed: {text.splitlines()[0]}); {likely_cause(float(cfg.trainer.learning_rate))}; "
            f"{last_checkpoint_note(run_dir)}"
        ) from None
    except RewardInterrupted as e:  # SIGINT / SIGTERM stopped a reward call (it may have hung): save and stop
        saved = save_now() if trainer.state.global_step > 0 else None
        raise stopped_error(
            guard, cfg, run_dir, f"{e} at step {trainer.state.global_step + 1}: "
            + (f"checkpoint saved in {saved}; continue with: mixrl train resume={run_dir}" if saved else last_checkpoint_note(run_dir)),
            saved=saved is not None,
        ) from None
    except MagnitudeExceeded as e:  # raised before the micro-batch's backward: the weights are those of the last finished step
        saved = save_now() if trainer.state.global_step > 0 else None
        where = (f"checkpoint of step {trainer.state.global_step} saved in {saved}; continue with: mixrl train resume={run_dir} "
                 "and the raised bound" if saved else last_checkpoint_note(run_dir))
        raise TrainingDiverged(f"{e}; {where}") from None
    except UserFunctionError as e:  # a feedback builder raised or returned what it must not, before this step's backward
        saved = save_now() if trainer.state.global_step > 0 else None
        where = (f"checkpoint of step {trainer.state.global_step} saved in {saved}; continue with: mixrl train resume={run_dir} "
                 "once the function is fixed" if saved else last_checkpoint_note(run_dir))
        raise UserFunctionError(f"{e}; stopped at step {trainer.state.global_step + 1}, {where}") from None
    except RewardError as e:
        if isinstance(e, RewardTooSlow) and trainer.state.global_step > 0:
            save_now()  # the weights of the last finished step, to continue from once the reward is fixed
        raise RewardError(f"{e}; stopped at step {trainer.state.global_step}, {last_checkpoint_note(run_dir)}") from None
    if guard.stopped is not None:  # every process stopped after the same step and joined its checkpoint
        _barrier()  # no process exits (and makes a launcher stop the others) before rank 0 wrote the checkpoint's last file
        ckpt = last_checkpoint(run_dir)
        raise stopped_error(guard, cfg, run_dir, f"{guard.name} at step {trainer.state.global_step}: checkpoint saved in {ckpt}; "
                                                 f"continue with: mixrl train resume={run_dir}", saved=ckpt is not None)
    train_s = time.perf_counter() - t1
    if trainer.parts.sampler is not None:  # what the sampler paid: extra rollouts beyond those trained
        console.print(trainer.parts.sampler.sampler.summary(), highlight=False, soft_wrap=True)
    # the final model is saved before the evaluation after training: a SIGTERM during it (and the
    # SIGKILL a scheduler sends after its grace period) cannot lose the trained weights
    model_dir = run_dir / "model"
    if trainer.is_fsdp_enabled:  # every process joins the gather of the full state dict; rank 0 writes it
        trainer.save_model(str(model_dir))
    elif trainer.accelerator.is_main_process:
        trainer.save_model(str(model_dir))
    if trainer.accelerator.is_main_process:
        tokenizer.save_pretrained(str(model_dir))
        if tiny_bpe.is_tiny_bpe(model_path):  # still the BPE chat model: later stages and `mixrl eval` give it chat prompts
            tiny_bpe.mark_derived(model_dir, model_path)
    examples: list[dict] = []
    try:
        with guard.during(f"the held-out evaluation after training (the final model is saved in {model_dir})"):
            after = _eval(trainer, tokenizer, eval_rows, heldout_reward(reward_funcs[0]), cfg, console, "held-out eval (after)", examples=examples,
                          stop=guard.stop_requested)
    except EvaluationInterrupted:
        raise RunInterrupted(f"{guard.name} during the held-out evaluation after training (step {trainer.state.global_step}): "
                             f"the final model is saved in {model_dir}; evaluate it with: mixrl eval {run_dir}") from None
    if samples_cb is not None and examples and trainer.accelerator.is_main_process:
        samples_cb.write_eval(int(trainer.state.global_step), examples)
    if cfg.logger.report_to:
        from mixrl.trainer.publish import log_heldout  # deferred: trainer.publish imports transformers; `mixrl plan` imports this module and must not load it

        log_heldout(trainer, after)
    collapse.final_check(before.get("accuracy"), after.get("accuracy"), float(cfg.trainer.learning_rate))
    if metrics_cb.rows and all(r.get("reward_mean", r.get("reward")) is None for r in metrics_cb.rows):
        collapse._emit("unscored", "warning: no rollout got a reward at any step (every reward function returned None): "
                                   "the run learned nothing from rewards; check the reward function and data.answer_column")

    summary = {
        "run_dir": str(run_dir),
        "algo": cfg.algo.name,
        "recipe": cfg.recipe_info.name,
        "seed": int(cfg.seed),
        "steps": int(trainer.state.global_step),
        "resumed_from_step": start_step if resume_from is not None else None,
        "geometry": geom.describe(),
        "rollouts": trainer.mixrl_rollouts,  # on-policy rollouts trained on (expert rows excluded)
        "generated_tokens": trainer.mixrl_generated_tokens,  # their completion tokens
        "accuracy_before": before.get("accuracy"),
        "accuracy_after": after.get("accuracy"),
        "eval_before": before,
        "eval_after": after,
        "heldout": {k: v for k, v in heldout.items() if k != "heldout_indices"},
        "final_metrics": metrics_cb.rows[-1] if metrics_cb.rows else {},
        "last_reward": last_reward(metrics_cb.rows),  # what the bar showed last (mixrl.trainer.callbacks.SHOWN_REWARD)
        "warnings": collapse.warnings,
        "setup_seconds": round(setup_s, 2),
        "train_seconds": round(train_s, 2),
        "wall_seconds": round(time.perf_counter() - t0, 2),
        "cpu_seconds": round(time.process_time() - cpu0, 2),  # CPU time of this process (all its threads)
        "model_dir": str(model_dir),
        "machine": f"{platform.machine()} {os.cpu_count()} cpu",
    }
    if trainer.is_fsdp_enabled:
        summary["sharding"] = _sharding(trainer)
    if trainer.parts.sampler is not None:
        s = trainer.parts.sampler.sampler
        summary["sampler"] = {"name": str(cfg.sampler.name), "generated": s.generated, "trained": s.trained,
                              "generated_per_trained": s.generated / s.trained if s.trained else None,
                              "rounds_per_batch": s.rounds / s.batches if s.batches else None, "short_groups": s.short}
    if trainer.accelerator.is_main_process:
        from mixrl.trainer.publish import save_merged, write_model_card  # deferred: trainer.publish imports transformers; `mixrl plan` imports this module and must not load it

        if (cfg.model.lora or {}).get("enabled") and (cfg.model.lora or {}).get("save_merged"):
            merged = save_merged(model_dir, cfg, run_dir / MERGED_DIR)
            summary["merged_model_dir"] = str(merged)
            write_model_card(merged, cfg, summary, base_model=str(cfg.model.path))
        write_model_card(model_dir, cfg, summary, base_model=str(cfg.model.path))
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return RunResult(run_dir, summary)


def _sharding(trainer) -> dict:
    """What FSDP sharded: the model's parameters and the share this process holds (its shards
    of every sharded parameter; rank 0's in ``summary.json``)."""
    params = list(trainer.model.parameters())
    local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in params)
    return {"strategy": "fsdp", "processes": int(trainer.accelerator.num_processes),
            "parameters": sum(p.numel() for p in params), "parameters_this_process": int(local)}


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
