"""What the sampler variants pay: generated rollouts per trained rollout, and wall time per
trained rollout, against plain GRPO.

    python -m bench.sampler                          # 20 steps per variant, levels 3-6, CPU
    python -m bench.sampler --steps 10 --only none,dynamic
    python -m bench.sampler --set data.levels=[1,2,3,4] --out docs/results/bench-sampler.md

Each variant is one ``mixrl train algo=grpo sampler=NAME`` run (its own process, one after the
other, one torch thread, no held-out evaluation, no checkpoints) with the same seed, data and
geometry; completions stop at eos (a filter reads the rewards, so lengths cannot be fixed as in
:mod:`bench.throughput`). From each run's ``summary.json``: rollouts generated (every round,
dropped groups included) and trained, ``train_seconds``; reported: generated / trained, seconds
per trained rollout and per generated rollout, and the ratio of seconds per trained rollout to
``sampler=none``'s. Variants run one after the other, so background load is not shared alike as in
the interleaved throughput benchmark: ``--repeats N`` runs the whole list N times round-robin
(the same seed: the same rollouts each time) and keeps each variant's fastest run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

VARIANTS = ("none", "dynamic", "balanced", "thompson", "curriculum")
BASE = ["algo=grpo", "data.levels=[3,4,5,6]", "trainer.eval_size=0", "trainer.save_steps=0",
        "hardware.torch_threads=1", "logger.progress=false"]


def run_variant(name: str, steps: int, extra: list[str], root: Path) -> dict:
    """One training run; its summary's rollout counts and train time."""
    run_dir = root / name
    cmd = [sys.executable, "-c", "from mixrl.cli.main import app; app()", "train", *BASE,
           f"sampler={name}", f"trainer.max_steps={steps}", *extra, f"run_dir={run_dir}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise SystemExit(f"error: sampler={name} failed (exit {res.returncode}): {res.stderr.strip().splitlines()[-1:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    s = summary.get("sampler") or {"generated": summary["rollouts"], "trained": summary["rollouts"]}
    return {"sampler": name, "steps": summary["steps"], "generated": s["generated"], "trained": s["trained"],
            "train_seconds": summary["train_seconds"]}


def table(rows: list[dict]) -> str:
    base = next((r for r in rows if r["sampler"] == "none"), None)
    base_t = base["train_seconds"] / base["trained"] if base else None
    lines = ["| sampler | steps | generated | trained | generated / trained | s per trained rollout | "
             "s per generated rollout | s per trained vs none |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        per_trained = r["train_seconds"] / r["trained"]
        ratio = f"{per_trained / base_t:.2f}" if base_t else "-"
        lines.append(f"| {r['sampler']} | {r['steps']} | {r['generated']} | {r['trained']} | "
                     f"{r['generated'] / r['trained']:.2f} | {per_trained:.4f} | {r['train_seconds'] / r['generated']:.4f} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=1, help="run the list this many times round-robin; keep each variant's fastest")
    p.add_argument("--only", default=",".join(VARIANTS), help=f"samplers to run (default all: {','.join(VARIANTS)})")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override for every run")
    p.add_argument("--out", default=None, help="write the Markdown table here")
    p.add_argument("--json", default=None, help="write the rows as JSON here")
    a = p.parse_args(argv)
    names = [n for n in a.only.split(",") if n]
    bad = [n for n in names if n not in VARIANTS]
    if bad:
        raise SystemExit(f"error: unknown sampler(s) {', '.join(bad)}; choose from {', '.join(VARIANTS)}")
    with tempfile.TemporaryDirectory(prefix="mixrl-bench-sampler-") as tmp:
        best: dict[str, dict] = {}
        for r in range(max(1, a.repeats)):
            for n in names:
                row = run_variant(n, a.steps, list(a.set), Path(tmp) / str(r))
                if n not in best or row["train_seconds"] < best[n]["train_seconds"]:
                    best[n] = row
        rows = [best[n] for n in names]
    text = table(rows)
    print(text)
    if a.out:
        Path(a.out).write_text(f"# Sampler cost\n\n`python -m bench.sampler {' '.join(argv or sys.argv[1:])}`\n\n{text}\n")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
