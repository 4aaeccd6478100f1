"""Build the BPE built-in models' shipped weights (:mod:`mixrl.models.shipped` installs them)::

    python -m mixrl.cli.ship_models            # trains the three at their recipes (or reuses the cache), writes shipped/
    python -m mixrl.cli.ship_models --eval 256 # also prints held-out accuracy, float32 build vs shipped float16

A maintainer's command, not a ``mixrl`` subcommand: it builds (:mod:`mixrl.models`) and measures
(:mod:`mixrl.evaluation.builtin_models`), so it sits above both.

Deterministic: seeded, one CPU thread; on another CPU the float32 weights may differ in the last
bits, so ``tests/test_shipped_models.py`` checks the hashes of the shipped files, not a rebuild.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from mixrl.evaluation.builtin_models import builtin_accuracy
from mixrl.models import tiny_bpe, tiny_bpe_tools
from mixrl.models.shipped import MANIFEST_FILE, NAMES, SHIPPED_DIR, WEIGHTS, manifest, sha256


def pack(name: str, built: Path, out: Path, *, meta_file: str) -> dict[str, Any]:
    """Write the float16 copy of the built model folder ``built`` to ``out/name``; its manifest entry."""
    dest = out / name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    weights = load_file(built / WEIGHTS)
    half = {k: v.half() if v.is_floating_point() else v for k, v in weights.items()}
    worst = max(((half[k].float() - v).abs().max().item() for k, v in weights.items()), default=0.0)
    if not all(torch.isfinite(t).all() for t in half.values()):
        raise ValueError(f"{name}: a weight does not fit float16; ship it in float32")
    save_file(half, dest / WEIGHTS, metadata={"format": "pt"})
    for f in sorted(p.name for p in built.iterdir() if p.is_file() and p.name != WEIGHTS):
        shutil.copyfile(built / f, dest / f)
    meta = json.loads((dest / meta_file).read_text())
    meta["shipped"] = {"weights": "float16 copy of this build's float32 weights (mixrl.models.shipped), widened to float32 "
                                  "when installed", "max_abs_rounding": worst}
    (dest / meta_file).write_text(json.dumps(meta, indent=2) + "\n")
    files = {f.name: sha256(f) for f in sorted(dest.iterdir())}
    return {"key": built.name, "builtin": NAMES[name], "dtype": "float16", "max_abs_rounding": worst, "files": files}


def _builders() -> dict[str, tuple[Any, str]]:
    return {
        "tiny-bpe": (lambda **kw: tiny_bpe.warm_start(**kw), tiny_bpe._META_FILE),
        "tiny-bpe-teacher": (lambda **kw: tiny_bpe.teacher_warm_start(**kw), tiny_bpe._META_FILE),
        "tiny-bpe-tools": (lambda **kw: tiny_bpe_tools.warm_start(**kw), tiny_bpe_tools._META_FILE),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mixrl.cli.ship_models", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=SHIPPED_DIR, help="where to write the shipped folders (default: %(default)s)")
    ap.add_argument("--only", nargs="*", choices=sorted(NAMES), default=sorted(NAMES), help="build these only")
    ap.add_argument("--eval", type=int, default=0, metavar="N",
                    help="also measure on N held-out problems (greedy accuracy; the tool model: tool-call accuracy) "
                         "the float32 build and the shipped copy")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    entries = manifest(args.out)
    builders = _builders()
    for name in args.only:
        build, meta_file = builders[name]
        t0 = time.time()
        built = build(use_shipped=False)
        entry = pack(name, built, args.out, meta_file=meta_file)
        print(f"{name}: {built} -> {args.out / name} ({time.time() - t0:.0f}s; largest rounding {entry['max_abs_rounding']:.2e})",
              file=sys.stderr)
        if args.eval:
            with tempfile.TemporaryDirectory() as tmp:
                copy = Path(tmp) / built.name
                shutil.copytree(args.out / name, copy)
                save_file({k: v.float() for k, v in load_file(copy / WEIGHTS).items()}, copy / WEIGHTS, metadata={"format": "pt"})
                metric = "tool-call accuracy" if name == "tiny-bpe-tools" else "greedy accuracy, levels 1-4"
                entry["eval"] = {"n": args.eval, "metric": metric, "build_float32": builtin_accuracy(name, built, args.eval),
                                 "shipped": builtin_accuracy(name, copy, args.eval)}
            print(f"{name}: held-out {entry['eval']}", file=sys.stderr)
        entries[name] = entry
    (args.out / MANIFEST_FILE).write_text(json.dumps(entries, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
