"""Benchmarks during training: the papers' validation curves (``trainer.eval_benchmarks``).

Papers that plot accuracy against training steps score a benchmark suite with fewer samples
than their final table (e.g. avg@4 or avg@8 on AIME where the table reports avg@32) and, for
the large sets, a subset. The trainer settings::

    trainer:
      eval_every: 50
      eval_benchmarks: math6          # a suite or benchmark of conf/benchmarks/ (comma list allowed)
      eval_benchmark_problems: 64     # the first N problems of each benchmark; null: all
      eval_benchmark_k: 4             # samples per problem; null: the protocol's
      eval_benchmark_overrides: []    # more benchmarks.* overrides (benchmarks.source_dir=DIR, ...)

select the benchmarks (:func:`selection`, validated with the config, before the run directory
exists), load them once (:func:`prepare`, before the run starts), and every ``eval_every``
steps :class:`mixrl.evaluation.periodic.PeriodicEvalCallback` scores the training model on
them (:func:`evaluate`), under the benchmark's protocol (temperature, top-p, max new tokens)
with ``k`` samples: the metric kinds of the protocol at ``k`` (``avg@32, pass@32, maj@32`` ->
``avg@4, pass@4, maj@4``). They are logged as ``eval/<benchmark>/<metric>`` (``eval/aime24/avg@4``)
and written to ``eval.jsonl``. Under a launcher each process generates a disjoint share of the
(problem, sample) pairs (:func:`shard`), gathered to every process; sampled protocols seed each
pair (:class:`mixrl.benchmarks.sampling.SeededSampling`), so W processes log what one logs. The
final table (all problems, the protocol's k, intervals) is
``mixrl eval RUN benchmarks=recipe``.

Metrics follow :mod:`mixrl.benchmarks.metrics` (avg@k: mean accuracy of k samples; pass@k: the
unbiased estimator of "Evaluating Large Language Models Trained on Code", arXiv:2107.03374;
maj@k: majority vote over extracted answers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mixrl.benchmarks import spec
from mixrl.benchmarks.sampling import SeededSampling
from mixrl.errors import ConfigError

if TYPE_CHECKING:  # benchmarks.data imports datasets; the config checks (and `mixrl plan`) import this module
    from mixrl.benchmarks.data import Problem


@dataclass
class LiveBenchmark:
    """One benchmark as the periodic evaluation scores it: problems, rendered prompts, scorer, k."""

    bench: spec.Benchmark
    problems: list[Problem]
    prompts: list
    scorer: Callable[[list[Problem], list[str], list[str | None]], list[bool]]
    samples: int
    metrics: list[str]
    max_new_tokens: int

    @property
    def name(self) -> str:
        return self.bench.name

    @property
    def generations(self) -> int:
        return len(self.problems) * self.samples

    def evaluate(self, model, tokenizer, **kwargs) -> dict[str, float]:
        """:func:`evaluate` on this benchmark (what the periodic evaluation calls)."""
        return evaluate(model, tokenizer, self, **kwargs)


def metrics_at(protocol_metrics: list[str], k: int) -> list[str]:
    """The protocol's metric kinds at ``k`` samples, in the protocol's order (duplicates dropped)."""
    kinds = [spec.parse_metric(m, "protocol")[0] for m in protocol_metrics]
    return list(dict.fromkeys(f"{kind}@{k}" for kind in kinds))


def selection(cfg) -> spec.Selection | None:
    """The benchmarks ``trainer.eval_benchmarks`` names, validated, with the training settings
    applied (``eval_benchmark_problems`` as the limit, ``eval_benchmark_k`` as samples); None
    when it names none. Raises one ConfigError line naming the key."""
    t = cfg.trainer
    named = t.get("eval_benchmarks")
    if named is None or str(named).strip() == "":
        return None
    extra = [str(o) for o in (t.get("eval_benchmark_overrides") or [])]
    for o in extra:
        if not spec.is_benchmark_override(o) or o.split("=", 1)[0].lstrip("+") == "benchmarks":
            raise ConfigError(f"trainer.eval_benchmark_overrides: {o!r} is not a benchmarks.KEY=VALUE override; "
                              "write e.g. benchmarks.source_dir=DIR or benchmarks.aime24.protocol.max_new_tokens=4096")
    problems, k = t.get("eval_benchmark_problems"), t.get("eval_benchmark_k")
    if problems is not None and (isinstance(problems, bool) or not isinstance(problems, int) or problems < 1):
        raise ConfigError(f"trainer.eval_benchmark_problems={problems!r} is out of range: it must be an integer >= 1 "
                          "(the first N problems of each benchmark) or null for all")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ConfigError(f"trainer.eval_benchmark_k={k!r} is out of range: it must be an integer >= 1 "
                          "(samples per problem) or null for the protocol's")
    names = ",".join(str(n) for n in named) if not isinstance(named, str) and hasattr(named, "__iter__") else str(named)
    try:
        sel = spec.select([f"benchmarks=[{names}]", *extra])
    except ConfigError as e:
        raise ConfigError(f"trainer.eval_benchmarks={names}: {e}") from None
    if problems is not None:
        sel.limit = int(problems)
    for b in sel.benchmarks:
        if k is not None and b.protocol.greedy and k > 1:
            raise ConfigError(f"trainer.eval_benchmark_k={k}: benchmark {b.name} decodes greedily (protocol.temperature 0), "
                              "which gives the same sample every time; set trainer.eval_benchmark_k=1 or null")
    return sel


def load_problems_for(bench: spec.Benchmark, cfg, limit: int | None, eval_rows: Callable) -> tuple[list, str | None]:
    """``(problems, system_prompt)`` of one benchmark under the run's config ``cfg``: a built-in
    task's held-out split (``eval_rows(cfg)``: the run's own prompts, ``trainer.eval_size`` rows) or
    the benchmark's source, with its system prompt (the benchmark's, else the run's ``data.system_prompt``)."""
    from mixrl.benchmarks import data as bench_data  # deferred: data imports datasets

    if bench.builtin:
        bcfg = cfg.copy()
        if str(bcfg.data.source) != bench.source or bcfg.data.eval_source:
            bcfg.data.source, bcfg.data.eval_source = bench.source, None
        rows = eval_rows(bcfg)[: limit or None]
        if not rows:
            raise ConfigError(f"benchmarks.{bench.name}: the held-out split is empty; set trainer.eval_size > 0")
        return [bench_data.Problem(index=i, id=str(i), problem=str(r["prompt"]), answer=str(r.get("answer")), row=dict(r))
                for i, r in enumerate(rows)], None
    system = bench.system_prompt if bench.system_prompt is not None else (cfg.data.system_prompt or None)
    return bench_data.load_problems(bench, limit), system


def prepare(cfg, tokenizer, reward_fn: Callable | None, *, eval_rows: Callable) -> list[LiveBenchmark]:
    """Load the selected benchmarks' problems and render their prompts (once, before training);
    ``eval_rows(cfg)``: the held-out rows of a built-in task (:func:`mixrl.trainer.build.load_eval_rows`)."""
    from mixrl.benchmarks import runner  # deferred: runner imports torch; `mixrl plan` imports this module

    sel = selection(cfg)
    if sel is None:
        return []
    chat = bool(getattr(tokenizer, "chat_template", None))
    k = cfg.trainer.get("eval_benchmark_k")
    out = []
    for bench in sel.benchmarks:
        problems, system = load_problems_for(bench, cfg, sel.limit, eval_rows)
        samples = int(k) if k is not None else bench.protocol.samples
        out.append(LiveBenchmark(
            bench=bench, problems=problems, prompts=[runner.render(tokenizer, p, system, chat=chat) for p in problems],
            scorer=runner.make_scorer(bench, reward_fn), samples=samples,
            metrics=metrics_at(bench.protocol.metrics, samples),
            max_new_tokens=int(bench.protocol.max_new_tokens or cfg.trainer.max_completion_length),
        ))
    return out


def shard(total: int, rank: int, world: int) -> tuple[list[int], int]:
    """``(indices, real)``: process ``rank``'s contiguous share of ``range(total)`` (the flat
    (problem, sample) pairs, ``problem * k + sample``), ``ceil(total / world)`` long on every
    process, its first ``real`` entries its own and the rest repeats of a pair that another process
    owns (discarded), so every process runs the same number of ``generate`` batches (ZeRO-3 and
    FSDP gather parameters in every forward, and the processes must call it together)."""
    per = -(-total // world) if total else 0
    own = list(range(min(rank * per, total), min((rank + 1) * per, total)))
    return own + [total - 1] * (per - len(own)), len(own)


def _world() -> tuple[int, int]:
    import torch.distributed as dist  # deferred: imports torch

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _gather(obj) -> list:
    """Every process's ``obj``, in rank order (``torch.distributed.all_gather_object``)."""
    import torch.distributed as dist  # deferred: imports torch

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def evaluate(model, tokenizer, live: LiveBenchmark, *, batch_size: int, stop: Callable[[], bool] | None = None,
             examples: list | None = None, trainer: Any = None) -> dict[str, float]:
    """``{metric: value}`` of ``model`` on one benchmark (``k`` samples per problem under its
    protocol); ``stop`` as for :func:`mixrl.evaluation.generate.generate_completions`.

    Under a launcher each process generates and scores a disjoint ``1/world`` share of the
    (problem, sample) pairs (:func:`shard`) and the results are gathered to every process, so all
    log the same metrics, equal to one process's. Sampled protocols seed each pair
    (:class:`SeededSampling`, the seed drawn from the caller's RNG state, which the periodic
    evaluation seeds by (seed, step) on every process), so the samples do not depend on the
    number of processes either. With ``trainer`` holding a colocated vLLM engine
    (:func:`mixrl.benchmarks.engine.engine_for`) the engine generates, its weights synced first."""
    import torch  # deferred: imports torch

    from mixrl.benchmarks.engine import engine_for  # deferred: as the other benchmark modules here

    from mixrl.benchmarks import scoring  # deferred: scoring loads math-verify
    from mixrl.benchmarks.metrics import per_problem  # deferred: metrics imports the evaluation's pass@k
    from mixrl.evaluation.generate import EvaluationInterrupted, generate_completions  # deferred: imports torch

    proto, n = live.bench.protocol, live.samples
    sample = proto.temperature > 0
    seed = int(torch.randint(0, 2**31 - 1, (1,)).item())  # the same on every process (the caller's seeded state)
    rank, world = _world()
    total = len(live.problems) * n
    mine, real = shard(total, rank, world)
    engine = engine_for(trainer)
    if engine is not None:  # the run's own vLLM engine (mixrl.benchmarks.engine), one request per pair
        if stop is not None and stop():
            raise EvaluationInterrupted(f"stopped before benchmark {live.name}")
        texts = [[t] for t in engine.generate(tokenizer, [live.prompts[j // n] for j in mine], mine,
                                              temperature=proto.temperature, top_p=proto.top_p,
                                              max_new_tokens=live.max_new_tokens, seed=seed)]
    else:
        sampler = SeededSampling(seed, mine, proto.temperature, proto.top_p) if sample else None
        texts = generate_completions(
            model, tokenizer, [live.prompts[j // n] for j in mine], max_new_tokens=live.max_new_tokens,
            batch_size=max(batch_size, 1), do_sample=False, stop=stop,
            logits_processor=sampler.batch if sampler is not None else None,
        )
    own_p = [live.problems[j // n] for j in mine[:real]]
    own_t = [ts[0] for ts in texts[:real]]
    own_e = [scoring.extract(live.bench.extract, t, p.labels) for p, t in zip(own_p, own_t)]
    own_c = [bool(c) for c in live.scorer(own_p, own_t, own_e)] if own_p else []
    flat_t, extracted, correct = [], [], []
    for t, e, c in _gather((own_t, own_e, own_c)):  # rank order = pair order (contiguous shares)
        flat_t += t
        extracted += e
        correct += c
    if examples is not None:
        examples.extend({"benchmark": live.bench.name, "prompt": pr, "completion": flat_t[i * n], "extracted": extracted[i * n],
                         "reward": float(bool(correct[i * n])), "correct": bool(correct[i * n]), "answer": p.answer}
                        for i, (p, pr) in enumerate(zip(live.problems, live.prompts)))
    out: dict[str, Any] = {}
    for m in live.metrics:
        vals = [per_problem(m, correct[i * n:(i + 1) * n], [scoring.vote_key(e) for e in extracted[i * n:(i + 1) * n]])
                for i in range(len(live.problems))]
        out[m] = sum(vals) / len(vals)
    return out
