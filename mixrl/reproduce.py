"""``mixrl reproduce toy``: the toy-scale paper table.

Trains every CPU recipe of the methods the seed papers compare (GRPO, SFT, SFT-then-RL,
RL+SFT mix, CHORD-mu, CHORD-phi, LUFFY) on the built-in task for several seeds at equal
rollout budget (same steps x prompts x generations; SFT uses none), each run a separate
``mixrl train`` process, then ``mixrl compare`` over all of them.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

from mixrl.errors import ConfigError

TOY_RECIPES = (
    "grpo/arith-tiny",
    "sft/arith-tiny",
    "sft_then_rl/arith-tiny",
    "mix/arith-tiny",
    "chord/mu-arith-tiny",
    "chord/phi-arith-tiny",
    "luffy/arith-tiny",
)


def job_overrides(recipe: str, seed: int, runs_dir: Path, extra: list[str]) -> list[str]:
    return [
        f"recipe={recipe}",
        f"seed={seed}",
        f"run_dir={runs_dir / (recipe.replace('/', '-') + f'-s{seed}')}",
        "trainer.eval_every=10",
        "logger.progress=false",
        *extra,
    ]


def reproduce_toy(out_dir: Path, *, seeds: list[int], jobs: int = 2, extra: list[str] = (), recipes=TOY_RECIPES,
                  log=print) -> dict:
    """Run the grid (``jobs`` training processes at a time, one torch thread each when
    ``jobs`` > 1) and compare. Returns what was written."""
    from mixrl.compare import compare
    from mixrl.config.compose import compose_config

    if not seeds or not recipes:
        raise ConfigError("mixrl reproduce toy needs at least one seed and one recipe; use --seeds N with N >= 1")
    out_dir = Path(out_dir)
    runs_dir = out_dir / "runs"
    grid = [(r, s) for r in recipes for s in seeds]
    threads = ["hardware.torch_threads=1"] if jobs > 1 else []
    for r, s in grid:  # check every job before training any
        compose_config(job_overrides(r, s, runs_dir, [*threads, *extra]))
    todo = [(r, s) for r, s in grid if not (runs_dir / (r.replace("/", "-") + f"-s{s}") / "summary.json").exists()]
    log(f"toy grid: {len(grid)} runs ({len(grid) - len(todo)} already done) under {runs_dir}, {jobs} at a time")
    t0 = time.time()

    def run(job):
        r, s = job
        run_dir = runs_dir / (r.replace("/", "-") + f"-s{s}")
        if run_dir.exists():  # an unfinished earlier attempt
            import shutil

            shutil.rmtree(run_dir)
        cmd = [sys.executable, "-m", "mixrl.cli.main", "train", *job_overrides(r, s, runs_dir, [*threads, *extra])]
        env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        started = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        runs_dir.mkdir(parents=True, exist_ok=True)
        (runs_dir / (run_dir.name + ".log")).write_text(proc.stdout + proc.stderr)
        log(f"  {r} seed {s}: {'ok' if proc.returncode == 0 else f'FAILED ({proc.returncode})'} in {time.time() - started:.0f}s")
        return proc.returncode

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        codes = list(pool.map(run, todo))
    if any(codes):
        raise ConfigError(f"{sum(1 for c in codes if c)} toy run(s) failed; see the .log files in {runs_dir}")
    result = compare([runs_dir], out_dir, metric="accuracy")
    meta = {
        "command": "mixrl reproduce toy " + " ".join(sys.argv[3:]) if len(sys.argv) > 3 else "mixrl reproduce toy",
        "commit": _commit(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {_cpu_name()}",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "grid_seconds": round(time.time() - t0),
        "recipes": list(recipes),
        "seeds": list(seeds),
    }
    (out_dir / "reproduce.json").write_text(json.dumps(meta, indent=2))
    return {"compare": str(result.markdown), "meta": meta}


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        return "unknown"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"
