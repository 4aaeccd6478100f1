"""The timing hook every variant shares: a step's wall time (``on_step_begin`` ->
``on_step_end``, CUDA synchronised), its rollout phase (a wrapper of TRL's
``_generate_and_score_completions``), the tokens it trained, its memory peaks, and, on the steps
named, a cProfile or torch.profiler capture. The trainers call it through a ``TrainerCallback``
(:meth:`StepTimer.callback`); the floor's loop calls ``begin``/``end`` itself.
"""

from __future__ import annotations

import cProfile
import time
from collections.abc import Callable

from bench.probes import reset_rss_peak, rss_hwm_mb
from bench.records import StepRecord, VariantResult
from bench.turns import Turns


class StepTimer:
    """Per-step measurements shared by every variant: ``begin()`` at step begin (takes the
    turn, resets memory peaks, starts the clock), ``end()`` at step end; ``rollout()`` wraps
    the rollout phase. ``profile`` maps a step number to "cprofile" or "torch". Steps
    ``warmup + 1 .. total_steps`` that are not profiled are measured."""

    def __init__(self, name: str, turns: Turns, device: str, warmup: int, total_steps: int,
                 profile: dict[int, str] | None = None, log: Callable[[str], None] | None = None,
                 description: str | None = None):
        self.name = name
        self.turns = turns
        self.cuda = device == "cuda"
        self.warmup = warmup
        self.total = total_steps
        self.profile = profile or {}
        self.log = log
        self.result = VariantResult(name, description or name)
        self.current: StepRecord | None = None
        self.trainer = None  # a mixrl trainer whose batch/padding_fraction each step reads (set by bench.runner)
        self._t0 = 0.0
        self.cprofile: cProfile.Profile | None = None
        self.torch_profile = None
        self._torch_prof_ctx = None

    def _sync(self) -> None:
        if self.cuda:
            import torch  # deferred: torch loads only when something is measured (`--help` and the report stay light)

            torch.cuda.synchronize()

    def begin(self, step: int) -> None:
        self.turns.take(self.name)
        self._sync()
        rec = StepRecord(step=step, measured=self.warmup < step <= self.total and step not in self.profile)
        rec.profiled = self.profile.get(step, "")
        if self.cuda:
            import torch  # deferred: torch loads only when something is measured (`--help` and the report stay light)

            torch.cuda.reset_peak_memory_stats()
            rec.cuda_base_mb = torch.cuda.memory_allocated() / 2**20
        if not reset_rss_peak():
            self.turns.rss_reset_ok = False
        self.current = rec
        if rec.profiled == "cprofile":
            self.cprofile = cProfile.Profile()
            self.cprofile.enable()
        elif rec.profiled == "torch":
            import torch  # deferred: torch loads only when something is measured (`--help` and the report stay light)

            acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if self.cuda else [])
            self._torch_prof_ctx = torch.profiler.profile(activities=acts, record_shapes=False)
            self.torch_profile = self._torch_prof_ctx.__enter__()
        self._t0 = time.perf_counter()

    def end(self) -> None:
        self._sync()
        rec = self.current
        rec.seconds = time.perf_counter() - self._t0
        if rec.profiled == "cprofile" and self.cprofile is not None:
            self.cprofile.disable()
        elif rec.profiled == "torch" and self._torch_prof_ctx is not None:
            self._torch_prof_ctx.__exit__(None, None, None)
        rec.rss_peak_mb = rss_hwm_mb()
        if self.cuda:
            import torch  # deferred: torch loads only when something is measured (`--help` and the report stay light)

            rec.cuda_peak_mb = torch.cuda.max_memory_allocated() / 2**20
        if rec.padding_fraction is None and rec.forward_tokens:  # TRL, the floor: every row padded to the step's width
            rec.padding_fraction = 1.0 - (rec.prompt_tokens + rec.rollout_tokens + rec.expert_tokens) / rec.forward_tokens
        self.result.records.append(rec)
        if self.log is not None:
            kind = "measured" if rec.measured else (rec.profiled or "warm-up")
            self.log(f"{self.name:>5} step {rec.step:>3} ({kind}): {rec.seconds:.3f}s "
                     f"(rollout {rec.rollout_seconds:.3f}s, {rec.rollout_tokens}+{rec.expert_tokens} tokens)")

    def rollout(self, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            self._sync()
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            self._sync()
            if self.current is not None:
                self.current.rollout_seconds += time.perf_counter() - t
                self.count_tokens(out)
            return out

        return timed

    def generation(self, fn: Callable) -> Callable:
        """``fn`` (a generation call inside the rollout) timed into the step's ``generate_seconds``."""
        def timed(*args, **kwargs):
            self._sync()
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            self._sync()
            if self.current is not None:
                self.current.generate_seconds += time.perf_counter() - t
            return out

        return timed

    def count_tokens(self, out: dict) -> None:
        from mixrl.core.provenance import EXPERT  # deferred: imports torch (the config and CLI layers stay light until a run is built)

        mask = out["completion_mask"]
        src = out.get("row_source")
        expert = (src == EXPERT) if src is not None else mask.new_zeros(mask.shape[0], dtype=bool)
        rec = self.current
        rec.rollout_tokens += int(mask[~expert].sum())
        rec.expert_tokens += int(mask[expert].sum())
        rec.prompt_tokens += int(out["prompt_mask"].sum())
        rec.rows += int(mask.shape[0])
        rec.expert_rows += int(expert.sum())
        rec.forward_tokens += int(mask.shape[0]) * (int(out["prompt_mask"].shape[1]) + int(mask.shape[1]))

    def trainer_metrics(self, trainer) -> None:
        """The step's ``batch/padding_fraction`` as a mixrl trainer logged it (the forwards it ran:
        packed, trimmed, in token-budget micro-batches), read before TRL's logging clears it."""
        vals = getattr(trainer, "_metrics", {}).get("train", {}).get("batch/padding_fraction")
        if vals and self.current is not None:
            self.current.padding_fraction = float(vals[-1])

    def callback(self):
        from transformers import TrainerCallback  # deferred: transformers loads only when a model is built or measured

        timer = self

        class _TimerCallback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                timer.begin(state.global_step + 1)

            def on_step_end(self, args, state, control, **kwargs):
                if timer.trainer is not None:
                    timer.trainer_metrics(timer.trainer)
                timer.end()

            def on_train_end(self, args, state, control, **kwargs):
                timer.turns.done(timer.name)

        return _TimerCallback()
