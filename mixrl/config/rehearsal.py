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

import string
import hashlib
import importlib.util
import json
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mixrl.config.recipe_index import _field, _load, _selected, conf_dir, list_recipe_names, recipes_dir
from mixrl.config.rehearsal_rules import is_hub_id, pair_swaps, reward_model_swaps, whole_group_prompts
from mixrl.errors import ConfigError
from mixrl.models.known import KNOWN_MODELS

__all__ = ["CPU_HARDWARE", "RULES", "STEPS", "Swap", "plan_rehearsal", "overrides", "sample_path", "samples_dir"]

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


# ----------------------------------------------------------------------------- helpers


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


def _steps(ctx: Context) -> list[Swap]:
    t = ctx.cfg.trainer
    steps = int(t.max_steps)
    if steps <= STEPS:
        return []
    ctx.scale = STEPS / steps
    out = [_set("trainer.max_steps", steps, STEPS, "a rehearsal: every piece runs, a handful of steps")]
    if int(t.warmup_steps):
        out.append(_set("trainer.warmup_steps", int(t.warmup_steps), _scaled(int(t.warmup_steps), ctx.scale),
                        "learning-rate warmup scaled with the steps (the schedule's shape kept)"))
    return out


def _scaled(n: int, scale: float) -> int:
    """A step count scaled, at least 1 where it was at least 1 (the phase still runs)."""
    return max(1, round(n * scale)) if n > 0 else n


def _schedules(ctx: Context) -> list[Swap]:
    """Every step count of every schedule spec in the config, scaled (see the module docstring)."""
    from mixrl.core import SCHEDULES  # deferred: mixrl.core imports torch

    if ctx.scale == 1.0:
        return []
    out: list[Swap] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, Mapping):
            name = node.get("name")
            if isinstance(name, str) and name in SCHEDULES:
                for param, bound in SCHEDULES.bounds(name).items():
                    value = node.get(param)
                    if "step" in bound.why and isinstance(value, int) and not isinstance(value, bool) and value > 0:
                        out.append(_set(f"{path}.{param}", value, _scaled(value, ctx.scale),
                                        f"schedule {name}: {bound.why} scaled by {STEPS}/{int(ctx.cfg.trainer.max_steps)} (its shape kept)"))
            for k, v in node.items():
                walk(v, f"{path}.{k}" if path else str(k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                if isinstance(v, Mapping):
                    walk(v, f"{path}.{i}")

    walk(OmegaConf.to_container(ctx.cfg, resolve=False), "")
    return out


def _batch(ctx: Context) -> list[Swap]:
    """Prompts per step down to PROMPTS (a multiple that the processes split), generations to at
    most GENERATIONS, inject rows scaled with the rollouts (their ratio kept), the micro-batch to
    one that divides the rows per process."""
    t, algo = ctx.cfg.trainer, ctx.cfg.algo
    P, G = int(t.prompts_per_step), int(algo.num_generations)
    G2 = min(G, GENERATIONS)
    rows = algo.inject.get("rows") if isinstance(algo.inject, Mapping) else None
    P2 = min(P, whole_group_prompts(ctx.cfg, ctx.world, ctx.prompts))  # injections that read whole groups: enough of them
    # the processes split P2 x G2 rollouts; inject rows R2 = R x (P2 G2)/(P G) whole and split too
    while True:
        ok = (P2 * G2) % ctx.world == 0
        if isinstance(rows, int) and rows:
            exact = rows * P2 * G2 / (P * G)
            ok = ok and exact == int(exact) and int(exact) % ctx.world == 0
        if ok or P2 >= P:
            break
        P2 += 1
    out: list[Swap] = []
    if P2 != P:
        out.append(_set("trainer.prompts_per_step", P, P2, "a rehearsal batch"))
    out += [_set(*t) for t in pair_swaps(ctx.cfg, P2, ctx.world)]  # preference pairs scaled with the prompts
    if G2 != G:
        out.append(_set("algo.num_generations", G, G2, "a rehearsal group size"))
        per_group = algo.inject.get("per_group") if isinstance(algo.inject, Mapping) else None
        if isinstance(per_group, int) and per_group > 0:
            new = min(G2 - 1, max(1, round(per_group * G2 / G)))
            out.append(_set("algo.inject.per_group", per_group, new, f"its share of the group kept ({per_group}/{G} -> {new}/{G2})"))
    if isinstance(rows, int) and rows:
        R2 = int(rows * P2 * G2 / (P * G))
        if R2 != rows:
            out.append(_set("algo.inject.rows", rows, R2,
                            f"scaled with the rollouts: {rows}/({P}x{G}+{rows}) = {R2}/({P2}x{G2}+{R2}) = {R2 / (P2 * G2 + R2):.3g} of each step"))
    per_proc = P2 * G2 // max(ctx.world, 1)
    M = t.micro_batch_size
    if M is not None:
        M2 = max(d for d in range(1, per_proc + 1) if per_proc % d == 0 and d <= int(M))
        if M2 != int(M):
            out.append(_set("trainer.micro_batch_size", int(M), M2, f"the largest that divides the {per_proc} rows per process"))
    return out


#: a regeneration template longer than this (characters) is shortened to its fields for the rehearsal
TEMPLATE_CHARS = 120
#: lengths of what the policy writes inside the step (a reflection, a hint, a verification), capped with the completion
WRITTEN_LENGTHS = ("critique_tokens", "hint_tokens", "verify_tokens")


def _lengths(ctx: Context) -> list[Swap]:
    t, algo = ctx.cfg.trainer, ctx.cfg.algo
    L = int(t.max_completion_length)
    out: list[Swap] = []
    if L > COMPLETION:
        out.append(_set("trainer.max_completion_length", L, COMPLETION,
                        "the built-in model's context is 128 tokens, prompt included"))
        agg = algo.aggregation
        if isinstance(agg, Mapping) and isinstance(agg.get("max_len"), int):
            new = max(COMPLETION, round(int(agg.max_len) * COMPLETION / L))
            out.append(_set("algo.aggregation.max_len", int(agg.max_len), new,
                            "a length in tokens, scaled with max_completion_length (their ratio kept)"))
    if isinstance(algo.inject, Mapping):  # what the policy writes inside the step (issue 52): within the new budget
        for key in WRITTEN_LENGTHS:
            n = algo.inject.get(key)
            if isinstance(n, int) and n > min(L, COMPLETION):
                out.append(_set(f"algo.inject.{key}", n, min(L, COMPLETION),
                                "tokens the policy writes inside the step (a trained row when kept): within the completion budget"))
    template = algo.inject.get("template") if isinstance(algo.inject, Mapping) else None
    if isinstance(template, str) and len(template) > TEMPLATE_CHARS:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f]
        short = " ".join("{" + f + "}" for f in dict.fromkeys(fields))
        out.append(Swap("algo.inject.template", f"{len(template)} characters", short,
                        "the built-in model's context cannot hold the recipe's instructions around the prompt, attempt and "
                        "feedback; the same fields in the same order, without the words",
                        f"algo.inject.template='{short}'"))
    length = ctx.cfg.sampler.get("length")
    if length is not None:
        raise ConfigError("--rehearse: sampler.length (a completion-length schedule) has no rehearsal rule yet; add one to mixrl/config/rehearsal.py")
    return out


def _evaluation(ctx: Context) -> list[Swap]:
    t = ctx.cfg.trainer
    out: list[Swap] = []
    if int(t.eval_size) > EVAL_SIZE:
        out.append(_set("trainer.eval_size", int(t.eval_size), EVAL_SIZE, "a few held-out problems: evaluation runs, briefly"))
    if int(t.eval_batch_size) > EVAL_SIZE:
        out.append(_set("trainer.eval_batch_size", int(t.eval_batch_size), EVAL_SIZE, "one evaluation batch"))
    if int(t.eval_every) > 0 and ctx.scale != 1.0 and not t.get("eval_benchmarks"):  # benchmarks: scored once, below
        out.append(_set("trainer.eval_every", int(t.eval_every), _scaled(int(t.eval_every), ctx.scale),
                        "periodic evaluation scaled with the steps"))
    if t.get("eval_benchmarks"):
        out += _benchmarks(t)
    steps = min(int(t.max_steps), STEPS)
    if int(t.save_steps) == 0 or int(t.save_steps) > steps:
        out.append(_set("trainer.save_steps", int(t.save_steps), steps, "a checkpoint is written"))
    return out


def benchmark_fixtures() -> Path:
    """The benchmarks' offline fixtures (a few rows in each hub dataset's schema), in a clone of mixrl."""
    return Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "benchmarks"


def _benchmarks(t) -> list[Swap]:
    """``trainer.eval_benchmarks`` (the papers' benchmarks during training) -> the same benchmarks,
    read from their fixtures, one problem each, one short sample, scored once (at the last step)."""
    fixtures = benchmark_fixtures()
    if not fixtures.is_dir():
        raise ConfigError(f"--rehearse: trainer.eval_benchmarks reads the benchmark fixtures of a mixrl clone "
                          f"(tests/fixtures/benchmarks), not found at {fixtures}; rehearse from a clone, or add "
                          "trainer.eval_benchmarks=null")
    extra = [str(o) for o in (t.get("eval_benchmark_overrides") or [])]
    swapped = [*extra, f"benchmarks.source_dir={fixtures}", f"benchmarks.all.protocol.max_new_tokens={COMPLETION}"]
    out = [Swap("trainer.eval_benchmark_overrides", extra, swapped,
                "the benchmarks read from their shipped fixtures (same schema as the hub's), short answers",
                "trainer.eval_benchmark_overrides=[" + ",".join(f"'{o}'" for o in swapped) + "]")]
    steps = min(int(t.max_steps), STEPS)
    if int(t.eval_every) != steps:
        out.append(_set("trainer.eval_every", int(t.eval_every), steps, "the benchmarks scored once, at the last step"))
    if t.get("eval_benchmark_problems") is None or int(t.eval_benchmark_problems) > BENCH_PROBLEMS:
        out.append(_set("trainer.eval_benchmark_problems", t.get("eval_benchmark_problems"), BENCH_PROBLEMS,
                        "one problem of each benchmark"))
    if t.get("eval_benchmark_k") is None or int(t.eval_benchmark_k) > 1:
        out.append(_set("trainer.eval_benchmark_k", t.get("eval_benchmark_k"), 1, "one sample per problem"))
    return out


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
