"""``mixrl eval MODEL benchmarks=...``: HF ``generate`` against vLLM's offline engine, samples per
second side by side in one run, on the same model and the same problems (run it where vLLM is
installed: ``.venv-vllm`` on CPU).

    .venv-vllm/bin/python -m bench.eval_backends                          # 2 rounds, report to runs/bench/
    .venv-vllm/bin/python -m bench.eval_backends --rounds 3 --out docs/results

Each round runs ``mixrl eval`` once per backend (``benchmarks.backend=hf`` / ``vllm``), the order
alternating between rounds, each in a process of its own with a fresh sample cache (so every
sample is generated, none read back): the built-in tiny model (warm-started for 10 steps) on
``benchmarks=arith`` (the built-in task's held-out split, ``--problems`` of them: the tiny model's
context is 64 tokens, which the math fixtures' prompts do not fit), sampled at ``--temperature``
with ``--samples`` samples per problem of at most ``--max-new-tokens`` tokens. ``OMP_NUM_THREADS`` and
``hardware.torch_threads`` are the same for both (``--threads``). Samples per second count
generation only (``generation_seconds`` of ``mixrl eval --out``); loading the model or starting the
engine is its own column. The mean completion length (tokens of the model's tokenizer) says both
generated as much text. The report, ``bench-eval.md``, goes to a new ``runs/bench/eval-<UTC time>/``
unless ``--out DIR`` names another folder (``--out docs/results`` for the committed one).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.machine import REPO, git_commit, loadavg, machine_info  # noqa: E402
from bench.report import report_file, write_text  # noqa: E402

BACKENDS = ("hf", "vllm")


def run_eval(model: str, backend: str, cache: Path, out: Path, opts) -> dict:
    """One ``mixrl eval`` in a child process; its ``--out`` JSON."""
    cmd = [sys.executable, "-m", "mixrl.cli.main", "eval", model, "benchmarks=arith", f"benchmarks.backend={backend}",
           f"benchmarks.cache_dir={cache}", f"trainer.eval_size={opts.problems}",
           f"benchmarks.arith.protocol.samples={opts.samples}", f"benchmarks.arith.protocol.temperature={opts.temperature}",
           f"benchmarks.arith.protocol.max_new_tokens={opts.max_new_tokens}", f"benchmarks.arith.protocol.metrics=[avg@{opts.samples}]",
           f"trainer.eval_batch_size={opts.batch_size}", f"hardware.torch_threads={opts.threads}", "logger.progress=false",
           "--out", str(out)]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS=str(opts.threads), VLLM_CPU_KVCACHE_SPACE="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        raise SystemExit(f"error: mixrl eval ({backend}) failed:\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())


def summarize(result: dict, tokenizer) -> dict:
    """Samples, generation and load seconds, samples per second, mean completion tokens, avg of the suite."""
    made = sum(b["generated"] for b in result["benchmarks"])
    secs = sum(b["generation_seconds"] for b in result["benchmarks"])
    load = sum(b.get("load_seconds") or 0.0 for b in result["benchmarks"])
    lengths = []
    for b in result["benchmarks"]:
        for line in Path(b["samples_file"]).read_text().splitlines():
            lengths.append(len(tokenizer(json.loads(line)["completion"], add_special_tokens=False)["input_ids"]))
    return {"samples": made, "generation_seconds": secs, "load_seconds": load,
            "samples_per_second": made / secs if secs > 0 else None,
            "mean_completion_tokens": statistics.fmean(lengths) if lengths else 0.0}


def measure(opts) -> dict:
    from transformers import AutoTokenizer  # deferred: transformers loads only when a model is built or measured

    from mixrl.models import tiny  # deferred: imports torch

    tmp = Path(tempfile.mkdtemp(prefix="mixrl-bench-eval-"))
    model = opts.model or str(tiny.warm_start(tmp / "tiny-cache", steps=10, progress=False))
    tokenizer = AutoTokenizer.from_pretrained(model)
    load_before, t_run = loadavg(), time.perf_counter()
    rounds: list[dict] = []
    for r in range(opts.rounds):
        row = {}
        for backend in (BACKENDS if r % 2 == 0 else BACKENDS[::-1]):
            res = run_eval(model, backend, tmp / f"cache-{r}-{backend}", tmp / f"{r}-{backend}.json", opts)
            row[backend] = summarize(res, tokenizer)
            print(f"round {r + 1} {backend:>4}: {row[backend]['samples']} samples, {row[backend]['samples_per_second']:.2f} samples/s "
                  f"(load {row[backend]['load_seconds']:.1f}s)", file=sys.stderr, flush=True)
        rounds.append(row)
    rep = {"date": datetime.now().astimezone().isoformat(timespec="seconds"),
           "command": " ".join([".venv-vllm/bin/python -m bench.eval_backends", *([shlex.join(opts.argv)] if opts.argv else [])]),
           "commit": git_commit(), "machine": machine_info("cpu"), "load_before": load_before, "load_after": loadavg(),
           "run_seconds": time.perf_counter() - t_run, "samples": opts.samples, "max_new_tokens": opts.max_new_tokens,
           "threads": opts.threads, "batch_size": opts.batch_size, "problems": opts.problems,
           "temperature": opts.temperature, "rounds": rounds}
    try:
        import vllm  # deferred: vLLM is optional (only .venv-vllm has it)

        rep["machine"]["vllm"] = vllm.__version__
    except ImportError:
        pass
    return rep


def markdown(rep: dict) -> str:
    m = rep["machine"]
    lines = [
        "# `mixrl eval`: HF generate vs vLLM (CPU)", "",
        f"Command: `{rep['command']}` (`bench/eval_backends.py`)  ",
        f"Date: {rep['date']}; commit {rep['commit']}; run {rep['run_seconds']:.0f}s  ",
        f"Machine: {m['cpu']}, {m['cpu_count']} CPUs ({m.get('affinity')} usable); torch {m['torch']}, transformers "
        f"{m['transformers']}, vLLM {m.get('vllm', 'n/a')}  ",
        f"Load average (1, 5, 15 min) before: {rep['load_before']}; after: {rep['load_after']} (a machine shared with other jobs)", "",
        f"The tiny built-in model, `benchmarks=arith` ({rep['problems']} held-out problems), {rep['samples']} samples per "
        f"problem at temperature {rep['temperature']}, at most {rep['max_new_tokens']} new tokens; {rep['threads']} thread(s) "
        f"for both (`OMP_NUM_THREADS`, `hardware.torch_threads`), HF batch size {rep['batch_size']} (`trainer.eval_batch_size`). Samples per second "
        "count generation only; load is loading the model (HF) or starting the engine (vLLM).", "",
        "| round | backend | samples | generation s | samples/s | load s | mean completion tokens |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for i, row in enumerate(rep["rounds"], 1):
        for b in BACKENDS:
            s = row[b]
            lines.append(f"| {i} | {b} | {s['samples']} | {s['generation_seconds']:.1f} | {s['samples_per_second']:.2f} | "
                         f"{s['load_seconds']:.1f} | {s['mean_completion_tokens']:.1f} |")
    ratios = [row["vllm"]["samples_per_second"] / row["hf"]["samples_per_second"] for row in rep["rounds"]]
    lines += ["", f"vLLM / HF samples per second, per round: {', '.join(f'{x:.2f}' for x in ratios)} "
              f"(median {statistics.median(ratios):.2f})."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--samples", type=int, default=8, help="samples per problem")
    p.add_argument("--problems", type=int, default=64, help="held-out problems (trainer.eval_size)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64, help="HF generate's batch (trainer.eval_batch_size)")
    p.add_argument("--model", default=None, help="a model folder (default: the tiny model, warm-started)")
    p.add_argument("--out", default=None, help="report folder (default runs/bench/eval-<UTC time>/)")
    opts = p.parse_args(argv)
    opts.argv = list(sys.argv[1:] if argv is None else argv)
    path = report_file(opts.out, "eval", "bench-eval.md")
    rep = measure(opts)
    text = markdown(rep)
    print(text)
    if path is not None:
        write_text(path, text)
        write_text(path.with_suffix(".json"), json.dumps(rep, indent=1, default=str))
        print(f"report: {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
