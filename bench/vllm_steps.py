"""Step time with vLLM generation: colocate, server and async against HF generate, and mixrl
against plain TRL with vLLM, in one run (run it where vLLM is installed: ``.venv-vllm`` on CPU).

    .venv-vllm/bin/python -m bench.vllm_steps                      # every variant, 2 warm-up + 5 measured steps
    .venv-vllm/bin/python -m bench.vllm_steps --only hf,server,async --steps 3

Variants (the built-in tiny model, ``builtin:arith``, the default batch geometry, every
completion ``max_completion_length`` tokens long so every step does the same work):

``hf``            mixrl ``algo=grpo``, HF ``generate`` in the trainer (``hardware=cpu``)
``colocate``      mixrl ``algo=grpo``, vLLM colocated (``hardware=cpu-vllm``)
``trl-colocate``  plain ``trl.GRPOTrainer`` (``loss_type=dapo``), vLLM colocated
``server``        mixrl ``algo=grpo``, a vLLM server (``python -m mixrl.vllm_cpu``), synchronous
``async``         the same with ``hardware.vllm_async=true`` (the next batch generates while this one trains)
``trl-server``    plain ``trl.GRPOTrainer``, the same server

Every completion is generated to ``max_completion_length`` tokens (HF: ``min_new_tokens``; vLLM:
``ignore_eos``, whose tokens after an eos are masked out of the loss but still computed).

Each variant runs in a process of its own, one after the other (a colocated engine lives in
its trainer's process; one vLLM at a time): the colocated ones first, then one server started
for the server variants (each trainer pushes its initial weights at its first step). Timing is
bench.throughput's (:class:`bench.timer.StepTimer`): ``on_step_begin`` -> ``on_step_end``; *rollout* = TRL's
``_generate_and_score_completions`` (generation, or waiting for the batch in flight, + scoring).
TRL's variants get the CPU plumbing mixrl's get (the engine in the trainer's dtype, weight sync
to the server through a file: mixrl.trainer.trl_vllm, mixrl.vllm_file_transfer). Sequential runs on a
shared machine are noisier than bench.throughput's interleaved ones: read the min/min column too.
The report, ``bench-vllm.md``, goes to a new ``runs/bench/vllm-<UTC time>/`` unless ``--out DIR``
names another folder (``--out docs/results`` for the committed one).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from bench.machine import REPO, git_commit, loadavg, machine_info  # noqa: E402
from bench.records import StepRecord, VariantResult, fmt, paired_ratio  # noqa: E402
from bench.report import check_out, report_file, write_text  # noqa: E402
from bench.timer import StepTimer  # noqa: E402
from bench.turns import Turns  # noqa: E402
from bench.variants import build_mixrl_trainer, build_trl_trainer, compose, run_overrides  # noqa: E402

VARIANTS = ("hf", "colocate", "trl-colocate", "server", "async", "trl-server")
DESCRIPTIONS = {
    "hf": "mixrl algo=grpo, HF generate",
    "colocate": "mixrl algo=grpo, vLLM colocated",
    "trl-colocate": "plain trl.GRPOTrainer, vLLM colocated",
    "server": "mixrl algo=grpo, vLLM server (synchronous)",
    "async": "mixrl algo=grpo, vLLM server, hardware.vllm_async=true",
    "trl-server": "plain trl.GRPOTrainer, vLLM server",
}
SERVER_VARIANTS = ("server", "async", "trl-server")
RATIOS = (
    ("colocate", "hf", "vLLM colocated / HF generate (mixrl grpo)"),
    ("server", "hf", "vLLM server / HF generate (mixrl grpo)"),
    ("async", "server", "async / synchronous server (mixrl grpo)"),
    ("async", "hf", "async server / HF generate (mixrl grpo)"),
    ("colocate", "trl-colocate", "mixrl grpo / plain TRL, vLLM colocated"),
    ("server", "trl-server", "mixrl grpo / plain TRL, vLLM server"),
)


def overrides_for(variant: str, opts) -> list[str]:
    base = run_overrides(["hardware.torch_threads=1", *opts.set])
    if variant == "hf":
        return base
    hw = ["hardware=cpu-vllm"]
    if variant in SERVER_VARIANTS:
        hw += ["hardware.vllm_mode=server", f"hardware.vllm_server_port={opts.port}"]
    if variant == "async":
        hw.append("hardware.vllm_async=true")
    return hw + base


# --------------------------------------------------------------------------- one variant (child process)
def child(opts) -> None:
    """Build and train one variant for warm-up + measured steps; write its records as JSON."""
    import transformers  # deferred: transformers loads only when a model is built or measured

    transformers.utils.logging.set_verbosity_error()
    v = opts.child
    W, S = opts.warmup, opts.steps
    cfg = compose("grpo", overrides_for(v, opts), W + S)
    L = int(cfg.trainer.max_completion_length)
    # every completion max_completion_length tokens: HF's min_new_tokens (eos suppressed), vLLM's ignore_eos (eos
    # may be sampled and generation goes on: vLLM's min_tokens would mask eos in the log-probs it reports, which
    # then differ from the trainer's and stop the run at the weight-sync check)
    gen = {"min_new_tokens": L} if v == "hf" else {"ignore_eos": True}
    turns = Turns([v], seed=0, interleaved=False, device="cpu")
    timer = StepTimer(v, turns, "cpu", W, W + S, description=DESCRIPTIONS[v])
    out_dir = Path(tempfile.mkdtemp(prefix=f"mixrl-bench-vllm-{v}-"))
    t0 = time.perf_counter()
    if v.startswith("trl-"):
        from mixrl.trainer.build import _colocated_engine, resolve_model_path  # deferred: imports torch (the config and CLI layers stay light until a run is built)

        with _colocated_engine(cfg, resolve_model_path(cfg, progress=False)):  # the same CPU plumbing as mixrl's
            trainer = build_trl_trainer(cfg, out_dir, [timer.callback()], generation_kwargs=gen)
    else:
        trainer = build_mixrl_trainer(cfg, out_dir, [timer.callback()], generation_kwargs=gen)
    trainer._generate_and_score_completions = timer.rollout(trainer._generate_and_score_completions)
    setup = time.perf_counter() - t0
    trainer.train()
    res = timer.result
    staleness = None
    metrics = out_dir / "metrics.jsonl"
    if metrics.exists():
        rows = [json.loads(x) for x in metrics.read_text().splitlines() if '"staleness/mean"' in x]
        staleness = [r["staleness/mean"] for r in rows] or None
    Path(opts.json_out).write_text(json.dumps({"result": asdict(res), "setup_s": setup, "staleness": staleness}))


# --------------------------------------------------------------------------- the run (parent)
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server(model: str, port: int, log_path: Path, max_model_len: int):
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    log = open(log_path, "w")  # noqa: SIM115 - the server writes it until stopped
    proc = subprocess.Popen([sys.executable, "-m", "mixrl.vllm_cpu", "--model", model, "--port", str(port),
                             "--max-model-len", str(max_model_len)], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.time() + 600
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return proc, log
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            _stop(proc, log)
            raise SystemExit(f"error: the vLLM server did not start; see {log_path}")
        time.sleep(2)


def _stop(proc, log) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)
    log.close()


def _load(path: Path) -> tuple[VariantResult, dict]:
    d = json.loads(path.read_text())
    r = d["result"]
    res = VariantResult(r["name"], r["description"], [StepRecord(**x) for x in r["records"]], r.get("state_mb"), r.get("error"))
    return res, d


def run(opts, log) -> dict:
    from mixrl.models import tiny  # deferred: imports torch

    variants = [v.strip() for v in opts.only.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise SystemExit(f"error: unknown variant(s) {', '.join(bad)}; choose from {', '.join(VARIANTS)}")
    model = opts.model or tiny.warm_start(progress=False)
    if not any(s.startswith("model.path=") for s in opts.set):
        opts.set = [*opts.set, f"model.path={model}"]
    opts.port = opts.port or _free_port()
    tmp = Path(tempfile.mkdtemp(prefix="mixrl-bench-vllm-"))
    # in --only's order, the colocated (and HF) variants first: one vLLM at a time
    order = [v for v in variants if v not in SERVER_VARIANTS] + [v for v in variants if v in SERVER_VARIANTS]
    results, extra, server = {}, {}, None
    load_before = loadavg()
    t_run = time.perf_counter()
    try:
        for v in order:
            if v in SERVER_VARIANTS and server is None:
                t = time.perf_counter()
                server = _server(model, opts.port, tmp / "server.log", opts.max_model_len)
                extra["server_start_s"] = time.perf_counter() - t
                log(f"vLLM server up on port {opts.port} in {extra['server_start_s']:.0f}s")
            out = tmp / f"{v}.json"
            cmd = [sys.executable, "-m", "bench.vllm_steps", "--child", v, "--json-out", str(out), "--warmup", str(opts.warmup),
                   "--steps", str(opts.steps), "--port", str(opts.port), *[f"--set={s}" for s in opts.set]]
            env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
                       VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
            t = time.perf_counter()
            proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"error: variant {v} failed:\n{proc.stderr[-4000:]}")
            results[v], extra[v] = _load(out)
            med = results[v].med("seconds")
            log(f"{v:>12}: median step {med:.3f}s over {len(results[v].measured())} steps ({time.perf_counter() - t:.0f}s with set-up)")
    finally:
        if server is not None:
            _stop(*server)
    rep = {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join([".venv-vllm/bin/python -m bench.vllm_steps", *([shlex.join(opts.argv)] if opts.argv else [])]),
        "commit": git_commit(), "machine": machine_info("cpu"), "load_before": load_before, "load_after": loadavg(),
        "warmup": opts.warmup, "steps": opts.steps, "run_seconds": time.perf_counter() - t_run,
        "geometry": _geometry(opts.set),
        "results": results, "extra": extra,
    }
    try:
        import vllm  # deferred: vLLM is optional (only .venv-vllm has it)

        rep["machine"]["vllm"] = vllm.__version__
    except ImportError:
        pass
    return rep


def _geometry(sets: list[str]) -> str:
    from mixrl.config.geometry import geometry  # deferred: imports torch (the config and CLI layers stay light until a run is built)

    return geometry(compose("grpo", ["logger.progress=false", *sets], 1)).describe()


def ratio_rows(rep: dict) -> list[tuple[str, dict | None]]:
    res = rep["results"]
    return [(label, paired_ratio(res.get(a), res.get(b))) for a, b, label in RATIOS if a in res and b in res]


def markdown(rep: dict) -> str:
    m = rep["machine"]
    lines = [
        "# Step time with vLLM generation (CPU)",
        "",
        f"Re-measure with `{rep['command']}` (from the repository root, in `.venv-vllm`).",
        "",
        f"- date: {rep['date']}; commit: `{rep['commit']}`",
        f"- machine: {m['cpu']}, {m['cpu_count']} CPUs ({m['affinity']} usable), torch threads 1 per trainer",
        f"- software: Python {m['python']}, torch {m['torch']}, transformers {m['transformers']}, trl {m['trl']}, vllm {m.get('vllm', '?')}",
        f"- load average before/after: {rep['load_before']} / {rep['load_after']}",
        f"- geometry: {rep['geometry']}; every completion generated to full length",
        f"- steps: {rep['warmup']} warm-up + {rep['steps']} measured per variant, each variant in its own process, one after "
        f"the other; run {rep['run_seconds']:.0f}s" + (f"; server start {rep['extra']['server_start_s']:.0f}s" if "server_start_s" in rep["extra"] else ""),
        "",
        "| variant | what | step s (median) | min s | rollout s | train s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, r in rep["results"].items():
        q = r.quantiles()
        lines.append(f"| `{name}` | {r.description} | {fmt(r.med('seconds'))} | {fmt(q[0] if q else None)} | "
                     f"{fmt(r.med('rollout_seconds'))} | {fmt(r.med('train_seconds'))} |")
    lines += ["", "*rollout* = `_generate_and_score_completions` (generation, or for `async` the wait for the batch in "
              "flight, + scoring); *train* = step − rollout.", "", "| comparison | step (median of per-step ratios) | min/min |",
              "|---|---:|---:|"]
    for label, d in ratio_rows(rep):
        cell = "–" if not d or d["paired_median"] is None else f"{d['paired_median']:.3f} [{d['paired_min']:.2f}–{d['paired_max']:.2f}]"
        lines.append(f"| {label} | {cell} | {fmt(d.get('ratio_of_mins') if d else None)} |")
    st = (rep["extra"].get("async") or {}).get("staleness")
    if st:
        lines += ["", f"`async` staleness per step (mean over rows, trainer step − generating version): {st}"]
    lines += ["", "<details><summary>per-step seconds (measured steps)</summary>", ""]
    for name, r in rep["results"].items():
        lines.append(f"- `{name}`: " + ", ".join(f"{x.seconds:.3f}" for x in r.measured()))
    lines += ["", "</details>", ""]
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.vllm_steps", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--only", default=",".join(VARIANTS), help=f"variants (default all: {','.join(VARIANTS)})")
    p.add_argument("--model", default=None, help="model folder (default: the built-in tiny model)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override for every variant")
    p.add_argument("--port", type=int, default=None, help="the server's port (default: a free one)")
    p.add_argument("--max-model-len", type=int, default=64, help="the server's context (prompt + completion)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="folder for bench-vllm.md (default: a new runs/bench/vllm-<UTC time>/; '--out docs/results' "
                   "updates the committed report); a path ending in .md names the report itself; '' writes none")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--json-out", default=None, help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    opts.argv = [a for a in (sys.argv[1:] if argv is None else argv)]
    problem = check_out(opts.out)
    if problem:
        p.error(problem)
    if not opts.child:
        md = report_file(opts.out, "vllm", "bench-vllm.md")
        opts.out = str(md) if md is not None else ""
    return opts


def main(argv=None) -> None:
    opts = parse_args(argv)
    if opts.child:
        child(opts)
        return
    rep = run(opts, log=lambda s: print(s, file=sys.stderr, flush=True))
    text = markdown(rep)
    print(text)
    if opts.out:
        print(f"wrote {write_text(opts.out, text)}", file=sys.stderr)


if __name__ == "__main__":
    main()
