"""The steps of one training run, each short, in the order :func:`mixrl.trainer.run._train` calls them.

1. :func:`begin`: the run's clock, and on resume the logs cut back to the checkpoint's step.
2. (``_train`` builds the trainer: :func:`mixrl.trainer.build.trainer_from_config`.)
3. :func:`attach_callbacks`: the run's callbacks, built once the trainer exists and added to it in
   a fixed order (metrics, interrupt guard, divergence guard, collapse watch, progress, the
   trackers' held-out start, periodic evaluation, samples); then the trackers' routing.
4. :func:`evaluate_before`: the starting model's held-out results (or those already measured).
5. :func:`fit`: ``trainer.train``, with every way it can stop turned into one error.
6. :func:`finish`: the final model saved, the evaluation after training, the summary and the
   model card.

A :class:`Run` carries what one step leaves for the next.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from rich.console import Console
import torch

from mixrl.config.geometry import geometry
from mixrl.errors import PREEMPTED_EXIT, RewardError, RunInterrupted, RunPreempted, TrainingDiverged, UserFunctionError
from mixrl.evaluation import cache as eval_cache
from mixrl.evaluation.accuracy import EvaluationInterrupted, evaluate_accuracy
from mixrl.evaluation.acting import acting_generator
from mixrl.models import tiny_bpe
from mixrl.progress import progress_bar
from mixrl.rewards.components import heldout_reward
from mixrl.rewards.deadline import RewardInterrupted, RewardTooSlow
from mixrl.trainer.build import RunInputs
from mixrl.trainer.magnitude import MagnitudeExceeded
from mixrl.trainer.sample_log import SAMPLES_FILE
from mixrl.trainer.state.resume import read_run_state
from mixrl.trainer.state.rundir import EVAL_BEFORE, MERGED_DIR, checkpoint_step, cut_logs_back, last_checkpoint, last_checkpoint_note

#: written under RUN_DIR/launch/ by a launched run's first process on each machine when a preemption
#: signal stopped it after a checkpoint: that machine's launcher then exits with PREEMPTED_EXIT too
#: (torchrun itself reports any failed process as 1)
PREEMPTED_MARKER = "preempted-node{machine}"


@dataclass
class Run:
    """One run between its steps: what it was given, then what each step leaves for the next."""

    cfg: DictConfig
    console: Console
    run_dir: Path
    guard: Any  # mixrl.trainer.guards.InterruptGuard
    inputs: RunInputs
    resume_from: Path | None
    before: dict | None  # the starting model's held-out results
    t0: float  # wall-clock and CPU time at the start of the setup (the inputs' preparation included)
    cpu0: float
    start_step: int = 0
    trainer: Any = None  # set by _train once built
    metrics: Any = None  # MetricsJsonlCallback
    collapse: Any = None  # CollapseWatch
    samples: Any = None  # SampleLogCallback, or None
    setup_s: float = 0.0
    train_s: float = 0.0

    def say(self, text: str) -> None:
        self.console.print(text, highlight=False, soft_wrap=True)


def _eval(run: Run, label: str, examples: list | None = None) -> dict:
    """Held-out results of the trainer's model; the interrupt guard's ``stop_requested`` ends it
    within a batch with :class:`EvaluationInterrupted`."""
    cfg, trainer, rows = run.cfg, run.trainer, run.inputs.eval_rows
    if not rows:
        return {}
    show = cfg.logger.progress and trainer.accelerator.is_main_process
    # sampled pass@k must not move the training RNG: evaluate in a forked, seeded stream
    with torch.random.fork_rng(devices=[]), progress_bar(run.console, quiet=not show, transient=True) as prog:
        torch.manual_seed(int(cfg.seed) + 7919)
        task = prog.add_task(label, total=len(rows))
        t = cfg.trainer
        return evaluate_accuracy(
            trainer.model, run.inputs.tokenizer, rows, heldout_reward(run.inputs.reward_funcs[0]), max_new_tokens=int(t.max_completion_length),
            batch_size=int(t.eval_batch_size), pass_k=int(t.eval_pass_k),
            samples=int(t.eval_samples), ks=[int(k) for k in t.eval_pass_at], temperature=float(t.temperature), progress=lambda n: prog.advance(task, n),
            examples=examples, stop=run.guard.stop_requested, generate=acting_generator(cfg.get("env")),
        )


def _eval_start(run: Run) -> dict:
    """The starting model's held-out results; with ``trainer.eval_before_cache`` they are read
    from (or stored into) that cache (:mod:`mixrl.evaluation.cache`). The evaluation runs in a
    forked RNG, so skipping it leaves training unchanged."""
    cfg, rows = run.cfg, run.inputs.eval_rows
    cache_dir = cfg.trainer.get("eval_before_cache")
    if not cache_dir or not rows:
        return _eval(run, "held-out eval (before)")
    key = eval_cache.cache_key(cfg, run.inputs.model_path, rows)
    cached = eval_cache.load(cache_dir, key)
    if cached is not None:
        run.say(f"held-out eval (before): reused {cache_dir}/{key}.json")
        return cached
    result = _eval(run, "held-out eval (before)")
    if run.trainer.accelerator.is_main_process:
        eval_cache.store(cache_dir, key, result)
    return result


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


# --------------------------------------------------------------------------- 1. begin
def begin(cfg, console: Console, run_dir: Path, guard, resume_from: Path | None, before: dict | None,
          inputs: RunInputs) -> Run:
    """The run's clock (its setup includes the inputs' preparation); on resume, the run's logs cut
    back to the checkpoint's step and the starting model's results read from the run directory."""
    run = Run(cfg, console, run_dir, guard, inputs, resume_from, before,
              t0=time.perf_counter() - inputs.seconds, cpu0=time.process_time() - inputs.cpu_seconds)
    if resume_from is not None:
        run.start_step = checkpoint_step(resume_from)
        from mixrl.evaluation.periodic import EVAL_FILE  # deferred: evaluation.periodic imports transformers; `mixrl plan` imports this module and must not load it

        cut_logs_back(run_dir, run.start_step, ("metrics.jsonl", EVAL_FILE, SAMPLES_FILE))  # by rank 0 alone
        if before is None and (run_dir / EVAL_BEFORE).is_file():
            run.before = json.loads((run_dir / EVAL_BEFORE).read_text())
        console.print(f"resuming {run_dir} from step {run.start_step} ({resume_from.name})")
    return run


def save_now(run: Run) -> str | None:
    """A checkpoint of the current (finite) state, before the optimizer step (None: not finite, or none written)."""
    trainer = run.trainer
    if not _finite_params(trainer.model):
        return None
    trainer._save_checkpoint(trainer.model, None)  # mixrl's counters and source state included
    ckpt = last_checkpoint(run.run_dir)
    return str(ckpt) if ckpt else None


# --------------------------------------------------------------------------- 3. callbacks
def attach_callbacks(run: Run) -> None:
    """The run's callbacks, built with the trainer they read and added to it in their fixed order;
    then the trackers' routing."""
    from mixrl.trainer.callbacks import MetricsJsonlCallback, RichProgressCallback, SampleLogCallback  # deferred: trainer.callbacks imports transformers; `mixrl plan` imports this module and must not load it
    from mixrl.trainer.guards import CollapseWatch, DivergenceGuard  # deferred: as above

    cfg, trainer, lg = run.cfg, run.trainer, run.cfg.logger
    run.metrics = MetricsJsonlCallback(run.run_dir / "metrics.jsonl")
    run.collapse = CollapseWatch(warn=lambda text: run.say(f"[yellow]{text}[/]"))
    callbacks = [run.metrics, run.guard, DivergenceGuard(save=lambda: save_now(run)), run.collapse]
    if lg.progress:
        callbacks.append(RichProgressCallback(run.console, description=f"{cfg.algo.name} s{cfg.seed}"))
    if lg.report_to:  # the starting model's held-out results open the trackers' eval/* curves
        from mixrl.trainer.publish import HeldoutBeforeCallback  # deferred: trainer.publish imports transformers; `mixrl plan` imports this module and must not load it

        callbacks.append(HeldoutBeforeCallback(lambda: run.before, trainer=trainer))
    periodic = None
    if cfg.trainer.eval_every > 0:  # held-out accuracy (and benchmarks) every N steps -> eval.jsonl
        from mixrl.evaluation.periodic import PeriodicEvalCallback  # deferred: evaluation.periodic imports transformers; `mixrl plan` imports this module and must not load it

        inputs = run.inputs
        periodic = PeriodicEvalCallback.from_config(cfg, run.run_dir, inputs.tokenizer, inputs.eval_rows, heldout_reward(inputs.reward_funcs[0]),
                                                    trainer=trainer, stop=run.guard.stop_requested, benchmarks=inputs.benchmarks)
        callbacks.append(periodic)
    if lg.samples_per_step > 0 or lg.samples_eval > 0:  # what the model writes -> samples.jsonl, trackers
        run.samples = SampleLogCallback(run.run_dir, trainer=trainer, tap=trainer.spec.samples, eval_rows=lg.samples_eval,
                                        max_chars=lg.samples_max_chars, keep_steps=lg.samples_keep_steps,
                                        eval_examples=(lambda: periodic.last_examples) if periodic is not None else None)
        callbacks.append(run.samples)
    for cb in callbacks:
        trainer.add_callback(cb)
    if lg.report_to:
        from mixrl.trainer.publish import route_to_trackers, tensorboard_dir  # deferred: trainer.publish imports transformers; `mixrl plan` imports this module and must not load it

        route_to_trackers(trainer)  # held-out eval/* stays eval/* in the trackers (not train/eval/*)
        events = tensorboard_dir(trainer, run.run_dir)
        if events is not None and trainer.accelerator.is_main_process:
            run.say(f"TensorBoard events: {events} (tensorboard --logdir {events})")
    run.setup_s = time.perf_counter() - run.t0


# --------------------------------------------------------------------------- 4. before
def evaluate_before(run: Run) -> None:
    """The starting model's held-out results (unless given or read on resume), written to the run
    directory; then the trainer's state loaded from the checkpoint resumed from."""
    guard = run.guard
    if run.before is None:
        try:
            with guard.during("the held-out evaluation before training; nothing to save yet"):
                run.before = _eval_start(run)
        except EvaluationInterrupted:
            raise RunInterrupted(f"{guard.name} during the held-out evaluation before training; nothing to resume; "
                                 "run the command again") from None
        if run.trainer.accelerator.is_main_process:
            (run.run_dir / EVAL_BEFORE).write_text(json.dumps(run.before, indent=2))
    run.collapse.observe(run.start_step, {"eval/accuracy": run.before.get("accuracy")})  # the starting model is a "best" too
    if guard.signum is not None:
        raise RunInterrupted(f"{guard.name} before the first training step; nothing to resume; run the command again")
    if run.resume_from is not None:
        run.trainer.restore_counters(read_run_state(run.resume_from))


# --------------------------------------------------------------------------- 5. fit
def _saved_where(run: Run, fix: str) -> str:
    """A checkpoint of the last finished step (when there is one) and how to continue from it."""
    trainer = run.trainer
    saved = save_now(run) if trainer.state.global_step > 0 else None
    return (f"checkpoint of step {trainer.state.global_step} saved in {saved}; continue with: mixrl train resume={run.run_dir} "
            f"{fix}" if saved else last_checkpoint_note(run.run_dir))


def fit(run: Run) -> None:
    """``trainer.train`` (from the checkpoint resumed from); a divergence, a signal, a bound, a
    user function or a reward that stops it becomes one error naming the step and the checkpoint."""
    trainer, run_dir, guard = run.trainer, run.run_dir, run.guard
    t1 = time.perf_counter()
    try:
        trainer.train(resume_from_checkpoint=str(run.resume_from) if run.resume_from else None)
    except RuntimeError as e:
        text = str(e)
        if "inf" not in text and "nan" not in text:
            raise
        from mixrl.trainer.guards import likely_cause  # deferred: trainer.guards imports transformers; `mixrl plan` imports this module and must not load it

        raise TrainingDiverged(
            f"training diverged at step {trainer.state.global_step + 1}: the policy's probabilities are not finite "
            f"(generation failed: {text.splitlines()[0]}); {likely_cause(float(run.cfg.trainer.learning_rate))}; "
            f"{last_checkpoint_note(run_dir)}"
        ) from None
    except RewardInterrupted as e:  # SIGINT / SIGTERM stopped a reward call (it may have hung): save and stop
        saved = save_now(run) if trainer.state.global_step > 0 else None
        raise stopped_error(
            guard, run.cfg, run_dir, f"{e} at step {trainer.state.global_step + 1}: "
            + (f"checkpoint saved in {saved}; continue with: mixrl train resume={run_dir}" if saved else last_checkpoint_note(run_dir)),
            saved=saved is not None,
        ) from None
    except MagnitudeExceeded as e:  # raised before the micro-batch's backward: the weights are those of the last finished step
        raise TrainingDiverged(f"{e}; {_saved_where(run, 'and the raised bound')}") from None
    except UserFunctionError as e:  # a feedback builder raised or returned what it must not, before this step's backward
        raise UserFunctionError(f"{e}; stopped at step {trainer.state.global_step + 1}, {_saved_where(run, 'once the function is fixed')}") from None
    except RewardError as e:
        if isinstance(e, RewardTooSlow) and trainer.state.global_step > 0:
            save_now(run)  # the weights of the last finished step, to continue from once the reward is fixed
        raise RewardError(f"{e}; stopped at step {trainer.state.global_step}, {last_checkpoint_note(run_dir)}") from None
    if guard.stopped is not None:  # every process stopped after the same step and joined its checkpoint
        _barrier()  # no process exits (and makes a launcher stop the others) before rank 0 wrote the checkpoint's last file
        ckpt = last_checkpoint(run_dir)
        raise stopped_error(guard, run.cfg, run_dir, f"{guard.name} at step {trainer.state.global_step}: checkpoint saved in {ckpt}; "
                                                     f"continue with: mixrl train resume={run_dir}", saved=ckpt is not None)
    run.train_s = time.perf_counter() - t1


# --------------------------------------------------------------------------- 6. finish
def _save_final_model(run: Run) -> Path:
    """The final model (and tokenizer) in ``RUN_DIR/model``, saved before the evaluation after training:
    a SIGTERM during it (and the SIGKILL a scheduler sends after its grace period) cannot lose it."""
    trainer, model_path = run.trainer, run.inputs.model_path
    model_dir = run.run_dir / "model"
    if trainer.is_fsdp_enabled:  # every process joins the gather of the full state dict; rank 0 writes it
        trainer.save_model(str(model_dir))
    elif trainer.accelerator.is_main_process:
        trainer.save_model(str(model_dir))
    if trainer.accelerator.is_main_process:
        run.inputs.tokenizer.save_pretrained(str(model_dir))
        if tiny_bpe.is_tiny_bpe(model_path):  # still the BPE chat model: later stages and `mixrl eval` give it chat prompts
            tiny_bpe.mark_derived(model_dir, model_path)
    return model_dir


def _evaluate_after(run: Run, model_dir: Path) -> dict:
    """The final model's held-out results, its examples in samples.jsonl, the trackers and the collapse checks."""
    trainer, guard, cfg = run.trainer, run.guard, run.cfg
    examples: list[dict] = []
    try:
        with guard.during(f"the held-out evaluation after training (the final model is saved in {model_dir})"):
            after = _eval(run, "held-out eval (after)", examples=examples)
    except EvaluationInterrupted:
        raise RunInterrupted(f"{guard.name} during the held-out evaluation after training (step {trainer.state.global_step}): "
                             f"the final model is saved in {model_dir}; evaluate it with: mixrl eval {run.run_dir}") from None
    if run.samples is not None and examples and trainer.accelerator.is_main_process:
        run.samples.write_eval(int(trainer.state.global_step), examples)
    if cfg.logger.report_to:
        from mixrl.trainer.publish import log_heldout  # deferred: trainer.publish imports transformers; `mixrl plan` imports this module and must not load it

        log_heldout(trainer, after)
    run.collapse.final_check(run.before.get("accuracy"), after.get("accuracy"), float(cfg.trainer.learning_rate))
    rows = run.metrics.rows
    if rows and all(r.get("reward_mean", r.get("reward")) is None for r in rows):
        run.collapse._emit("unscored", "warning: no rollout got a reward at any step (every reward function returned None): "
                                       "the run learned nothing from rewards; check the reward function and data.answer_column")
    return after


def _sharding(trainer) -> dict:
    """What FSDP sharded: the model's parameters and the share this process holds (its shards
    of every sharded parameter; rank 0's in ``summary.json``)."""
    params = list(trainer.model.parameters())
    local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in params)
    return {"strategy": "fsdp", "processes": int(trainer.accelerator.num_processes),
            "parameters": sum(p.numel() for p in params), "parameters_this_process": int(local)}


def summary(run: Run, after: dict, model_dir: Path) -> dict:
    """``summary.json``: what the run did, its held-out results before and after, its times."""
    from mixrl.trainer.callbacks import last_reward  # deferred: trainer.callbacks imports transformers; `mixrl plan` imports this module and must not load it

    cfg, trainer, before, rows = run.cfg, run.trainer, run.before, run.metrics.rows
    out = {
        "run_dir": str(run.run_dir), "algo": cfg.algo.name, "recipe": cfg.recipe_info.name, "seed": int(cfg.seed),
        "steps": int(trainer.state.global_step),
        "resumed_from_step": run.start_step if run.resume_from is not None else None,
        "geometry": geometry(cfg).describe(),
        "rollouts": trainer.mixrl_rollouts,  # on-policy rollouts trained on (expert rows excluded)
        "generated_tokens": trainer.mixrl_generated_tokens,  # their completion tokens
        "accuracy_before": before.get("accuracy"), "accuracy_after": after.get("accuracy"),
        "eval_before": before, "eval_after": after,
        "heldout": {k: v for k, v in run.inputs.heldout.items() if k != "heldout_indices"},
        "final_metrics": rows[-1] if rows else {},
        "last_reward": last_reward(rows),  # what the bar showed last (mixrl.trainer.callbacks.SHOWN_REWARD)
        "warnings": run.collapse.warnings,
        "setup_seconds": round(run.setup_s, 2), "train_seconds": round(run.train_s, 2),
        "wall_seconds": round(time.perf_counter() - run.t0, 2),
        "cpu_seconds": round(time.process_time() - run.cpu0, 2),  # CPU time of this process (all its threads)
        "model_dir": str(model_dir),
        "machine": f"{platform.machine()} {os.cpu_count()} cpu",
    }
    if trainer.is_fsdp_enabled:
        out["sharding"] = _sharding(trainer)
    if trainer.parts.sampler is not None:
        s = trainer.parts.sampler.sampler
        out["sampler"] = {"name": str(cfg.sampler.name), "generated": s.generated, "trained": s.trained,
                          "generated_per_trained": s.generated / s.trained if s.trained else None,
                          "rounds_per_batch": s.rounds / s.batches if s.batches else None, "short_groups": s.short}
    return out


def finish(run: Run) -> dict:
    """The final model saved, then evaluated; the summary, the model card(s) and ``summary.json``
    (rank 0). Returns the summary."""
    cfg, trainer = run.cfg, run.trainer
    if trainer.parts.sampler is not None:  # what the sampler paid: extra rollouts beyond those trained
        run.say(trainer.parts.sampler.sampler.summary())
    model_dir = _save_final_model(run)
    after = _evaluate_after(run, model_dir)
    out = summary(run, after, model_dir)
    if trainer.accelerator.is_main_process:
        from mixrl.trainer.publish import save_merged, write_model_card  # deferred: trainer.publish imports transformers; `mixrl plan` imports this module and must not load it

        if (cfg.model.lora or {}).get("enabled") and (cfg.model.lora or {}).get("save_merged"):
            merged = save_merged(model_dir, cfg, run.run_dir / MERGED_DIR)
            out["merged_model_dir"] = str(merged)
            write_model_card(merged, cfg, out, base_model=str(cfg.model.path))
        write_model_card(model_dir, cfg, out, base_model=str(cfg.model.path))
        (run.run_dir / "summary.json").write_text(json.dumps(out, indent=2))
    return out
