"""Trainer callbacks: metrics.jsonl rows, samples.jsonl rows, mixrl state in checkpoints, a Rich progress bar."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch
from rich.console import Console
from transformers import TrainerCallback

from mixrl.progress import progress_bar
from mixrl.trainer.sample_log import COLUMNS, SampleLog, cells, eval_rows, markdown_table

# TRL's metric names -> the names mixrl writes (others are kept as they are)
RENAMES = {
    "reward": "reward_mean",
    "completions/mean_length": "completion_length",
    "num_tokens": "tokens",
}


#: the reward the progress bar and the run summary show ("reward (last step)"): the mean reward of
#: the policy's own rollouts, the rows it sampled from the prompt alone: injected rows (expert,
#: replayed, off-policy), rollouts continued from a prefix and rollouts generated with a hint are
#: left out (the same rows as the ``accuracy`` metric; ``reward_mean`` is TRL's mean over every row)
SHOWN_REWARD = "reward_on_policy"


def last_reward(rows: list[dict]) -> dict | None:
    """:data:`SHOWN_REWARD` of the last logged step that scored rollouts, as
    ``{"metric", "step", "value"}``; None when no step had any. A step that generated nothing
    (TRL's later passes over a batch, ``trainer.num_iterations`` > 1) logs no reward and is skipped."""
    for row in reversed(rows):
        if row.get(SHOWN_REWARD) is not None:
            return {"metric": SHOWN_REWARD, "step": row.get("step"), "value": row[SHOWN_REWARD]}
    return None


def reward_text(summary: dict) -> str:
    """The number after the run summary's "reward (last step)": ``summary["last_reward"]``
    (:func:`last_reward`), with its step when that is not the run's last (``0.273 (step 1, the
    last that generated)``), or why there is none."""
    last = summary.get("last_reward")
    if last is None:
        return "none (no rollout of the policy's own was scored)"
    if last.get("step") is not None and last["step"] != summary.get("steps"):
        return f"{last['value']:.3f} (step {last['step']}, the last that generated)"
    return f"{last['value']:.3f}"


def engine_mismatch_text(logs: dict) -> str | None:
    """The engine-mismatch metrics of a logged step in a few words (None without them):
    ``|dlogp| 0.012, 3% masked`` (``engine/*``, :func:`mixrl.core.engine_mismatch.mismatch_metrics`)."""
    mean = logs.get("engine/logp_diff/mean")
    if mean is None:
        return None
    text = f"|dlogp| {mean:.3g}"
    for key in ("masked", "truncated"):
        frac = logs.get(f"engine/{key}_frac")
        if frac is not None:
            text += f", {100 * frac:.0f}% {key}"
    return text


def cuda_memory_metrics() -> dict:
    """``cuda/max_allocated_mb`` and ``cuda/max_reserved_mb``: this process's largest memory held by
    torch's CUDA allocator since it started (``torch.cuda.max_memory_allocated`` / ``_reserved``), the
    number ``mixrl plan``'s per-GPU peak estimates; ``{}`` when the process has not used CUDA."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    return {"cuda/max_allocated_mb": torch.cuda.max_memory_allocated() / 2**20,
            "cuda/max_reserved_mb": torch.cuda.max_memory_reserved() / 2**20}


def _clean(value):
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    return value


class MetricsJsonlCallback(TrainerCallback):
    """Appends one JSON row per logged training step to ``metrics.jsonl``."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rows: list[dict] = []
        self._t = None

    def on_step_begin(self, args, state, control, **kwargs):
        if self._t is None:
            self._t = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "train_runtime" in logs or not state.is_world_process_zero:
            return
        now = time.perf_counter()
        row = {"step": state.global_step}
        for k, v in logs.items():
            row[RENAMES.get(k, k)] = _clean(v)
        row.update(cuda_memory_metrics())
        if self._t is not None and "step_time" not in row:
            row["step_time"] = now - self._t
        self._t = now
        self.rows.append(row)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")


class RichProgressCallback(TrainerCallback):
    """A Rich progress bar over optimizer steps, showing :data:`SHOWN_REWARD`, accuracy and mu.

    Each shown value is the last one logged (a step that generated nothing, e.g. TRL's second pass
    over a batch with ``trainer.num_iterations=2``, keeps the previous one), and a logged step's
    line is drawn after its ``on_log``, so the bar never shows the step before's numbers."""

    #: (logged key, label, format) of the numbers the bar shows
    SHOWN = ((SHOWN_REWARD, "reward", ".3f"), ("accuracy", "acc", ".2f"), ("mu", "mu", ".2f"))

    def __init__(self, console: Console | None = None, description: str = "train"):
        self.console = console or Console(stderr=True)
        self.description = description
        self.progress = None
        self.task = None
        self.last = ""
        self.shown: dict[str, str] = {}

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        self.progress = progress_bar(self.console, fields=("{task.fields[info]}",))
        self.progress.start()
        self.task = self.progress.add_task(self.description, total=state.max_steps, info="")

    def on_step_end(self, args, state, control, **kwargs):
        if self.progress is not None and not control.should_log:  # a logged step is drawn in on_log, with its own numbers
            self.progress.update(self.task, completed=state.global_step, info=self.last)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.progress is None or not logs or "train_runtime" in logs:
            return
        for key, label, fmt in self.SHOWN:
            if logs.get(key) is not None:
                self.shown[label] = f"{label} {logs[key]:{fmt}}"
        engine = engine_mismatch_text(logs)
        if engine is not None:
            self.shown["vLLM"] = f"vLLM {engine}"
        self.last = "  ".join(self.shown.values())
        self.progress.update(self.task, completed=state.global_step, info=self.last)

    def on_train_end(self, args, state, control, **kwargs):
        if self.progress is not None:
            self.progress.update(self.task, completed=state.global_step, info=self.last)
            self.progress.stop()
            self.progress = None


class SampleLogCallback(TrainerCallback):
    """What the model writes -> ``samples.jsonl`` (:mod:`mixrl.trainer.sample_log`) and the trackers.

    At each logged step: the rows the trainer kept of its last generation batch (taken from ``tap``,
    the trainer's ``spec.samples``, :class:`~mixrl.trainer.sample_log.SampleTap`; None: no training rows;
    :func:`~mixrl.trainer.sample_log.capture_rows`),
    and the examples of a held-out evaluation made since (``eval_examples()``: ``(step, examples)``
    or None, e.g. :attr:`mixrl.evaluation.periodic.PeriodicEvalCallback.last_examples`). The same
    rows go to the trackers: a ``wandb.Table`` (``samples/train``, ``samples/eval``) when W&B
    reports, a Markdown table as TensorBoard text otherwise (:func:`publish_samples`).

    ``trainer``: the trainer (the callback is built once it exists, :func:`mixrl.trainer.run_steps.attach_callbacks`).
    """

    def __init__(self, run_dir: Path, *, trainer, tap=None, eval_rows: int = 16, max_chars: int = 1000,
                 keep_steps: int = 200, eval_examples=None):
        self.log = SampleLog(run_dir, keep_steps=keep_steps)
        self._trainer = trainer
        self.tap = tap
        self.eval_rows = int(eval_rows)
        self.max_chars = int(max_chars)
        self.eval_examples = eval_examples
        self._eval_done = -1

    @property
    def trainer(self):
        return self._trainer

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "train_runtime" in logs:
            return
        rows = self.tap.take() if self.tap is not None else None
        if not state.is_world_process_zero:
            return
        if rows:
            self.write("train", state.global_step, rows)
        found = self.eval_examples() if self.eval_examples is not None else None
        if found is not None and found[0] != self._eval_done:
            self.write_eval(*found)

    def write_eval(self, step: int, examples: list[dict]) -> list[dict]:
        """A held-out evaluation's first ``eval_rows`` examples at ``step`` (file and trackers)."""
        if int(step) == self._eval_done:  # the evaluation after training at the step a periodic one just logged: same weights
            return []
        self._eval_done = int(step)
        return self.write("eval", step, eval_rows(examples or [], self.eval_rows, self.max_chars))

    def write(self, split: str, step: int, rows: list[dict]) -> list[dict]:
        written = self.log.append(split, step, rows)
        trainer = self.trainer
        if written and trainer is not None and getattr(trainer, "callback_handler", None) is not None:
            publish_samples(trainer, split, int(step), written)
        return written


def publish_samples(trainer, split: str, step: int, rows: list[dict]) -> list[str]:
    """Send sample ``rows`` to the trainer's trackers: a ``wandb.Table`` under ``samples/<split>``
    for W&B, ``add_text("samples/<split>", <markdown table>)`` for TensorBoard. Returns the
    trackers reached (by class name)."""
    reached = []
    for cb in trainer.callback_handler.callbacks:
        name = type(cb).__name__
        if name == "WandbCallback" and getattr(cb, "_wandb", None) is not None and getattr(cb._wandb, "run", None) is not None:
            table = cb._wandb.Table(columns=list(COLUMNS), data=[cells(r) for r in rows])
            cb._wandb.log({f"samples/{split}": table})
            reached.append(name)
        elif name == "TensorBoardCallback":
            if getattr(cb, "tb_writer", None) is None and hasattr(cb, "_init_summary_writer"):  # closed at train end: the evaluation after training
                cb._init_summary_writer(trainer.args)
            if getattr(cb, "tb_writer", None) is None:
                continue
            cb.tb_writer.add_text(f"samples/{split}", markdown_table(rows), global_step=step)
            cb.tb_writer.flush()
            reached.append(name)
    return reached
