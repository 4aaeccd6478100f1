"""Held-out and benchmark evaluation during training (``trainer.eval_every``).

:class:`PeriodicEvalCallback` runs greedy accuracy (and sampled pass@k when
``trainer.eval_pass_k`` > 0) on the run's fixed held-out rows every ``trainer.eval_every``
optimizer steps, and, with ``trainer.eval_benchmarks`` (:mod:`mixrl.benchmarks.live`), the
papers' benchmarks with a subset of problems and ``trainer.eval_benchmark_k`` samples, as
the papers' validation curves do. Each evaluation appends one row to ``eval.jsonl`` in the
run directory::

    {"step": 20, "rollouts": 1280, "accuracy": 0.41, "n": 256.0, "accuracy/level1": ...,
     "pass@4": ..., "sampled_accuracy": ..., "aime24/avg@4": 0.1, "aime24/pass@4": 0.3,
     "seconds": 3.2}

and logs the same values as ``eval/<key>`` in that step's metrics row (``metrics.jsonl``,
and any logger). Rows are written at steps N, 2N, ...; the evaluations before and after
training stay in ``summary.json`` (``eval_before`` / ``eval_after``).

The evaluation runs inside a forked RNG state seeded by (seed, step), so sampled pass@k is
reproducible and an evaluation never changes the training trajectory: a run with
``eval_every`` trains exactly as the same run without it. Its time is part of the step's
``step_time`` (see ``eval/seconds`` in the same row).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from mixrl.evaluation.accuracy import EvaluationInterrupted, evaluate_accuracy
from mixrl.evaluation.acting import acting_generator

EVAL_FILE = "eval.jsonl"


class PeriodicEvalCallback(TrainerCallback):
    """Every ``every`` optimizer steps: held-out accuracy -> ``eval.jsonl`` + ``eval/*`` metrics.

    Args:
        every: evaluate when ``global_step % every == 0`` (0 disables).
        run_dir: where ``eval.jsonl`` is appended.
        tokenizer, rows, reward_fn: as for :func:`mixrl.evaluation.accuracy.evaluate_accuracy`.
        trainer: the trainer (the callback is built once it exists and added to it). Used for the
            rollout count (``mixrl_rollouts``), to log ``eval/*`` into the trainer's metrics,
            and for the model when none is given. Optional: without it the model comes from
            the callback arguments and ``eval/*`` is added to the logs of that step.
        model: the model to evaluate (default: the trainer's).
        benchmarks: :class:`mixrl.benchmarks.live.LiveBenchmark` list, scored after the held-out
            rows; each metric is logged as ``eval/<benchmark>/<metric>``. With benchmarks the
            held-out rows may be empty (``trainer.eval_size=0``). A run with a colocated vLLM engine
            generates them on that engine, its weights synced first (:mod:`mixrl.benchmarks.engine`).
        stop: asked between batches (:func:`~mixrl.evaluation.accuracy.evaluate_accuracy`); when
            it returns True (a SIGTERM) the evaluation stops, writes no row and asks the trainer
            to save a checkpoint and stop, as the interrupt guard does at a step's end.
    """

    def __init__(
        self,
        *,
        every: int,
        run_dir: str | Path,
        tokenizer,
        rows: list[dict],
        reward_fn: Callable,
        max_new_tokens: int,
        batch_size: int = 128,
        pass_k: int = 0,
        samples: int = 0,
        ks: tuple = (),
        temperature: float = 1.0,
        seed: int = 0,
        trainer: Any = None,
        model: Any = None,
        stop: Callable[[], bool] | None = None,
        benchmarks: Sequence = (),
        generate: Callable | None = None,
    ):
        self.every = int(every)
        self.path = Path(run_dir) / EVAL_FILE
        self.tokenizer = tokenizer
        self.rows_in = list(rows)
        self.reward_fn = reward_fn
        self.max_new_tokens = int(max_new_tokens)
        self.batch_size = int(batch_size)
        self.pass_k = int(pass_k)
        self.samples = int(samples)
        self.ks = tuple(int(k) for k in ks)
        self.temperature = float(temperature)
        self.seed = int(seed)
        self._trainer = trainer
        self.model = model
        self.stop = stop
        self.benchmarks = list(benchmarks)
        self.generate = generate  # the rollout that acts (env=tools, an environment): mixrl.evaluation.acting
        self.rows: list[dict] = []  # the eval.jsonl rows written by this callback
        self.last_examples: tuple[int, list[dict]] | None = None  # (step, greedy examples) of the last evaluation (samples.jsonl)
        self._pending: dict[str, float] | None = None

    @classmethod
    def from_config(cls, cfg, run_dir, tokenizer, rows, reward_fn, *, trainer=None, model=None, stop=None,
                    benchmarks: Sequence = ()) -> "PeriodicEvalCallback":
        t = cfg.trainer
        return cls(
            every=int(t.eval_every), run_dir=run_dir, tokenizer=tokenizer, rows=rows, reward_fn=reward_fn,
            max_new_tokens=int(t.max_completion_length), batch_size=int(t.eval_batch_size), pass_k=int(t.eval_pass_k) if t.eval_sample_every else 0,
            samples=int(t.eval_samples) if t.eval_sample_every else 0, ks=tuple(t.eval_pass_at),
            temperature=float(t.temperature), seed=int(cfg.seed), trainer=trainer, model=model, stop=stop,
            benchmarks=benchmarks, generate=acting_generator(cfg.get("env")),
        )

    @property
    def trainer(self):
        return self._trainer

    def due(self, step: int) -> bool:
        return self.every > 0 and bool(self.rows_in or self.benchmarks) and step > 0 and step % self.every == 0

    def evaluate(self, model, step: int) -> dict:
        """One evaluation (greedy accuracy, per level, pass@k; each benchmark's metrics as
        ``NAME/METRIC``) in a forked, seeded RNG state."""
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.seed * 1_000_003 + step)
            examples: list[dict] = []
            result = evaluate_accuracy(
                model, self.tokenizer, self.rows_in, self.reward_fn, max_new_tokens=self.max_new_tokens,
                batch_size=self.batch_size, pass_k=self.pass_k, samples=self.samples, ks=self.ks, temperature=self.temperature,
                examples=examples, stop=self.stop, generate=self.generate,
            ) if self.rows_in else {}
            for bench in self.benchmarks:  # each scores itself (mixrl.benchmarks.live.LiveBenchmark.evaluate)
                scores = bench.evaluate(model, self.tokenizer, batch_size=self.batch_size, stop=self.stop,
                                        examples=None if self.rows_in else examples, trainer=self.trainer)
                result.update({f"{bench.name}/{m}": v for m, v in scores.items()})
            self.last_examples = (step, examples)
            return result

    def on_step_end(self, args, state, control, model=None, **kwargs):
        step = int(state.global_step)
        if not self.due(step):
            return
        trainer = self.trainer
        model = self.model or model or (trainer.model if trainer is not None else None)
        if model is None:
            raise RuntimeError("PeriodicEvalCallback has no model: pass model= or trainer=")
        t0 = time.perf_counter()
        try:
            result = self.evaluate(model, step)
        except EvaluationInterrupted:  # a signal: no row for this step; the checkpoint of this step is saved
            control.should_save = True
            control.should_training_stop = True
            return control
        seconds = time.perf_counter() - t0
        row: dict[str, Any] = {"step": step}
        rollouts = getattr(trainer, "mixrl_rollouts", None)
        if rollouts is not None:
            row["rollouts"] = int(rollouts)
            row["generated_tokens"] = int(getattr(trainer, "mixrl_generated_tokens", 0))
        row.update(result)
        row["seconds"] = round(seconds, 3)
        self.rows.append(row)
        if state.is_world_process_zero:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as f:
                f.write(json.dumps(row) + "\n")
        logged = {f"eval/{k}": float(v) for k, v in result.items() if k != "n"}
        logged["eval/seconds"] = seconds
        metrics = getattr(trainer, "_metrics", None)
        if isinstance(metrics, dict) and "train" in metrics:
            for k, v in logged.items():  # averaged and logged by GRPOTrainer.log right after this step
                metrics["train"][k].append(v)
        else:
            self._pending = logged

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self._pending and logs is not None and "train_runtime" not in logs:
            logs.update(self._pending)
            self._pending = None

