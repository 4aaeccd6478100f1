"""The rehearsal of a recipe on CPU: ``mixrl train recipe=NAME --rehearse``.

A GPU recipe runs as shipped, except what cannot run on a CPU machine without downloads. Each such
part is swapped by one rule of :data:`RULES` (a table: label, what it swaps, the function that
decides), and every swap is a :class:`Swap` (key, recipe value, rehearsal value, why) that
``mixrl train`` prints as one table before training and writes to ``RUN_DIR/rehearsal.json``.
A swap is a Hydra override (:func:`overrides`): the rehearsed run is ``mixrl train <the user's
overrides> <the swaps>``, composed, validated and (for several processes) launched like any other.

What is swapped:

* the model -> the built-in BPE chat model (``model=tiny-bpe``: Qwen2 architecture, float32),
  whatever the recipe's family (Qwen3 -> the Qwen2-family tiny model: its q/k norms and head_dim are
  not rehearsed; the swap's reason says so). Prompts are rendered with the real model's own chat
  template when its ``tokenizer_config.json`` (or ``chat_template.jinja``) is in the local Hugging Face
  cache (:func:`real_chat_template`, no download), else with the tiny model's (Qwen2.5's format, the
  built-in task's default system message), and the swap's reason says which; every hub teacher -> the built-in BPE teacher (``builtin:tiny-bpe-teacher``);
* a hub dataset -> the schema sample shipped for its data config
  (``mixrl/data/samples/<data.name>.jsonl``: the dataset's own columns and nesting, a few dozen rows),
  loaded by the same code as the hub id (:func:`mixrl.data.loading.load_dataset_rows`); likewise a
  relative local path (``./...``) that a preparation command writes and this machine lacks
  (``data=chord-openr1``: ``mixrl data prepare chord-openr1``), for ``data.source`` and
  ``offpolicy.source.dataset``;
* the hardware -> its CPU equivalent (:data:`CPU_HARDWARE`): FSDP -> 2-process FSDP on gloo, several
  DDP / DeepSpeed processes -> 2-process DDP, one GPU -> one CPU process; vLLM (colocate or server)
  -> vLLM's CPU build colocated when this interpreter can import vllm, else transformers' generate;
* sizes: steps (:data:`STEPS`), prompts per step (the inject rows with them, keeping their ratio to
  the rollouts), generations per prompt capped at :data:`GENERATIONS` (per-group injections with them), completion length (and an aggregation's ``max_len`` with it), evaluation size and
  period, the checkpoint period (one checkpoint at least), and every step count of a schedule
  (a schedule component's parameter bounded as "a number of steps" / "a step number", and
  ``trainer.warmup_steps``) scaled by steps / recipe steps, so the schedule's shape runs within
  the rehearsal.

Before any swap, the real models' context is checked (:func:`mixrl.config.context.check_context`:
the prompt budget plus the recipe's ``trainer.max_completion_length`` within each model's
``max_position_embeddings``), so a recipe whose completions the real model cannot hold is refused
here, as on the GPU, rather than passing on the tiny model's own context.

Everything else (objective, schedules' values, injections, sampler, reward, system prompt,
evaluation) is the recipe's; the chat template too when the real model's is in the local cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mixrl.config.recipe_index import _field, _load, _selected, conf_dir, list_recipe_names, recipes_dir
from mixrl.config.rehearsal_base import (  # noqa: F401  (CPU_HARDWARE, STEPS, sample_path, samples_dir: re-exported)
    BUILTIN_MODEL,
    BUILTIN_TEACHER,
    CONTEXT,
    CPU_HARDWARE,
    GENERATIONS,
    STEPS,
    Context,
    Swap,
    _fmt,
    _set,
    sample_path,
    samples_dir,
    vllm_importable,
)
from mixrl.config.rehearsal_sizes import _batch, _evaluation, _lengths, _schedules, _steps
from mixrl.config.rehearsal_rules import is_hub_id, reward_model_swaps
from mixrl.errors import ConfigError
from mixrl.models.known import KNOWN_MODELS

__all__ = ["CPU_HARDWARE", "RULES", "STEPS", "Swap", "plan_rehearsal", "overrides", "sample_path", "samples_dir"]


# ----------------------------------------------------------------------------- the rules


def widened(name: str, context: int = CONTEXT, chat_template: str | None = None) -> Path:
    """A copy of built-in model ``name``'s cached folder whose config (and tokenizer) say
    ``context`` positions: ``<folder>-context<N>`` beside it, written once (atomically). With
    ``chat_template``, the copy renders prompts with that template instead of its own
    (``<folder>-context<N>-template<hash>``: one copy per template)."""
    from mixrl.models.builtin import resolve  # deferred: the models package imports torch

    src = Path(resolve(name, progress=False))
    suffix = f"-template{hashlib.sha256(chat_template.encode()).hexdigest()[:12]}" if chat_template else ""
    dst = src.with_name(f"{src.name}-context{context}{suffix}")
    if (dst / "config.json").is_file():
        return dst
    from mixrl.models.atomic import publishing  # deferred: as resolve above

    with publishing(dst, complete=lambda folder: (folder / "config.json").is_file()) as tmp:  # another process may win
        shutil.copytree(src, tmp, dirs_exist_ok=True)
        for file, key in (("config.json", "max_position_embeddings"), ("tokenizer_config.json", "model_max_length")):
            path = tmp / file
            if path.is_file():
                data = json.loads(path.read_text())
                data[key] = context
                if chat_template and file == "tokenizer_config.json":
                    data.pop("chat_template", None)  # the template lives in chat_template.jinja below
                path.write_text(json.dumps(data, indent=2))
        if chat_template:
            (tmp / "chat_template.jinja").write_text(chat_template)
    return dst


def _context(ctx: Context) -> list[Swap]:
    """The real models' context, checked before they are swapped (the tiny model's own context, and
    the rehearsal's short completions, would hide a recipe that cannot start); a note row, no override."""
    from mixrl.config.context import check_context  # deferred: with the rule that uses it

    checked = check_context(ctx.cfg)  # ConfigError, one line and the fix, for a completion the real model cannot hold
    known = [f"{pos.path} {pos.n:,}" for _, pos in checked.models if pos.n is not None]
    if not known:
        return []
    return [Swap("context", f"{checked.prompt:,} prompt + {checked.completion:,} completion = {checked.need:,} positions",
                 "checked against the real model(s): " + ", ".join(known),
                 "the recipe's prompt budget and completion length fit the real model's context (max_position_embeddings); "
                 "the rehearsal's shorter lengths below run on the tiny model")]


def real_chat_template(path: str) -> tuple[str | None, str]:
    """The chat template of hub model ``path`` when this machine has its tokenizer files in the
    local Hugging Face cache (no download), and where it was read; ``(None, why not)`` otherwise."""
    try:
        from huggingface_hub import try_to_load_from_cache  # deferred: only the rehearsal reads the cache
    except ImportError:
        return None, "huggingface_hub is not installed"
    for file in ("chat_template.jinja", "tokenizer_config.json"):
        try:
            found = try_to_load_from_cache(path, file)
        except Exception:  # noqa: BLE001 - not a valid repo id or an unreadable cache: not found
            found = None
        if not isinstance(found, str) or not os.path.isfile(found):
            continue
        text = Path(found).read_text(encoding="utf-8")
        if file.endswith(".jinja"):
            return text, found
        template = json.loads(text).get("chat_template")
        if isinstance(template, str) and template.strip():
            return template, found
    return None, "its tokenizer files are not in the local Hugging Face cache"


def _model(ctx: Context) -> list[Swap]:
    path = str(ctx.cfg.model.path)
    if path.startswith("builtin:") or os.path.isdir(path):
        return []
    template, where = real_chat_template(path)
    new = widened(BUILTIN_MODEL, chat_template=template)
    why = "no download: the built-in Qwen2-architecture BPE chat model"
    if template:
        why += f"; prompts rendered with {path}'s own chat template (read from {where})"
    else:
        why += (f"; prompts rendered with Qwen2.5's chat template and the built-in task's default system message, "
                f"not {path}'s own ({where}: download it once, e.g. `huggingface-cli download {path} tokenizer_config.json`, "
                "and the rehearsal uses it)")
    family = str(KNOWN_MODELS.get(path, {}).get("model_type", ""))
    if family and family != "qwen2":
        why += f" (a {family} model: rehearsed as Qwen2 family, without its own architecture)"
    return [
        Swap("model", f"{path} ({ctx.cfg.model.dtype})", f"{BUILTIN_MODEL} (float32)", why, "model=tiny-bpe"),
        _set("model.path", BUILTIN_MODEL, str(new),
             f"its context widened 128 -> {CONTEXT} tokens (rotary positions: the same weights) so the recipe's own prompts fit"
             + (f"; {path}'s chat template" if template else "")),
    ]


def _teacher(ctx: Context) -> list[Swap]:
    source = ctx.cfg.teacher.source
    if str(source.get("name")) != "teacher":
        return []
    models = [str(m) for m in source.get("models") or []]
    if not any(is_hub_id(m) for m in models):
        return []
    teacher = str(widened(BUILTIN_TEACHER))
    new = [teacher if is_hub_id(m) else m for m in models]
    out = [_set("teacher.source.models", models, new,
                f"no download: the built-in BPE teacher ({BUILTIN_TEACHER}, the student's tokenizer, context {CONTEXT}), one per teacher")]
    if str(source.get("dtype")) not in ("auto", "float32", "None"):
        out.append(_set("teacher.source.dtype", source.get("dtype"), "auto", "float32 on CPU (the student's dtype)"))
    return out


def _data(ctx: Context) -> list[Swap]:
    data = ctx.cfg.data
    out: list[Swap] = []
    for key in ("source", "eval_source"):
        src = data.get(key)
        if _unprepared(src, data):
            path = sample_path(str(data.name))
            out.append(_set(f"data.{key}", src, str(path), f"{src} is not prepared here (mixrl data prepare): the shipped "
                                                          f"sample of its columns ({_rows(path)} rows)"))
            continue
        if not is_hub_id(src):
            continue
        path = sample_path(str(data.name))
        if not path.is_file():
            raise ConfigError(
                f"--rehearse: no schema sample for data={data.name} ({src}); add mixrl/data/samples/{data.name}.jsonl "
                "with the dataset's columns (see mixrl/data/samples/README.md)"
            )
        out.append(_set(f"data.{key}", src, str(path), f"no download: the shipped sample of {src} (its columns, {_rows(path)} rows)"))
    if out and data.get("subset") is not None:
        out.append(_set("data.subset", data.subset, None, "a local file has no hub config"))
    source = ctx.cfg.offpolicy.source
    if _unprepared(source.get("dataset"), data):
        path = sample_path(str(data.name))
        out.append(_set("offpolicy.source.dataset", source.dataset, str(path),
                        f"{source.dataset} is not prepared here (mixrl data prepare): the shipped sample of its columns"))
    elif is_hub_id(source.get("dataset")):
        raise ConfigError(
            f"--rehearse: offpolicy.source.dataset={source.dataset} is a hub dataset with no shipped sample; "
            "set offpolicy.source.dataset to a local file with its columns"
        )
    return out


def _unprepared(src: Any, data: DictConfig) -> bool:
    """A local path that a preparation command writes (``mixrl data prepare``), absent on this
    machine, for a data config that ships a sample of its columns (``data=chord-openr1``)."""
    return (isinstance(src, str) and src.startswith(("./", "../")) and not os.path.exists(src)
            and sample_path(str(data.name)).is_file())


def _rows(path: Path) -> int:
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def _hardware(ctx: Context) -> list[Swap]:
    hw = ctx.cfg.hardware
    if str(hw.device) == "cpu":
        ctx.world = int(hw.num_processes) * int(hw.get("num_machines", 1) or 1)
        return []
    several = int(hw.num_processes) * int(hw.get("num_machines", 1) or 1) > 1
    strategy = str(hw.get("strategy") or "ddp")
    if (strategy, several) not in CPU_HARDWARE:
        raise ConfigError(f"--rehearse: no CPU equivalent of hardware={hw.name} (strategy {strategy}); add one to mixrl/config/rehearsal.py CPU_HARDWARE")
    name, why = CPU_HARDWARE[(strategy, several)]
    if hw.use_vllm and ctx.vllm:
        name, why = "cpu-vllm", (f"vLLM's CPU build, colocated, in one process (the recipe: vLLM {hw.vllm_mode}, {strategy} over "
                                 f"{hw.num_processes} processes; the rehearsal does not combine several processes with vLLM)")
    elif hw.use_vllm:
        why += f"; vLLM {hw.vllm_mode} -> transformers' generate (this interpreter has no vllm: use .venv-vllm for its CPU build)"
    ctx.world = 1 if name in ("cpu", "cpu-vllm") else 2
    label = f"{hw.name} ({hw.num_processes} x {hw.device}, {strategy}{', vLLM ' + str(hw.vllm_mode) if hw.use_vllm else ''}, "
    label += f"{'bf16' if hw.bf16 else 'fp32'})"
    return [Swap("hardware", label, name + " (float32)", why, f"hardware={name}")]


#: the rules, applied in order (the batch rule needs the hardware's world size, the schedules the steps scale)
RULES: list[tuple[str, str, Callable[[Context], list[Swap]]]] = [
    ("context", "the real model's context holds the prompt budget + completion (checked, nothing swapped)", _context),
    ("model", "a hub model -> the built-in BPE chat model", _model),
    ("teacher", "a hub teacher -> the built-in BPE teacher", _teacher),
    ("reward model", "a hub reward model -> the built-in one", lambda ctx: [_set(*s) for s in reward_model_swaps(ctx.cfg)]),
    ("data", "a hub dataset -> its shipped schema sample", _data),
    ("hardware", "GPUs -> the CPU equivalent (FSDP, DDP, vLLM)", _hardware),
    ("steps", "max_steps -> a handful; warmup scaled", _steps),
    ("schedules", "schedule step counts scaled with the steps", _schedules),
    ("batch", "prompts, generations, inject rows (ratio kept), micro-batch", _batch),
    ("lengths", "completion length (and aggregation max_len) to the model's context", _lengths),
    ("evaluation", "eval size, period, checkpoint period", _evaluation),
]


def plan_rehearsal(cfg: DictConfig, *, vllm: bool | None = None) -> list[Swap]:
    """The swaps that rehearse ``cfg`` (a composed config) on this machine, rule by rule."""
    ctx = Context(cfg=cfg, vllm=vllm_importable() if vllm is None else vllm)
    swaps: list[Swap] = []
    for _, _, rule in RULES:
        swaps.extend(rule(ctx))
    return swaps


def overrides(swaps: list[Swap]) -> list[str]:
    """The Hydra overrides that make ``swaps`` (appended to the user's)."""
    return [s.override for s in swaps if s.override]


def table(swaps: list[Swap], title: str = "rehearsal: what this CPU run swaps"):
    """One rich table: key, recipe value, rehearsal value, why."""
    from rich.markup import escape  # deferred: only the commands that print it
    from rich.table import Table  # deferred: only the commands that print it

    tab = Table(title=title, show_lines=False)
    for col in ("key", "recipe", "rehearsal", "why"):
        tab.add_column(col, overflow="fold")
    for s in swaps:
        tab.add_row(*(escape(str(v)) for v in (s.key, _fmt(s.recipe), _fmt(s.rehearsal), s.why)))
    if not swaps:
        tab.caption = "nothing to swap: this config runs on CPU as it is"
    return tab


def gpu_recipes() -> list[str]:
    """The shipped recipes whose hardware is a GPU config (``hardware.device: cuda``), from the
    YAML files alone (no composition): what ``make rehearse`` rehearses."""
    defaults = _selected(_load(conf_dir() / "config.yaml").get("defaults"), override=False)
    out = []
    for name in list_recipe_names():
        recipe = OmegaConf.load(recipes_dir() / f"{name}.yaml")
        options = {**defaults, **_selected(recipe.get("defaults"), override=True)}
        if str(_field(recipe, options, "hardware", "device")) == "cuda":
            out.append(name)
    return out
