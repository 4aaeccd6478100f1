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
and written to ``eval.jsonl``. The final table (all problems, the protocol's k, intervals) is
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


def evaluate(model, tokenizer, live: LiveBenchmark, *, batch_size: int, stop: Callable[[], bool] | None = None,
             examples: list | None = None) -> dict[str, float]:
    """``{metric: value}`` of ``model`` on one benchmark (``k`` samples per problem under its
    protocol), in the caller's RNG state; ``stop`` as for
    :func:`mixrl.evaluation.accuracy.generate_completions`."""
    from mixrl.benchmarks import scoring  # deferred: scoring loads math-verify
    from mixrl.benchmarks.metrics import per_problem  # deferred: metrics imports the evaluation's pass@k
    from mixrl.evaluation.accuracy import generate_completions  # deferred: imports torch

    proto, n = live.bench.protocol, live.samples
    sample = proto.temperature > 0
    texts = generate_completions(
        model, tokenizer, live.prompts, max_new_tokens=live.max_new_tokens, batch_size=max(batch_size // n, 1),
        do_sample=sample, temperature=proto.temperature if sample else 1.0, top_p=proto.top_p if sample else None,
        num_return_sequences=n, stop=stop,
    )
    flat_p = [p for p in live.problems for _ in range(n)]
    flat_t = [t for ts in texts for t in ts]
    extracted = [scoring.extract(live.bench.extract, t, p.labels) for p, t in zip(flat_p, flat_t)]
    correct = live.scorer(flat_p, flat_t, extracted)
    if examples is not None:
        examples.extend({"benchmark": live.bench.name, "prompt": pr, "completion": ts[0], "extracted": extracted[i * n],
                         "reward": float(bool(correct[i * n])), "correct": bool(correct[i * n]), "answer": p.answer}
                        for i, (p, pr, ts) in enumerate(zip(live.problems, live.prompts, texts)))
    out: dict[str, Any] = {}
    for m in live.metrics:
        vals = [per_problem(m, correct[i * n:(i + 1) * n], [scoring.vote_key(e) for e in extracted[i * n:(i + 1) * n]])
                for i in range(len(live.problems))]
        out[m] = sum(vals) / len(vals)
    return out
