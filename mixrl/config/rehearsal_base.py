"""What every rehearsal rule shares (:mod:`mixrl.config.rehearsal`): the rehearsal's sizes, the CPU
hardware of each strategy, :class:`Swap` (one change the rehearsal makes), :class:`Context` (what the rules
read) and the helpers that write a swap as an override."""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig


#: optimizer steps of a rehearsal: enough for a schedule's warmup and decay to each take a step
STEPS = 2
#: prompts per step of a rehearsal (before rounding up for the processes and inject rows)
PROMPTS = 1
#: generations per prompt at most: the recipe's own G up to 8 (the shipped recipes' G), so that a
#: group keeps its size and per-group injections (LUFFY 1 of 8, RePO 4 of 8) their share
GENERATIONS = 8
#: completion tokens: the built-in BPE model's context is 128 positions, prompt included
COMPLETION = 24
#: held-out problems per evaluation
EVAL_SIZE = 4
#: problems of each benchmark per periodic benchmark evaluation (trainer.eval_benchmarks)
BENCH_PROBLEMS = 1

BUILTIN_MODEL = "builtin:tiny-bpe"  # conf/model/tiny-bpe.yaml
BUILTIN_TEACHER = "builtin:tiny-bpe-teacher"
#: the built-in models' context, widened for the recipes' own prompts (their system prompts alone
#: reach 230 tokens of the byte-level BPE); a Qwen2 model has rotary positions, no position table,
#: so the same weights run at any length (the 128 of its config is what it was trained on)
CONTEXT = 512

#: (hardware.strategy, several processes?) -> the CPU hardware config that runs the same path
CPU_HARDWARE: dict[tuple[str, bool], tuple[str, str]] = {
    ("fsdp", True): ("cpu-2proc-fsdp", "FSDP2 on 2 CPU processes (gloo): the same accelerate FSDP2 path"),
    ("fsdp", False): ("cpu-2proc-fsdp", "FSDP2 on 2 CPU processes (gloo): the same accelerate FSDP2 path"),
    ("ddp", True): ("cpu-2proc", "DDP on 2 CPU processes (gloo) through the same launcher"),
    ("ddp", False): ("cpu", "one CPU process"),
    ("zero2", True): ("cpu-2proc", "DeepSpeed needs GPUs: DDP on 2 CPU processes (gloo) instead"),
    ("zero3", True): ("cpu-2proc", "DeepSpeed needs GPUs: DDP on 2 CPU processes (gloo) instead"),
}


@dataclass(frozen=True)
class Swap:
    """One change the rehearsal makes: ``key`` (a config key or group), the recipe's value,
    the rehearsal's value, and why. ``override`` is the Hydra override that makes it (None: a
    note only, e.g. the scaled geometry that other overrides imply)."""

    key: str
    recipe: Any
    rehearsal: Any
    why: str
    override: str | None = None

    def row(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "override"}


def samples_dir() -> Path:
    """The shipped schema samples (package data: ``mixrl/data/samples``)."""
    return Path(__file__).resolve().parent.parent / "data" / "samples"


def sample_path(data_name: str) -> Path:
    return samples_dir() / f"{data_name}.jsonl"


def vllm_importable() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _fmt(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_fmt(v) for v in value) + "]"
    return str(value)


def _set(key: str, recipe: Any, value: Any, why: str) -> Swap:
    return Swap(key, recipe, value, why, f"{key}={_fmt(value)}")


@dataclass
class Context:
    """What the rules share: the composed recipe, the steps scale, the rehearsal's world size."""

    cfg: DictConfig
    vllm: bool
    scale: float = 1.0
    world: int = 1
    prompts: int = PROMPTS
    generations: int = GENERATIONS
