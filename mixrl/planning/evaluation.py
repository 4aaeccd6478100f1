"""What ``trainer.eval_benchmarks`` costs a run, for ``mixrl plan``: per benchmark the problems,
samples and generated tokens during training and for the final table, and their times at a
stated throughput (:data:`EVAL_TOKENS_PER_S`), counted without reading the benchmarks' data.
"""

from __future__ import annotations

from omegaconf import DictConfig

from mixrl.config.hardware import world_size

#: problems in the split each shipped benchmark reads (its dataset card; LUFFY's valid.all.parquet
#: for amc, minerva and olympiadbench), to count an evaluation's generated tokens without reading it
BENCHMARK_PROBLEMS = {"aime24": 30, "aime25": 30, "amc": 83, "amc23": 40, "math500": 500, "minerva": 272,
                      "olympiadbench": 675, "arc_c": 1172, "gpqa_diamond": 198, "mmlu_pro": 12032}

#: decode throughput the plan's evaluation times assume, tokens per second per GPU (a 7B model in
#: bf16, batches of tens of rows: transformers ``generate`` during training, vLLM's offline engine
#: for the final table); stated in the plan, not measured by it
EVAL_TOKENS_PER_S = {"hf": 1_000.0, "vllm": 10_000.0}


def evaluation_counts(cfg: DictConfig, *, prompt_tokens: int = 512) -> dict | None:
    """What ``trainer.eval_benchmarks`` generates: per benchmark the problems, samples and new
    tokens during training and for the final table, the evaluations of the run, the generated
    tokens and the times at :data:`EVAL_TOKENS_PER_S`; None without benchmarks (or eval_every 0)."""
    from mixrl.benchmarks.live import metrics_at, selection  # deferred: reads conf/benchmarks only when asked

    t = cfg.trainer
    sel = selection(cfg)
    if sel is None or int(t.eval_every) <= 0:
        return None
    k = t.get("eval_benchmark_k")
    W = world_size(cfg)  # each process generates its share of the pairs (mixrl.benchmarks.live.shard)
    rows, unknown = [], []
    for b in sel.benchmarks:
        size = int(t.eval_size) if b.builtin else BENCHMARK_PROBLEMS.get(b.name)
        if size is None:
            unknown.append(b.name)
            continue
        n = min(size, sel.limit) if sel.limit else size
        samples = int(k) if k is not None else b.protocol.samples
        new = int(b.protocol.max_new_tokens or t.max_completion_length)
        rows.append({"name": b.name, "problems": n, "samples": samples, "metrics": metrics_at(b.protocol.metrics, samples),
                     "max_new_tokens": new, "tokens": n * samples * new, "process_tokens": -(-n * samples // W) * new,
                     "final_problems": size, "final_samples": b.protocol.samples, "final_tokens": size * b.protocol.samples * new})
    evals = int(t.max_steps) // int(t.eval_every)
    per_eval = sum(r["tokens"] for r in rows)
    final = sum(r["final_tokens"] for r in rows)
    per_process = sum(r["process_tokens"] for r in rows)
    batch = min(int(t.eval_batch_size), max((-(-r["problems"] * r["samples"] // W) for r in rows), default=1))
    return {"suite": sel.name, "benchmarks": rows, "unknown": unknown, "evaluations": evals, "tokens_per_eval": per_eval,
            "processes": W, "tokens_per_process": per_process,
            "tokens_total": per_eval * evals, "seconds_per_eval": per_process / EVAL_TOKENS_PER_S["hf"],
            "final_tokens": final, "final_seconds": final / EVAL_TOKENS_PER_S["vllm"], "batch_rows": batch,
            "seq_tokens": prompt_tokens + max((r["max_new_tokens"] for r in rows), default=0)}
