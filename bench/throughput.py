"""Step-time benchmark of mixrl against plain TRL and a bare torch + transformers floor.

    python -m bench.throughput                       # CPU, 3 warm-up + 10 measured steps per variant
    python -m bench.throughput --device cuda         # the same on a GPU
    python -m bench.throughput --warmup 1 --steps 1  # smoke run

One run builds four variants on the same model (the built-in tiny model unless ``--model``),
data (``builtin:arith``) and batch geometry (the default config: 8 prompts x 8 generations,
one micro-batch, 32 new tokens; ``--set KEY=VALUE`` overrides any config value for all):

``trl``    plain ``trl.GRPOTrainer``, with the GRPOConfig that mixrl builds for ``algo=grpo``
           (``mixrl.trainer.build.grpo_args``) and ``loss_type="dapo"``: PPO-clip (eps 0.2 both
           sides) averaged over every completion token of the step, like mixrl's ``token-mean``.
``grpo``   ``MixrlGRPOTrainer`` for ``algo=grpo`` (with the ``metrics.jsonl`` callback that
           ``mixrl train`` adds); its advantage eps is set to TRL's 1e-4 (same numbers).
``chord``  ``MixrlGRPOTrainer`` for ``algo=chord`` (the grpo rollouts + expert rows trained with SFT).
``prefix`` ``algo=prefixrl``: every rollout continues from a prefix of the expert solution (``--only``).
``hint``   ``algo=guide``: failed groups are generated again with a hint (``--only``).
``replay`` ``algo=remix``: replayed past rollouts trained beside the fresh ones (``--only``).
``teacher`` ``algo=kdrl``: GRPO + a reverse KL to the built-in teacher, scored once per batch (``--only``).
``floor``  bare torch + transformers doing the same work: ``model.generate`` for the group,
           reward, group-normalised advantage, one forward + backward over prompt + completion
           with the same PPO-clip token-mean loss, gradient clipping, the same optimizer step.

``--lengths fixed`` (default) suppresses eos until ``max_completion_length`` tokens, so every
variant generates and trains the same number of tokens every step whatever its weights (the
variants' weights drift apart after their first update, and completion lengths with them);
``--lengths sampled`` keeps the training behaviour (stop at eos).

Every variant is timed by the same ``TrainerCallback`` hooks (``on_step_begin`` ->
``on_step_end``; CUDA synchronised) and its rollout phase (generate + score + mixing:
``_generate_and_score_completions``) by a wrapper of that method. With
``--schedule interleaved`` (default) the variants take turns step by step (each in its own
thread, exactly one running at a time, each with its own RNG stream), so a change of
background load hits all of them alike and ratios are taken per round; ``sequential`` runs
one variant after the other. Reported: medians over the measured steps, ratios
(mixrl/TRL, chord/grpo against the ratio of trained tokens, mixrl/floor), memory, and a
cProfile + torch.profiler breakdown of one extra mixrl grpo step (``--profile-out``).
Results: a Rich table, ``--out`` (Markdown) and ``--json``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
VARIANTS = ("trl", "grpo", "chord", "floor", "prefix", "hint", "replay", "teacher")
DEFAULT_VARIANTS = ("trl", "grpo", "chord", "floor")
#: variants that are a mixrl algo of another name
ALGO = {"prefix": "prefixrl", "hint": "guide", "replay": "remix", "teacher": "kdrl"}
DESCRIPTIONS = {
    "trl": "plain trl.GRPOTrainer (loss_type=dapo)",
    "grpo": "mixrl algo=grpo (MixrlGRPOTrainer)",
    "chord": "mixrl algo=chord (rollouts + expert SFT rows)",
    "floor": "bare torch + transformers loop",
    "prefix": "mixrl algo=prefixrl (every rollout continues from a prefix of the expert solution)",
    "hint": "mixrl algo=guide (groups whose rollouts all fail are generated again with a hint)",
    "replay": "mixrl algo=remix (replayed past rollouts beside the fresh ones; half the fresh rollouts per step)",
    "teacher": "mixrl algo=kdrl (grpo + reverse KL to the built-in teacher, one teacher forward per batch)",
}
TARGET_OVERHEAD = 1.05


# --------------------------------------------------------------------------- measurement records
@dataclass
class StepRecord:
    step: int
    seconds: float = 0.0
    rollout_seconds: float = 0.0  # generate + score (+ mixing)
    rollout_tokens: int = 0  # on-policy completion tokens trained on this step
    expert_tokens: int = 0  # expert completion tokens trained on this step (CHORD)
    prompt_tokens: int = 0
    rows: int = 0
    expert_rows: int = 0
    rss_peak_mb: float | None = None  # process RSS high-water mark during this step
    cuda_peak_mb: float | None = None  # torch.cuda.max_memory_allocated during this step
    cuda_base_mb: float | None = None  # torch.cuda.memory_allocated when the step began
    measured: bool = True
    profiled: str = ""

    @property
    def train_seconds(self) -> float:
        return self.seconds - self.rollout_seconds


@dataclass
class VariantResult:
    name: str
    description: str
    records: list[StepRecord] = field(default_factory=list)
    state_mb: float | None = None  # parameters + optimizer state
    error: str | None = None
    generated_tokens: int | None = None  # mixrl's count of every token the policy sampled (all steps)

    def measured(self) -> list[StepRecord]:
        return [r for r in self.records if r.measured]

    def med(self, attr: str) -> float | None:
        vals = [getattr(r, attr) for r in self.measured()]
        vals = [v for v in vals if v is not None]
        return statistics.median(vals) if vals else None

    def quantiles(self, attr: str = "seconds") -> tuple[float, float, float] | None:
        vals = sorted(getattr(r, attr) for r in self.measured())
        if not vals:
            return None
        if len(vals) == 1:
            return vals[0], vals[0], vals[0]
        q = statistics.quantiles(vals, n=4, method="inclusive")
        return vals[0], q[0], q[2]

    def peak(self, attr: str) -> float | None:
        vals = [getattr(r, attr) for r in self.measured() if getattr(r, attr) is not None]
        return max(vals) if vals else None


# --------------------------------------------------------------------------- memory probes
def rss_hwm_mb() -> float:
    """Peak RSS of the process (VmHWM; resettable), else ru_maxrss (lifetime peak)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_rss_peak() -> bool:
    """Reset the RSS high-water mark to the current RSS (Linux >= 4.0); False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


# --------------------------------------------------------------------------- turn taking
class Aborted(RuntimeError):
    """Another variant failed; this one stops."""


class Turns:
    """Lets participants run one step at a time, round-robin. A participant holds the turn
    from its ``take()`` (at step begin) until its next ``take()`` or ``done()``, so all its
    work between steps (logging, data loading) is exclusive too. The first round starts when
    every participant has reached its first ``take()`` (their set-up, which touches the global
    RNG, never overlaps a step). Each participant has its own RNG stream: seeded at its first
    turn, saved and restored around every switch, so it draws what it would draw alone. With
    ``interleaved=False`` the participants run one after another (``take`` only seeds)."""

    def __init__(self, names: list[str], seed: int, interleaved: bool, device: str):
        self.order = list(names)
        self.alive = set(names)
        self.turn = 0
        self.holder: str | None = None
        self.interleaved = interleaved
        self.seed = seed
        self.cuda = device == "cuda"
        self.cv = threading.Condition()
        self.error: BaseException | None = None
        self.rng: dict[str, Any] = {}
        self.arrived: set[str] = set()
        self.timeout = 1800.0  # seconds a participant waits for its turn before the run is declared stuck
        self.rss_reset_ok = True

    # RNG streams
    def _save_rng(self, name: str) -> None:
        import random

        import numpy as np
        import torch

        self.rng[name] = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
                          torch.cuda.get_rng_state_all() if self.cuda else None)

    def _load_rng(self, name: str) -> None:
        import random

        import numpy as np
        import torch

        state = self.rng.get(name)
        if state is None:  # first turn: seeded as transformers.set_seed does
            random.seed(self.seed)
            np.random.seed(self.seed)
            torch.manual_seed(self.seed)
            if self.cuda:
                torch.cuda.manual_seed_all(self.seed)
            return
        random.setstate(state[0])
        np.random.set_state(state[1])
        torch.set_rng_state(state[2])
        if state[3] is not None:
            torch.cuda.set_rng_state_all(state[3])

    def _advance(self) -> None:
        self.holder = None
        n = len(self.order)
        for k in range(1, n + 1):
            j = (self.turn + k) % n
            if self.order[j] in self.alive:
                self.turn = j
                break
        self.cv.notify_all()

    def take(self, name: str) -> None:
        if not self.interleaved:
            if name not in self.rng:
                self._load_rng(name)
                self.rng[name] = "started"
            return
        with self.cv:
            if self.holder == name:
                self._save_rng(name)
                self._advance()
            if name not in self.arrived:
                self.arrived.add(name)
                self.cv.notify_all()
            if not self.cv.wait_for(lambda: self.error is not None
                                    or (self.arrived >= self.alive and self.order[self.turn] == name), timeout=self.timeout):
                self.error = RuntimeError(f"{name} waited {self.timeout:.0f}s for its turn (holder: {self.holder}); giving up")
                self.cv.notify_all()
                raise self.error
            if self.error is not None:
                raise Aborted(f"{name}: stopped because another variant failed")
            self.holder = name
            self._load_rng(name)

    def done(self, name: str) -> None:
        if not self.interleaved:
            return
        with self.cv:
            if name not in self.alive:
                return
            self.alive.discard(name)
            if self.order[self.turn] == name:
                self._advance()
            self.cv.notify_all()

    def abort(self, error: BaseException) -> None:
        with self.cv:
            if self.error is None:
                self.error = error
            self.cv.notify_all()


# --------------------------------------------------------------------------- the timing hook
class StepTimer:
    """Per-step measurements shared by every variant: ``begin()`` at step begin (takes the
    turn, resets memory peaks, starts the clock), ``end()`` at step end; ``rollout()`` wraps
    the rollout phase. ``profile`` maps a step number to "cprofile" or "torch"."""

    def __init__(self, name: str, turns: Turns, device: str, warmup: int, total_steps: int,
                 profile: dict[int, str] | None = None, log: Callable[[str], None] | None = None):
        self.name = name
        self.turns = turns
        self.cuda = device == "cuda"
        self.warmup = warmup
        self.total = total_steps
        self.profile = profile or {}
        self.log = log
        self.result = VariantResult(name, DESCRIPTIONS.get(name, name))
        self.current: StepRecord | None = None
        self._t0 = 0.0
        self.cprofile: cProfile.Profile | None = None
        self.torch_profile = None
        self._torch_prof_ctx = None

    def _sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def begin(self, step: int) -> None:
        self.turns.take(self.name)
        self._sync()
        rec = StepRecord(step=step, measured=self.warmup < step <= self.total and step not in self.profile)
        rec.profiled = self.profile.get(step, "")
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats()
            rec.cuda_base_mb = torch.cuda.memory_allocated() / 2**20
        if not reset_rss_peak():
            self.turns.rss_reset_ok = False
        self.current = rec
        if rec.profiled == "cprofile":
            self.cprofile = cProfile.Profile()
            self.cprofile.enable()
        elif rec.profiled == "torch":
            import torch

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
            import torch

            rec.cuda_peak_mb = torch.cuda.max_memory_allocated() / 2**20
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

    def count_tokens(self, out: dict) -> None:
        from mixrl.core.provenance import EXPERT

        mask = out["completion_mask"]
        src = out.get("row_source")
        expert = (src == EXPERT) if src is not None else mask.new_zeros(mask.shape[0], dtype=bool)
        rec = self.current
        rec.rollout_tokens += int(mask[~expert].sum())
        rec.expert_tokens += int(mask[expert].sum())
        rec.prompt_tokens += int(out["prompt_mask"].sum())
        rec.rows += int(mask.shape[0])
        rec.expert_rows += int(expert.sum())

    def callback(self):
        from transformers import TrainerCallback

        timer = self

        class _TimerCallback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                timer.begin(state.global_step + 1)

            def on_step_end(self, args, state, control, **kwargs):
                timer.end()

            def on_train_end(self, args, state, control, **kwargs):
                timer.turns.done(timer.name)

        return _TimerCallback()


# --------------------------------------------------------------------------- building the variants
FIXED_LENGTH = {"on": False}


def generation_kwargs(cfg) -> dict | None:
    """--lengths fixed: every completion has max_completion_length tokens (eos suppressed until
    then), so every variant does the same work every step whatever its weights."""
    return {"min_new_tokens": int(cfg.trainer.max_completion_length)} if FIXED_LENGTH["on"] else None


def compose(algo: str, overrides: list[str], steps: int):
    from mixrl.config.compose import compose_config

    extra = ["algo.advantage.eps=1e-4"] if algo == "grpo" else []  # TRL's eps: same numbers as the trl variant
    return compose_config([f"algo={algo}", *overrides, *extra, f"trainer.max_steps={steps}"])


def build_mixrl_trainer(cfg, out_dir: Path, callbacks: list):
    """A MixrlGRPOTrainer built from a config with the assembly ``mixrl.trainer.run.train`` uses."""
    from mixrl.trainer import build
    from mixrl.trainer.callbacks import MetricsJsonlCallback

    return build.trainer_from_config(
        cfg, run_dir=out_dir, callbacks=[MetricsJsonlCallback(out_dir / "metrics.jsonl"), *callbacks],
        generation_kwargs=generation_kwargs(cfg),
    )


def build_trl_trainer(cfg, out_dir: Path, callbacks: list):
    """Plain ``trl.GRPOTrainer`` with the GRPOConfig mixrl builds for the same config."""
    from transformers import PrinterCallback
    from trl import GRPOTrainer

    from mixrl.config.geometry import geometry
    from mixrl.trainer import build

    geom = geometry(cfg)
    model_path = build.resolve_model_path(cfg, progress=False)
    tokenizer = build.load_tokenizer(model_path, cfg)
    reward_funcs, reward_weights = build.build_reward_funcs(cfg)
    args = build.grpo_args(cfg, out_dir, geom)
    args.reward_weights = reward_weights
    args.generation_kwargs = generation_kwargs(cfg)
    args.loss_type = "dapo"  # token-mean over every completion token of the step (mixrl: aggregation token-mean)
    args.epsilon = args.epsilon_high = float(cfg.algo.loss.get("clip_low", 0.2))
    args.scale_rewards = "group"  # (r - mean_g) / (std_g + 1e-4): mixrl's grpo advantage (eps set to 1e-4)
    trainer = GRPOTrainer(model=model_path, reward_funcs=reward_funcs, args=args, train_dataset=build.load_train_rows(cfg),
                          processing_class=tokenizer, callbacks=callbacks)
    trainer.remove_callback(PrinterCallback)
    return trainer


class FloorLoop:
    """The same work as one GRPO step, written directly with torch + transformers."""

    def __init__(self, cfg, timer: StepTimer, steps: int, device: str, out_dir: Path):
        import torch
        from transformers import AutoModelForCausalLM, GenerationConfig, Trainer

        from mixrl.config.geometry import geometry
        from mixrl.trainer import build

        self.cfg, self.timer, self.steps, self.device = cfg, timer, steps, device
        self.geom = geometry(cfg)
        path = build.resolve_model_path(cfg, progress=False)
        self.tok = build.load_tokenizer(path, cfg)
        self.rows = build.load_train_rows(cfg).to_list()
        self.reward_fn = build.build_reward_funcs(cfg)[0][0]
        args = build.grpo_args(cfg, out_dir, self.geom)  # the same optimizer, sampling and clipping settings
        self.args = args
        dtype = None if cfg.model.dtype == "auto" else getattr(torch, cfg.model.dtype)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
        self.model.train()
        opt_cls, opt_kwargs = Trainer.get_optimizer_cls_and_kwargs(args, self.model)
        self.opt = opt_cls(self.model.parameters(), weight_decay=args.weight_decay, **opt_kwargs)
        self.gen = GenerationConfig(
            max_new_tokens=args.max_completion_length, do_sample=True, pad_token_id=self.tok.pad_token_id,
            bos_token_id=self.tok.bos_token_id, eos_token_id=[self.tok.eos_token_id], temperature=args.temperature,
            top_p=args.top_p, top_k=args.top_k, min_p=args.min_p, repetition_penalty=args.repetition_penalty,
            cache_implementation=args.cache_implementation, disable_compile=True, **(generation_kwargs(cfg) or {}),
        )
        self.clip = float(cfg.algo.loss.get("clip_low", 0.2))
        g = torch.Generator().manual_seed(int(cfg.seed))
        self.order = torch.randperm(len(self.rows), generator=g).tolist()
        self.autocast = torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bool(args.bf16))

    def rollout(self, step: int) -> dict:
        import torch

        P, G = self.geom.prompts_per_step, self.geom.num_generations
        batch = [self.rows[self.order[(step * P + i) % len(self.rows)]] for i in range(P)]
        enc = self.tok([r["prompt"] for r in batch], return_tensors="pt", padding=True, padding_side="left").to(self.device)
        prompt_ids = enc["input_ids"].repeat_interleave(G, 0)
        prompt_mask = enc["attention_mask"].repeat_interleave(G, 0)
        with torch.no_grad(), self.autocast:
            out = self.model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=self.gen)
        completion_ids = out[:, prompt_ids.shape[1]:]
        is_eos = completion_ids == self.tok.eos_token_id
        first = torch.where(is_eos.any(1), is_eos.int().argmax(1), completion_ids.shape[1])
        completion_mask = (torch.arange(completion_ids.shape[1], device=self.device)[None] <= first[:, None]).int()
        texts = self.tok.batch_decode(completion_ids.masked_fill(completion_mask == 0, self.tok.pad_token_id), skip_special_tokens=True)
        kwargs = {k: [r[k] for r in batch for _ in range(G)] for k in batch[0] if k != "prompt"}
        rewards = torch.tensor([float(x or 0.0) for x in self.reward_fn(prompts=[r["prompt"] for r in batch for _ in range(G)],
                                                                        completions=texts, **kwargs)], device=self.device)
        grouped = rewards.view(P, G)
        adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(-1)
        return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
                "completion_mask": completion_mask, "advantages": adv}

    def train_step(self, batch: dict) -> None:
        import torch

        n_tokens = batch["completion_mask"].sum().clamp(min=1)
        M = self.geom.micro_batch_size
        C = batch["completion_ids"].shape[1]
        for s in range(0, batch["completion_ids"].shape[0], M):
            ids = torch.cat([batch["prompt_ids"][s:s + M], batch["completion_ids"][s:s + M]], 1)
            att = torch.cat([batch["prompt_mask"][s:s + M], batch["completion_mask"][s:s + M]], 1)
            mask = batch["completion_mask"][s:s + M].float()
            with self.autocast:
                logits = self.model(input_ids=ids, attention_mask=att, logits_to_keep=C + 1, use_cache=False).logits
            logits = logits[:, :-1].float() / self.args.temperature
            logp = torch.log_softmax(logits, -1).gather(-1, batch["completion_ids"][s:s + M].unsqueeze(-1)).squeeze(-1)
            ratio = torch.exp(logp - logp.detach())
            a = batch["advantages"][s:s + M].unsqueeze(1)
            loss = -torch.min(ratio * a, ratio.clamp(1 - self.clip, 1 + self.clip) * a)
            ((loss * mask).sum() / n_tokens).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def train(self) -> None:
        try:
            for step in range(1, self.steps + 1):
                self.timer.begin(step)
                batch = self.timer.rollout(lambda s=step: self.rollout(s))()
                self.train_step(batch)
                self.timer.end()
        finally:
            self.timer.turns.done(self.timer.name)


def state_mb(model, optimizer) -> float:
    import torch

    total = sum(p.numel() * p.element_size() for p in model.parameters())
    opt = getattr(optimizer, "optimizer", optimizer)
    for st in getattr(opt, "state", {}).values():
        for v in st.values():
            if isinstance(v, torch.Tensor):
                total += v.numel() * v.element_size()
    return total / 2**20


# --------------------------------------------------------------------------- machine / report helpers
def machine_info(device: str) -> dict:
    import torch
    import transformers
    import trl

    cpu_model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "cpu": cpu_model, "cpu_count": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch_threads": torch.get_num_threads(), "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "trl": trl.__version__, "device": device, "platform": platform.platform(),
    }
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    return info


def git_commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        return sha + (" (+ uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def paired_ratio(a: VariantResult | None, b: VariantResult | None, attr: str = "seconds") -> dict | None:
    """Median over rounds of a_i / b_i (the i-th measured step of each) and the ratio of medians."""
    if a is None or b is None or not a.measured() or not b.measured():
        return None
    pairs = [getattr(x, attr) / getattr(y, attr) for x, y in zip(a.measured(), b.measured()) if getattr(y, attr) > 0]
    ma, mb = a.med(attr), b.med(attr)
    mins = [min(getattr(r, attr) for r in v.measured()) for v in (a, b)]
    return {
        "ratio_of_mins": (mins[0] / mins[1]) if mins[1] > 0 else None,
        "paired_median": statistics.median(pairs) if pairs else None,
        "paired_min": min(pairs) if pairs else None,
        "paired_max": max(pairs) if pairs else None,
        "ratio_of_medians": (ma / mb) if ma and mb else None,
        "n": len(pairs),
    }


def fmt(v: float | None, spec: str = ".3f", unit: str = "") -> str:
    return "–" if v is None else f"{v:{spec}}{unit}"


# --------------------------------------------------------------------------- the run
def run(opts: argparse.Namespace, log: Callable[[str], None]) -> dict:
    import torch
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        import datasets

        datasets.disable_progress_bars()
    except ImportError:
        pass
    if opts.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but torch.cuda.is_available() is False")
    if opts.threads:
        torch.set_num_threads(opts.threads)
    FIXED_LENGTH["on"] = opts.lengths == "fixed"
    variants = [v.strip() for v in opts.only.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise SystemExit(f"error: unknown variant(s) {', '.join(bad)}; choose from {', '.join(VARIANTS)}")
    load_before = loadavg()
    tmp = Path(tempfile.mkdtemp(prefix="mixrl-bench-"))
    overrides = ["logger.progress=false", "trainer.eval_size=0", "trainer.save_steps=0", *opts.set]
    if opts.model:
        overrides.append(f"model.path={opts.model}")
    if opts.device == "cuda":
        overrides.append("hardware.device=cuda")
    W, S = opts.warmup, opts.steps
    profile_steps: dict[int, str] = {}
    if opts.profile_out and "grpo" in variants:
        profile_steps = {W + S + 1: "cprofile", W + S + 2: "torch"}
    turns = Turns(variants, seed=0, interleaved=opts.schedule == "interleaved", device=opts.device)
    participants: dict[str, tuple[StepTimer, Any]] = {}
    from mixrl.config.geometry import geometry

    geom = geometry(compose("grpo", overrides, 1))  # checks the overrides before any model loads
    geom_text = geom.describe()
    chord_rows = geometry(compose("chord", overrides, 1)).expert_rows_per_step if "chord" in variants else 0
    t_setup = time.perf_counter()
    # the floor first: creating TrainingArguments resets accelerate's shared state, which each
    # trainer built after it sets up again
    for name in sorted(variants, key=lambda v: v != "floor"):
        total = W + S + (len(profile_steps) if name == "grpo" else 0)
        timer = StepTimer(name, turns, opts.device, W, W + S, profile_steps if name == "grpo" else None,
                          log=None if opts.quiet else log)
        cfg = compose("grpo" if name in ("trl", "floor") else ALGO.get(name, name), overrides, total)
        if name == "floor":
            runner = FloorLoop(cfg, timer, total, opts.device, tmp / name)
        else:
            builder = build_trl_trainer if name == "trl" else build_mixrl_trainer
            runner = builder(cfg, tmp / name, [timer.callback()])
            runner._generate_and_score_completions = timer.rollout(runner._generate_and_score_completions)
        participants[name] = (timer, runner)
        log(f"built {name}: {DESCRIPTIONS[name]}")
    participants = {name: participants[name] for name in variants}
    setup_s = time.perf_counter() - t_setup

    def go(name: str) -> None:
        timer, runner = participants[name]
        try:
            runner.train()
        except Aborted:
            pass
        except BaseException as e:  # noqa: BLE001 - reported below
            timer.result.error = f"{type(e).__name__}: {e}"
            turns.abort(e)
            raise
        finally:
            turns.done(name)

    if profile_steps:  # let the profiler register in this (main) thread before a bench thread uses it
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            torch.zeros(1).add_(1)
    t_run = time.perf_counter()
    errors: list[BaseException] = []
    if turns.interleaved:
        threads = []
        for name in variants:
            def target(n=name):
                try:
                    go(n)
                except BaseException as e:  # noqa: BLE001
                    errors.append(e)

            th = threading.Thread(target=target, name=f"bench-{name}", daemon=True)
            threads.append(th)
            th.start()
        for th in threads:
            th.join()
    else:
        for name in variants:
            try:
                go(name)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)
                break
    run_s = time.perf_counter() - t_run
    if errors:
        raise errors[0]

    results: dict[str, VariantResult] = {}
    for name, (timer, runner) in participants.items():
        res = timer.result
        if name == "floor":
            res.state_mb = state_mb(runner.model, runner.opt)
        else:
            res.state_mb = state_mb(runner.model, runner.optimizer)
            res.generated_tokens = getattr(runner, "mixrl_generated_tokens", None)
        results[name] = res

    profile_text = None
    if profile_steps and "grpo" in participants:
        profile_text = render_profile(participants["grpo"][0], opts)
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)  # the trainers' output folders (metrics.jsonl, checkpoints: none)

    info = machine_info(opts.device)
    return {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(["python -m bench.throughput", *([shlex.join(opts.argv)] if opts.argv else [])]),
        "commit": git_commit(),
        "machine": info,
        "load_before": load_before,
        "load_after": loadavg(),
        "geometry": geom_text,
        "rollouts_per_step": geom.rollouts_per_step,
        "chord_expert_rows": chord_rows,
        "overrides": overrides,
        "warmup": W,
        "steps": S,
        "schedule": opts.schedule,
        "lengths": opts.lengths,
        "rss_reset": turns.rss_reset_ok,
        "process_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "setup_seconds": setup_s,
        "run_seconds": run_s,
        "results": results,
        "profile_text": profile_text,
    }


def _short_paths(text: str) -> str:
    """site-packages/ and repository prefixes removed from file names."""
    import site
    import sysconfig

    prefixes = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    for pre in sorted(prefixes, key=len, reverse=True):
        text = text.replace(pre.rstrip(os.sep) + os.sep, "")
    return text.replace(str(REPO) + os.sep, "")


def render_profile(timer: StepTimer, opts) -> str:
    out = io.StringIO()
    out.write(f"# cProfile and torch.profiler of one mixrl algo=grpo step\n# command: python -m bench.throughput {shlex.join(opts.argv)}".rstrip() + "\n")
    out.write(f"# commit {git_commit()}, {datetime.now().astimezone().isoformat(timespec='seconds')}, device {opts.device}\n")
    out.write("# these steps are profiled after the measured steps and are not part of the timings; cProfile\n"
              "# inflates Python-heavy code, so read shares, not absolute times.\n\n")
    recs = {r.profiled: r for r in timer.result.records if r.profiled}
    if timer.cprofile is not None:
        r = recs.get("cprofile")
        out.write(f"## cProfile (step {r.step if r else '?'}, {r.seconds if r else float('nan'):.3f}s with the profiler on)\n\n")
        s = io.StringIO()
        st = pstats.Stats(timer.cprofile, stream=s)
        st.sort_stats("cumulative").print_stats(45)
        out.write(_short_paths(s.getvalue()))
        # mixrl's own code: where the subclass and the objective spend their time
        out.write("\n## mixrl functions (cumulative seconds in this step; nested calls overlap)\n\n")
        rows = []
        for (fname, line, func), (cc, nc, tt, ct, _) in st.stats.items():  # type: ignore[attr-defined]
            if f"{os.sep}mixrl{os.sep}" in fname and f"{os.sep}bench{os.sep}" not in fname:
                rows.append((ct, tt, nc, f"{Path(fname).relative_to(REPO) if str(fname).startswith(str(REPO)) else fname}:{line}({func})"))
        for ct, tt, nc, where in sorted(rows, reverse=True)[:25]:
            out.write(f"{ct:9.4f} cum {tt:9.4f} self {nc:6d} calls  {where}\n")
        s = io.StringIO()
        pstats.Stats(timer.cprofile, stream=s).sort_stats("tottime").print_stats(25)
        out.write("\n## cProfile by self time\n\n" + _short_paths(s.getvalue()))
    if timer.torch_profile is not None:
        r = recs.get("torch")
        sort = "cuda_time_total" if opts.device == "cuda" else "cpu_time_total"
        out.write(f"\n## torch.profiler (step {r.step if r else '?'}), top operators by {sort}\n\n")
        out.write(timer.torch_profile.key_averages().table(sort_by=sort, row_limit=30))
        out.write("\n")
    return out.getvalue()


# --------------------------------------------------------------------------- reporting
def summary_rows(rep: dict) -> list[dict]:
    res: dict[str, VariantResult] = rep["results"]
    cuda = rep["machine"]["device"] == "cuda"
    rows = []
    for name, r in res.items():
        q = r.quantiles()
        row = {
            "variant": name, "what": r.description, "n": len(r.measured()),
            "step_s": r.med("seconds"), "min_s": q[0] if q else None, "p25_s": q[1] if q else None, "p75_s": q[2] if q else None,
            "rollout_s": r.med("rollout_seconds"), "train_s": r.med("train_seconds"),
            "rollout_tokens": r.med("rollout_tokens"), "expert_tokens": r.med("expert_tokens"),
            "rss_peak_mb": r.peak("rss_peak_mb"), "state_mb": r.state_mb,
        }
        if cuda:
            row["cuda_peak_mb"] = r.peak("cuda_peak_mb")
        rows.append(row)
    return rows


def ratios(rep: dict) -> dict:
    res: dict[str, VariantResult] = rep["results"]
    g, t, c, f = (res.get(k) for k in ("grpo", "trl", "chord", "floor"))
    out: dict[str, Any] = {}
    if g and t:
        gt, tt = g.med("rollout_tokens"), t.med("rollout_tokens")
        out["grpo_vs_trl"] = {"step": paired_ratio(g, t), "rollout": paired_ratio(g, t, "rollout_seconds"),
                              "train": paired_ratio(g, t, "train_seconds"), "tokens_ratio": (gt / tt) if gt and tt else None,
                              "same_tokens_every_step": [r.rollout_tokens for r in g.records[:len(t.records)]]
                              == [r.rollout_tokens for r in t.records[:len(g.records)]]}
    if c and g:
        rt, et = c.med("rollout_tokens") or 0, c.med("expert_tokens") or 0
        out["chord_vs_grpo"] = {"step": paired_ratio(c, g), "rollout": paired_ratio(c, g, "rollout_seconds"),
                                "train": paired_ratio(c, g, "train_seconds"),
                                "expert_over_rollout_tokens": (et / rt) if rt else None,
                                "rows_ratio": (c.med("rows") / g.med("rows")) if g.med("rows") else None,
                                "trained_tokens_ratio": ((rt + et) / g.med("rollout_tokens")) if g.med("rollout_tokens") else None}
    if g and f:
        gt, ft = g.med("rollout_tokens"), f.med("rollout_tokens")
        out["grpo_vs_floor"] = {"step": paired_ratio(g, f), "rollout": paired_ratio(g, f, "rollout_seconds"),
                                "train": paired_ratio(g, f, "train_seconds"),
                                "tokens_ratio": (gt / ft) if gt and ft else None}
    if t and f:
        out["trl_vs_floor"] = {"step": paired_ratio(t, f)}
    for name in ("prefix", "hint", "replay", "teacher"):  # the cost over grpo against the extra tokens trained and generated
        x = res.get(name)
        if x and g:
            gt = g.med("rollout_tokens")
            out[f"{name}_vs_grpo"] = {
                "step": paired_ratio(x, g), "rollout": paired_ratio(x, g, "rollout_seconds"), "train": paired_ratio(x, g, "train_seconds"),
                "trained_tokens_ratio": (x.med("rollout_tokens") / gt) if gt else None,
                # per step run: grpo runs extra profiling steps, so totals would not compare
                "generated_tokens_ratio": ((x.generated_tokens / len(x.records)) / (g.generated_tokens / len(g.records))
                                           if x.generated_tokens and g.generated_tokens and x.records and g.records else None),
            }
    return out


def _r(d: dict | None, key: str = "paired_median") -> str:
    return fmt(d.get(key) if d else None, ".3f")


def rich_tables(rep: dict):
    from rich.table import Table

    rows = summary_rows(rep)
    cuda = rep["machine"]["device"] == "cuda"
    t = Table(title=f"mixrl step-time benchmark ({rep['machine']['device']}, median of {rep['steps']} steps after {rep['warmup']} warm-up, {rep['schedule']})")
    cols = ["variant", "step s", "min s", "IQR s", "rollout s", "train s", "rollout tok", "expert tok", "state MB",
            "RSS peak MB"] + (["CUDA peak MB"] if cuda else [])
    for i, col in enumerate(cols):
        t.add_column(col, justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(r["variant"], fmt(r["step_s"]), fmt(r["min_s"]), f"{fmt(r['p25_s'])}–{fmt(r['p75_s'])}", fmt(r["rollout_s"]),
                  fmt(r["train_s"]), fmt(r["rollout_tokens"], ".0f"), fmt(r["expert_tokens"], ".0f"), fmt(r["state_mb"], ".1f"),
                  fmt(r["rss_peak_mb"], ".0f"), *([fmt(r.get("cuda_peak_mb"), ".1f")] if cuda else []))
    t.caption = f"geometry: {rep['geometry']}"
    rt = Table(title="ratios (median over rounds of per-round ratios; min step / min step)")
    for col in ("comparison", "step", "min/min", "rollout phase", "train phase", "note"):
        rt.add_column(col, justify="left" if col in ("comparison", "note") else "right")
    for label, d, note in ratio_lines(rep):
        rt.add_row(label, _r(d.get("step")), _r(d.get("step"), "ratio_of_mins"), _r(d.get("rollout")), _r(d.get("train")), note)
    return t, rt


def ratio_lines(rep: dict) -> list[tuple[str, dict, str]]:
    r = ratios(rep)
    lines = []
    if "grpo_vs_trl" in r:
        d = r["grpo_vs_trl"]
        v = (d["step"] or {}).get("paired_median")
        verdict = "–" if v is None else ("target met" if v <= TARGET_OVERHEAD else "target NOT met")
        lo, hi = (d["step"] or {}).get("paired_min"), (d["step"] or {}).get("paired_max")
        if v is not None and lo and hi and hi / lo > 1.2:
            verdict += f" (noisy: per-round ratios span {lo:.2f}–{hi:.2f}; re-measure on a quiet machine)"
        lines.append(("(1) mixrl grpo / plain TRL", d,
                      f"target ≤ {TARGET_OVERHEAD}: {verdict}; same rollout tokens as TRL at every step: "
                      f"{'yes' if d['same_tokens_every_step'] else 'no'}"))
    if "chord_vs_grpo" in r:
        d = r["chord_vs_grpo"]
        lines.append(("(2) mixrl chord / mixrl grpo", d,
                      f"expert/rollout tokens {fmt(d['expert_over_rollout_tokens'], '.3f')}; trained tokens chord/grpo "
                      f"{fmt(d['trained_tokens_ratio'], '.3f')}; rows (padded to one width) chord/grpo {fmt(d['rows_ratio'], '.3f')}"))
    if "grpo_vs_floor" in r:
        d = r["grpo_vs_floor"]
        lines.append(("(3) mixrl grpo / torch floor", d, f"rollout tokens grpo/floor {fmt(d['tokens_ratio'], '.3f')}"))
    if "trl_vs_floor" in r:
        lines.append(("    plain TRL / torch floor", r["trl_vs_floor"], ""))
    for name, label in (("prefix", "(4) mixrl prefixrl / mixrl grpo"), ("hint", "(5) mixrl guide / mixrl grpo"),
                        ("replay", "(6) mixrl remix / mixrl grpo"), ("teacher", "(7) mixrl kdrl / mixrl grpo")):
        if f"{name}_vs_grpo" in r:
            d = r[f"{name}_vs_grpo"]
            lines.append((label, d, f"trained tokens {fmt(d['trained_tokens_ratio'], '.3f')}; generated tokens (all steps) "
                                    f"{fmt(d['generated_tokens_ratio'], '.3f')}"))
    return lines


def markdown(rep: dict, profile_path: str | None) -> str:
    m = rep["machine"]
    cuda = m["device"] == "cuda"
    lines = [
        "# mixrl step-time benchmark",
        "",
        f"Re-measure with `{rep['command']}` (from the repository root; `--help` for the flags).",
        "",
        f"- date: {rep['date']}",
        f"- commit: `{rep['commit']}`",
        f"- machine: {m['cpu']}, {m['cpu_count']} CPUs ({m['affinity']} usable), torch threads {m['torch_threads']}"
        + (f"; GPU {m['gpu']} (CUDA {m['cuda']})" if cuda else ""),
        f"- software: Python {m['python']}, torch {m['torch']}, transformers {m['transformers']}, trl {m['trl']}",
        f"- device: {m['device']}; load average before/after: {rep['load_before']} / {rep['load_after']}",
        f"- geometry: {rep['geometry']}; config overrides: `{' '.join(rep['overrides'])}`",
        f"- steps: {rep['warmup']} warm-up + {rep['steps']} measured per variant, schedule `{rep['schedule']}`; "
        f"setup {rep['setup_seconds']:.0f}s, run {rep['run_seconds']:.0f}s",
        "",
        "## Step time",
        "",
    ]
    head = ["variant", "what", "step s (median)", "min s", "IQR s", "rollout s", "train s", "rollout tokens", "expert tokens",
            "state MB", "RSS peak MB"] + (["CUDA peak MB"] if cuda else [])
    lines += ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for r in summary_rows(rep):
        cells = [f"`{r['variant']}`", r["what"], fmt(r["step_s"]), fmt(r["min_s"]), f"{fmt(r['p25_s'])}–{fmt(r['p75_s'])}",
                 fmt(r["rollout_s"]), fmt(r["train_s"]), fmt(r["rollout_tokens"], ".0f"), fmt(r["expert_tokens"], ".0f"),
                 fmt(r["state_mb"], ".1f"), fmt(r["rss_peak_mb"], ".0f")] + ([fmt(r.get("cuda_peak_mb"), ".1f")] if cuda else [])
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "*rollout* = generate + score (+ mixing: `_generate_and_score_completions`), *train* = step − rollout "
        "(forward, backward, optimizer, logging). Tokens are completion tokens per step (medians).",
        "",
        "## Ratios",
        "",
        "Median over rounds of the per-round ratio (round *i* = the *i*-th measured step of each variant; "
        "min–max over rounds in brackets); *min/min*: the ratio of the fastest measured steps, the least disturbed "
        "by background load on a shared machine.",
        "",
        "| comparison | step | min/min | rollout phase | train phase | note |",
        "|---|---:|---:|---:|---:|---|",
    ]

    def cell(d):
        if not d or d.get("paired_median") is None:
            return "–"
        return f"{d['paired_median']:.3f} [{d['paired_min']:.2f}–{d['paired_max']:.2f}]"

    for label, d, note in ratio_lines(rep):
        lines.append(f"| {label.strip()} | {cell(d.get('step'))} | {_r(d.get('step'), 'ratio_of_mins')} | {cell(d.get('rollout'))} "
                     f"| {cell(d.get('train'))} | {note} |")
    rss_note = ("RSS peak = the process's resident-set high-water mark during the variant's measured steps (reset at every "
                "step begin through /proc/self/clear_refs)" if rep["rss_reset"] else
                "RSS peak = the process's lifetime ru_maxrss (resetting the high-water mark was not permitted here), so it only grows")
    lines += [
        "",
        "## Memory",
        "",
        f"- state MB = parameters + optimizer state of the variant's model. {rss_note}; all variants live in one process, "
        f"so it includes the others' resident memory. Process peak RSS: {rep['process_peak_rss_mb']:.0f} MB.",
    ]
    if cuda:
        lines.append("- CUDA peak MB = `torch.cuda.max_memory_allocated()` during the step (reset at every step begin).")
    lines += [
        "- tracemalloc is not used: it sees only Python-heap allocations, not torch tensors, and slows Python code.",
        "",
        "## What is compared",
        "",
        "- `trl`: `trl.GRPOTrainer` with the `GRPOConfig` that `mixrl.trainer.build.grpo_args` builds for `algo=grpo` "
        "(same num_generations, batch, learning rate, max_completion_length, temperature, optimizer) and "
        "`loss_type=\"dapo\"` (PPO-clip, eps 0.2 both sides, summed over all completion tokens of the step and divided by "
        "their number: mixrl's `token-mean`), `scale_rewards=\"group\"`, `beta=0`.",
        "- `grpo`: `MixrlGRPOTrainer`, built from `compose_config([\"algo=grpo\", ...])` as `mixrl train` builds it "
        "(including the metrics.jsonl callback), with `algo.advantage.eps=1e-4` (TRL's constant): both trainers compute "
        "the same loss and, with the same seed, follow the same trajectory (with `--lengths sampled` their per-step "
        "rollout token counts are identical: see the note of ratio (1)).",
        "- `chord`: `MixrlGRPOTrainer` for `algo=chord`: the same rollouts plus expert rows trained with SFT "
        f"({rep['chord_expert_rows']} expert rows per {rep['rollouts_per_step']} rollouts).",
        f"- `floor`: torch + transformers only: `model.generate` for the {rep['rollouts_per_step']} completions (same sampling settings), reward, "
        "group-normalised advantage, forward (`logits_to_keep`) + log-softmax + PPO-clip token-mean + backward per "
        "micro-batch, gradient clipping, the optimizer TRL uses (`Trainer.get_optimizer_cls_and_kwargs`). No entropy, "
        "no metrics. Its prompts are drawn by its own permutation.",
        "- Completion lengths: " + ("`--lengths fixed`: eos is suppressed until `max_completion_length` tokens "
        "(`min_new_tokens`), so every variant generates and trains the same number of tokens every step."
        if rep["lengths"] == "fixed" else "`--lengths sampled`: completions stop at eos as in training, so the variants' "
        "token counts differ from step to step (see the token columns)."),
        "- Every variant is timed by the same hooks: a `TrainerCallback` (`on_step_begin` → `on_step_end`, CUDA "
        "synchronised) for the trainers, the same `begin`/`end` calls in the floor's loop.",
    ]
    if rep["schedule"] == "interleaved":
        lines.append("- Interleaved schedule: the variants run in threads that take turns step by step (one runs at a "
                     "time, each with its own RNG stream), so background load changes hit every variant alike.")
    if profile_path:
        lines += ["", f"Profile of one mixrl grpo step (cProfile by cumulative time, mixrl's own functions, torch.profiler "
                      f"operators): [`{profile_path}`]({os.path.relpath(profile_path, 'docs/results') if profile_path.startswith('docs/results') else profile_path})."]
    lines += ["", "<details><summary>per-step seconds (measured steps)</summary>", ""]
    for name, r in rep["results"].items():
        lines.append(f"- `{name}`: " + ", ".join(f"{x.seconds:.3f}" for x in r.measured()))
    lines += ["", "</details>", ""]
    return "\n".join(lines)


def to_json(rep: dict) -> dict:
    d = {k: v for k, v in rep.items() if k not in ("results", "profile_text")}
    d["results"] = {k: asdict(v) for k, v in rep["results"].items()}
    d["summary"] = summary_rows(rep)
    d["ratios"] = ratios(rep)
    return d


# --------------------------------------------------------------------------- CLI
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--warmup", type=int, default=3, help="warm-up steps per variant (not measured; default 3)")
    p.add_argument("--steps", type=int, default=10, help="measured steps per variant (default 10)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--only", default=",".join(DEFAULT_VARIANTS),
                   help=f"variants to run (default {','.join(DEFAULT_VARIANTS)}; also: {', '.join(v for v in VARIANTS if v not in DEFAULT_VARIANTS)})")
    p.add_argument("--schedule", choices=("interleaved", "sequential"), default="interleaved",
                   help="interleaved (default): variants take turns step by step; sequential: one after the other")
    p.add_argument("--lengths", choices=("fixed", "sampled"), default="fixed",
                   help="fixed (default): every completion is max_completion_length tokens (eos suppressed), the same "
                   "work in every variant and step; sampled: completions stop at eos, as in training")
    p.add_argument("--model", default=None, help="model folder (default: the built-in tiny model, mixrl.models.tiny.warm_start())")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every variant, e.g. --set trainer.prompts_per_step=4 (repeatable)")
    p.add_argument("--out", default="docs/results/bench.md", help="Markdown report ('' to skip)")
    p.add_argument("--profile-out", default="docs/results/profile.txt", help="profile of one mixrl grpo step ('' to skip)")
    p.add_argument("--json", default=None, help="also write every measurement as JSON")
    p.add_argument("--quiet", action="store_true", help="no per-step lines")
    opts = p.parse_args(argv)
    opts.argv = list(sys.argv[1:] if argv is None else argv)
    if opts.warmup < 0 or opts.steps < 1:
        p.error("--warmup must be >= 0 and --steps >= 1")
    return opts


def main(argv: list[str] | None = None) -> dict:
    from rich.console import Console

    opts = parse_args(argv)
    out, err = Console(width=None if sys.stdout.isatty() else 160), Console(stderr=True)
    rep = run(opts, log=lambda s: err.print(s, highlight=False))
    table, rtable = rich_tables(rep)
    out.print(table)
    out.print(rtable)
    if opts.profile_out and rep["profile_text"]:
        Path(opts.profile_out).parent.mkdir(parents=True, exist_ok=True)
        Path(opts.profile_out).write_text(rep["profile_text"])
        out.print(f"wrote {opts.profile_out}")
    if opts.out:
        Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
        Path(opts.out).write_text(markdown(rep, opts.profile_out or None))
        out.print(f"wrote {opts.out}")
    if opts.json:
        Path(opts.json).parent.mkdir(parents=True, exist_ok=True)
        Path(opts.json).write_text(json.dumps(to_json(rep), indent=2, default=str))
        out.print(f"wrote {opts.json}")
    return rep


if __name__ == "__main__":
    main()
