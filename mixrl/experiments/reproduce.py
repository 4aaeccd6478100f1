"""``mixrl reproduce SUITE``: run a suite's grid (recipes x seeds), compare, write a README.

A suite is declared in ``conf/suites/NAME.yaml`` (:mod:`mixrl.experiments.suites`): the methods (recipes),
seeds, budget overrides and the papers' claims as data. Each run is a separate
``mixrl train`` process (``jobs`` at a time, one torch thread each when ``jobs`` > 1), at
equal rollout budget (the same steps x prompts x generations; SFT uses none). Then
``mixrl compare`` over all of them, with the claims judged over seeds, and a ``README.md``
holding the command, commit, machine, grid time and the claims next to the measurements.
Runs that already finished (their ``summary.json`` exists) are not trained again.

The command writes to a fresh folder, ``runs/reproduce/SUITE-<UTC time>/``, unless ``--out``
names one (the committed results under ``docs/results/`` change only when a user names them).
The README describes exactly the runs in its folder: each method's recipe, seeds, steps and
wall time, which of them this command trained, and how the grid differs from the suite's
(fewer methods or seeds, extra overrides).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
import dataclasses

from mixrl.config.compose import compose_config
from mixrl.errors import ConfigError, did_you_mean
from mixrl.experiments.compare import compare
from mixrl.experiments.runs import find_runs
from mixrl.experiments.suites import Suite, load_suite
from mixrl.options import check_out_folder
from mixrl.progress import NoProgress

#: The toy suite's recipes (conf/suites/toy.yaml), kept for callers of reproduce_toy.
TOY_RECIPES = (
    "grpo/arith-tiny",
    "sft/arith-tiny",
    "sft_then_rl/arith-tiny",
    "mix/arith-tiny",
    "chord/mu-arith-tiny",
    "chord/phi-arith-tiny",
    "luffy/arith-tiny",
)


def run_name(recipe: str, seed: int) -> str:
    return recipe.replace("/", "-") + f"-s{seed}"


#: where a grid's runs share the evaluation of their starting model (mixrl.evaluation.cache)
EVAL_CACHE = "eval_before_cache"


def job_overrides(recipe: str, seed: int, runs_dir: Path, extra: Sequence[str]) -> list[str]:
    return [
        f"recipe={recipe}",
        f"seed={seed}",
        f"run_dir={runs_dir / run_name(recipe, seed)}",
        "trainer.eval_every=10",
        f"trainer.eval_before_cache={runs_dir / EVAL_CACHE}",
        "logger.progress=false",
        *extra,
    ]


def default_out_dir(suite_name: str, now: datetime | None = None) -> Path:
    """Where ``mixrl reproduce SUITE`` writes without ``--out``: a new folder per call."""
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%d-%H%M%S")
    return Path("runs") / "reproduce" / f"{suite_name}-{stamp}"


#: what ``mixrl reproduce`` writes at the top of its folder (compare's PNG plots too: ``*.png``)
REPRODUCE_ENTRIES = frozenset({"runs", "compare.md", "compare.json", "reproduce.json", "README.md"})


def check_out_dir(out_dir: Path) -> None:
    """May ``mixrl reproduce`` write into ``out_dir``? Reads only. Yes when it is missing or
    empty, holds an earlier ``mixrl reproduce``'s results (its ``reproduce.json``; finished runs
    are reused, the README and tables rewritten), or only its ``runs/`` (a grid that was
    stopped). Otherwise ConfigError naming the first file it did not write (a README.md or
    compare.md of the user's own would be overwritten), as ``run_dir`` is refused
    (:func:`mixrl.trainer.state.rundir.check_new_run_dir`): mixrl never overwrites what it did not write."""
    check_out_folder(out_dir, "--out", command="mixrl reproduce", writes=(*REPRODUCE_ENTRIES, "*.png"),
                     marker="reproduce.json", partial=("runs",))


@dataclass
class GridResult:
    """What :func:`run_grid` did: wall seconds, and the (recipe, seed) jobs it trained."""

    seconds: float
    trained: list[tuple[str, int]]


def run_grid(runs_dir: Path, recipes: Sequence[str], seeds: Sequence[int], *, jobs: int = 2, extra: Sequence[str] = (),
             log=print, name: str = "grid", progress=None) -> GridResult:
    """Train every (recipe, seed) not done yet, ``jobs`` processes at a time.
    Every job's config is checked before any trains. ``progress``: a display of
    :func:`mixrl.progress.progress_bar` counting the runs (none by default)."""
    if not seeds or not recipes:
        raise ConfigError(f"mixrl reproduce {name} needs at least one seed and one recipe; use --seeds N with N >= 1")
    runs_dir = Path(runs_dir)
    grid = [(r, s) for r in recipes for s in seeds]
    threads = ["hardware.torch_threads=1"] if jobs > 1 else []
    for r, s in grid:
        compose_config(job_overrides(r, s, runs_dir, [*threads, *extra]))
    todo = [(r, s) for r, s in grid if not (runs_dir / run_name(r, s) / "summary.json").exists()]
    log(f"{name} grid: {len(grid)} runs ({len(grid) - len(todo)} already done) under {runs_dir}, {jobs} at a time")
    t0 = time.time()

    def run(job):
        r, s = job
        run_dir = runs_dir / run_name(r, s)
        if run_dir.exists():  # an unfinished earlier attempt
            shutil.rmtree(run_dir)
        cmd = [sys.executable, "-m", "mixrl.cli.main", "train", *job_overrides(r, s, runs_dir, [*threads, *extra])]
        env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        if jobs > 1:
            env["OMP_NUM_THREADS"] = "1"
        started = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        runs_dir.mkdir(parents=True, exist_ok=True)
        (runs_dir / (run_dir.name + ".log")).write_text(proc.stdout + proc.stderr)
        log(f"  {r} seed {s}: {'ok' if proc.returncode == 0 else f'FAILED ({proc.returncode})'} in {time.time() - started:.0f}s")
        bar.advance(task)
        return proc.returncode

    bar = progress or NoProgress()  # a display of mixrl.progress: runs done / left, with the time left
    with bar, ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        task = bar.add_task(f"{name} runs", total=len(todo))
        codes = list(pool.map(run, todo))
    if any(codes):
        raise ConfigError(f"{sum(1 for c in codes if c)} {name} run(s) failed; see the .log files in {runs_dir}")
    return GridResult(time.time() - t0, todo)


def reproduce_suite(suite, out_dir: Path, *, seeds: int | None = None, jobs: int | None = None, extra: Sequence[str] = (),
                    log=print, plots: bool = True, only: Sequence[str] = (), progress=None) -> dict:
    """Run ``suite`` (a name, a path or a :class:`mixrl.experiments.suites.Suite`) into ``out_dir``:
    ``runs/``, ``compare.md`` / ``compare.json`` / plots, ``reproduce.json`` and ``README.md``.
    ``only``: run just these method labels (a smoke run); claims about the others read "not measured"."""
    s = full = suite if isinstance(suite, Suite) else load_suite(suite)
    if only:
        for label in only:
            if label not in s.methods:
                raise ConfigError(f"--only: '{label}' is not a method of suite {s.name}{did_you_mean(label, list(s.methods))}; "
                                  f"methods: {', '.join(s.methods)}")
        s = dataclasses.replace(s, methods={k: v for k, v in s.methods.items() if k in only})
    n_seeds = s.seeds if seeds is None else int(seeds)
    n_jobs = s.jobs if jobs is None else int(jobs)
    out_dir = Path(out_dir)
    check_out_dir(out_dir)  # before any run: a folder of the user's own is never written into
    seed_list = list(range(n_seeds))
    overrides = [*s.overrides, *extra]
    grid = run_grid(out_dir / "runs", s.recipes, seed_list, jobs=n_jobs, extra=overrides, log=log, name=s.name,
                    progress=progress)
    result = compare([out_dir / "runs"], out_dir, metric=s.metric, target=s.target, claims=s.claims, plots=plots)
    meta = {
        "suite": s.name,
        "command": " ".join(["mixrl reproduce", *sys.argv[2:]]) if len(sys.argv) > 2 and sys.argv[1] == "reproduce"
        else f"mixrl reproduce {s.name}",
        "commit": _commit(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {_cpu_name()}",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "grid_seconds": round(grid.seconds),
        "jobs": n_jobs,
        "methods": s.methods,
        "recipes": s.recipes,
        "seeds": seed_list,
        "overrides": overrides,
        "extra_overrides": list(extra),
        "suite_methods": len(full.methods),
        "suite_seeds": full.seeds,
        "trained_now": [run_name(r, seed) for r, seed in grid.trained],
        "runs": runs_in_folder(out_dir / "runs", full),
    }
    meta["run_cpu_seconds"] = _cpu_total(out_dir / "runs", s.recipes, seed_list)
    (out_dir / "reproduce.json").write_text(json.dumps(meta, indent=2))
    (out_dir / "README.md").write_text(render_readme(s, meta, result.markdown.read_text()))
    return {"compare": str(result.markdown), "readme": str(out_dir / "README.md"), "meta": meta, "claims": result.claims}


def _cpu_total(runs_dir: Path, recipes: Sequence[str], seeds: Sequence[int]) -> float | None:
    """Sum of the runs' CPU seconds (``summary.json`` cpu_seconds); None if any run lacks it."""
    total = 0.0
    for r in recipes:
        for s in seeds:
            try:
                v = json.loads((runs_dir / run_name(r, s) / "summary.json").read_text()).get("cpu_seconds")
            except (OSError, json.JSONDecodeError):
                return None
            if v is None:
                return None
            total += float(v)
    return round(total)


def runs_in_folder(runs_dir: Path, suite) -> list[dict]:
    """One row per finished run under ``runs_dir`` (older runs included): label, recipe, seed,
    optimizer steps and wall seconds from its ``summary.json``."""
    rows = []
    for path in find_runs([runs_dir]) if Path(runs_dir).is_dir() else []:
        try:
            summary = json.loads((path / "summary.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue
        recipe = summary.get("recipe") or path.name
        rows.append({"run": path.name, "label": suite.label(recipe), "recipe": recipe, "seed": summary.get("seed"),
                     "steps": summary.get("steps"), "wall_seconds": summary.get("wall_seconds")})
    return rows


def _by_method(runs: list[dict], trained_now: set[str]) -> list[dict]:
    methods: dict[str, dict] = {}
    for r in runs:
        m = methods.setdefault(r["label"], {"label": r["label"], "recipe": r["recipe"], "seeds": [], "steps": set(),
                                            "wall": 0.0, "now": 0})
        m["seeds"].append(r["seed"])
        m["steps"].add(r["steps"])
        m["wall"] += float(r["wall_seconds"] or 0.0)
        m["now"] += r["run"] in trained_now
    return list(methods.values())


def render_readme(suite, meta: dict, compare_md: str) -> str:
    """The suite's README: provenance, the runs in the folder (and how they differ from the
    suite's full grid), then compare.md's tables and the judged claims."""
    runs = meta.get("runs", [])
    now = set(meta.get("trained_now", []))
    methods = _by_method(runs, now)
    n_full = meta.get("suite_methods", len(meta["methods"]))
    full_seeds = meta.get("suite_seeds", len(meta["seeds"]))
    extra = meta.get("extra_overrides", [])
    partial = []
    if len(methods) < n_full:
        partial.append(f"{len(methods)} of the suite's {n_full} methods")
    seeds_present = {r["seed"] for r in runs}
    if len(seeds_present) < full_seeds:
        partial.append(f"{len(seeds_present)} of its {full_seeds} seeds")
    if extra:
        partial.append("overrides beyond the suite's: " + ", ".join(f"`{o}`" for o in extra))
    wall = sum(m["wall"] for m in methods)
    lines = [f"# {suite.title}", ""]
    if partial:
        lines += [f"**Not the suite's full grid:** {'; '.join(partial)}. The title (and notes) describe the full suite; "
                  "the tables below, only the runs listed here.", ""]
    lines += [
        f"**Command:** `{meta['command']}`", "",
        f"- suite: `{suite.path.name if suite.path else suite.name}`",
        f"- commit: {meta['commit']}",
        f"- machine: {meta['machine']}",
        f"- date: {meta['date']}",
        f"- runs in this folder: {len(runs)} ({len(now)} trained by this command in {meta['grid_seconds']} s, "
        f"{meta['jobs']} at a time" + (", one torch thread each" if meta["jobs"] > 1 else "")
        + f"; {len(runs) - len(now)} found already done); the runs' own wall times add up to {wall:.0f} s"
        + (f", their CPU time to {meta['run_cpu_seconds']} s" if meta.get("run_cpu_seconds") else ""),
        "- overrides on every run: " + (", ".join(f"`{o}`" for o in meta["overrides"]) or "none"), "",
        "| method | recipe | seeds | steps | wall time (sum) | trained by this command |", "|---|---|---|---|---:|---:|",
        *[f"| {m['label']} | `{m['recipe']}` | {', '.join(str(x) for x in sorted(m['seeds'], key=str))} | "
          f"{', '.join(str(x) for x in sorted(m['steps'], key=str))} | {m['wall']:.0f} s | {m['now']} of {len(m['seeds'])} |"
          for m in methods], "",
    ]
    if suite.notes and not partial:
        lines += [suite.notes, ""]
    body = compare_md.split("\n", 1)[1] if compare_md.startswith("# ") else compare_md
    lines += ["## Measurements", body.lstrip("\n")]
    return "\n".join(lines)


def reproduce_toy(out_dir: Path, *, seeds: list[int], jobs: int = 2, extra: Sequence[str] = (), recipes=TOY_RECIPES,
                  log=print) -> dict:
    """The toy grid with explicit seeds and recipes (no claims); ``mixrl reproduce toy`` runs the toy suite."""
    out_dir = Path(out_dir)
    check_out_dir(out_dir)
    grid = run_grid(out_dir / "runs", recipes, seeds, jobs=jobs, extra=extra, log=log, name="toy")
    result = compare([out_dir / "runs"], out_dir, metric="accuracy")
    meta = {
        "command": "mixrl reproduce toy", "commit": _commit(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {_cpu_name()}",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "grid_seconds": round(grid.seconds),
        "recipes": list(recipes), "seeds": list(seeds),
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
