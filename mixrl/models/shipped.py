"""The BPE built-in models' weights, shipped inside the package so that a first run loads them
instead of training them (issue 51: the first ``env=tools`` run waited 109-1,464 s for the tool
model, the first ``model=tiny-bpe algo=kdrl`` run 315-3,167 s for the BPE student and teacher).

``mixrl/models/shipped/<name>/`` holds each model's folder as its warm start wrote it
(``config.json``, the tokenizer files, the ``mixrl_*.json`` metadata), with the weights stored in
float16 (``model.safetensors``, 1.4 MB instead of 2.8); :data:`MANIFEST_FILE` lists, per model, the
cache key of the recipe it was built with and the sha256 of every file. On first use
(:func:`install`) the folder is copied into the cache under that key, the weights widened back
to float32, so the cache holds what a build writes, in the same format: the build's weights
rounded to float16 (no weight moves by more than 1e-3, ``max_abs_rounding``; held-out accuracy of
the build and of the shipped copy is in :data:`MANIFEST_FILE`'s ``eval``). A model whose recipe no longer hashes to the shipped key (a
recipe changed without rebuilding, or ``steps=`` given) is trained as before.

Build them again (deterministic: seeded, one CPU thread; on another CPU the float32 weights may
differ in the last bits, so the check is the hash of the shipped files, not a rebuild)::

    python -m mixrl.models.shipped            # trains the three at their recipes (or reuses the cache), writes shipped/
    python -m mixrl.models.shipped --eval 256 # also prints held-out accuracy, float32 build vs shipped float16

``tests/test_shipped_models.py`` checks the hashes, that the keys are the current recipes', and
that the shipped models do what the tests and suites need (the tool model calls the calculator;
the teacher is accurate; the student leaves RL room).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SHIPPED_DIR = Path(__file__).with_name("shipped")
MANIFEST_FILE = "manifest.json"
WEIGHTS = "model.safetensors"
#: the models shipped: name (a folder under :data:`SHIPPED_DIR`) -> its ``builtin:`` id
NAMES = {"tiny-bpe": "builtin:tiny-bpe", "tiny-bpe-teacher": "builtin:tiny-bpe-teacher", "tiny-bpe-tools": "builtin:tiny-bpe-tools"}


def manifest(folder: Path = SHIPPED_DIR) -> dict[str, Any]:
    """The manifest (name -> ``{"key", "dtype", "files": {file: sha256}, ...}``); empty if none is shipped."""
    path = folder / MANIFEST_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def shipped_for(name: str, key: str, folder: Path = SHIPPED_DIR) -> Path | None:
    """The shipped folder of model ``name`` if it was built with the recipe whose cache key is ``key``
    and every file is there with its manifest's hash; None otherwise (the model is then trained)."""
    entry = manifest(folder).get(name)
    if not entry or entry.get("key") != key:
        return None
    src = folder / name
    if any(not (src / f).is_file() or sha256(src / f) != h for f, h in entry["files"].items()):
        return None
    return src


def install(name: str, final: Path, *, meta_file: str) -> bool:
    """Copy the shipped model ``name`` to the cache folder ``final`` (whose name is the recipe's cache
    key), weights widened to float32, atomically; False (nothing written) when none is shipped for that key."""
    src = shipped_for(name, final.name)
    if src is None:
        return False
    from safetensors.torch import load_file, save_file  # deferred: torch; config show/plan import the model modules

    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it 0o700; the cache is meant to be shared like any other
    try:
        for f in manifest()[name]["files"]:
            if f == WEIGHTS:
                save_file({k: v.float() for k, v in load_file(src / f).items()}, tmp / f, metadata={"format": "pt"})
            else:
                shutil.copyfile(src / f, tmp / f)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / meta_file).is_file():  # lost a race to a concurrent writer that left nothing usable
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return True


# --------------------------------------------------------------------------- building the shipped copies


def pack(name: str, built: Path, out: Path, *, meta_file: str) -> dict[str, Any]:
    """Write the float16 copy of the built model folder ``built`` to ``out/name``; its manifest entry."""
    import torch  # deferred: only building imports it
    from safetensors.torch import load_file, save_file

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
    from mixrl.models import tiny_bpe, tiny_bpe_tools  # deferred: they import torch

    return {
        "tiny-bpe": (lambda **kw: tiny_bpe.warm_start(**kw), tiny_bpe._META_FILE),
        "tiny-bpe-teacher": (lambda **kw: tiny_bpe.teacher_warm_start(**kw), tiny_bpe._META_FILE),
        "tiny-bpe-tools": (lambda **kw: tiny_bpe_tools.warm_start(**kw), tiny_bpe_tools._META_FILE),
    }


def _accuracy(name: str, path: Path, n: int) -> float:
    from mixrl.models import tiny_bpe, tiny_bpe_tools  # deferred: they import torch

    if name == "tiny-bpe-tools":
        from transformers import AutoModelForCausalLM, AutoTokenizer  # deferred: transformers, 1 s

        from mixrl.tasks import arith_tools

        tok = tiny_bpe_tools.set_templates(AutoTokenizer.from_pretrained(path))
        model = AutoModelForCausalLM.from_pretrained(path)
        return tiny_bpe_tools.call_accuracy(model, tok, arith_tools.heldout_split(n, levels=tiny_bpe_tools.WARM_START["levels"]))
    return tiny_bpe.heldout_accuracy(path, n)["all"]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mixrl.models.shipped", description=__doc__.splitlines()[0])
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
                from safetensors.torch import load_file, save_file

                save_file({k: v.float() for k, v in load_file(copy / WEIGHTS).items()}, copy / WEIGHTS, metadata={"format": "pt"})
                metric = "tool-call accuracy" if name == "tiny-bpe-tools" else "greedy accuracy, levels 1-4"
                entry["eval"] = {"n": args.eval, "metric": metric, "build_float32": _accuracy(name, built, args.eval),
                                 "shipped": _accuracy(name, copy, args.eval)}
            print(f"{name}: held-out {entry['eval']}", file=sys.stderr)
        entries[name] = entry
    (args.out / MANIFEST_FILE).write_text(json.dumps(entries, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
