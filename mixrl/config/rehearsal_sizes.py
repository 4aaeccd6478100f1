"""The rehearsal rules that shrink a recipe's sizes for a CPU run (:data:`mixrl.config.rehearsal.RULES`): steps
and schedules, the batch geometry, the lengths the policy writes, the held-out and benchmark evaluations."""

from __future__ import annotations

import string
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from mixrl.config.rehearsal_rules import pair_swaps, whole_group_prompts
from mixrl.errors import ConfigError
from mixrl.config.rehearsal_base import BENCH_PROBLEMS, COMPLETION, Context, EVAL_SIZE, GENERATIONS, STEPS, Swap, _set


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
