"""Trainer callbacks: metrics.jsonl rows, mixrl state in checkpoints, a Rich progress bar."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from rich.console import Console
from transformers import TrainerCallback

from mixrl.progress import progress_bar

# TRL's metric names -> the names mixrl writes (others are kept as they are)
RENAMES = {
    "reward": "reward_mean",
    "completions/mean_length": "completion_length",
    "num_tokens": "tokens",
}


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
        if self._t is not None and "step_time" not in row:
            row["step_time"] = now - self._t
        self._t = now
        self.rows.append(row)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")


class RichProgressCallback(TrainerCallback):
    """A Rich progress bar over optimizer steps, showing reward and accuracy."""

    def __init__(self, console: Console | None = None, description: str = "train"):
        self.console = console or Console(stderr=True)
        self.description = description
        self.progress = None
        self.task = None
        self.last = ""

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        self.progress = progress_bar(self.console, fields=("{task.fields[info]}",))
        self.progress.start()
        self.task = self.progress.add_task(self.description, total=state.max_steps, info="")

    def on_step_end(self, args, state, control, **kwargs):
        if self.progress is not None:
            self.progress.update(self.task, completed=state.global_step, info=self.last)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.progress is None or not logs:
            return
        parts = []
        if logs.get("reward") is not None:
            parts.append(f"reward {logs['reward']:.3f}")
        if logs.get("accuracy") is not None:
            parts.append(f"acc {logs['accuracy']:.2f}")
        if logs.get("mu") is not None:
            parts.append(f"mu {logs['mu']:.2f}")
        engine = engine_mismatch_text(logs)
        if engine is not None:
            parts.append(f"vLLM {engine}")
        if parts:
            self.last = "  ".join(parts)
            self.progress.update(self.task, info=self.last)

    def on_train_end(self, args, state, control, **kwargs):
        if self.progress is not None:
            self.progress.update(self.task, completed=state.global_step, info=self.last)
            self.progress.stop()
            self.progress = None
