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

Build them again with :mod:`mixrl.cli.ship_models` (deterministic: seeded, one CPU thread; on another CPU the float32 weights may
differ in the last bits, so the check is the hash of the shipped files, not a rebuild)::

    python -m mixrl.cli.ship_models            # trains the three at their recipes (or reuses the cache), writes shipped/
    python -m mixrl.cli.ship_models --eval 256 # also prints held-out accuracy, float32 build vs shipped float16

``tests/test_shipped_models.py`` checks the hashes, that the keys are the current recipes', and
that the shipped models do what the tests and suites need (the tool model calls the calculator;
the teacher is accurate; the student leaves RL room).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from mixrl.models.atomic import publishing

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

    with publishing(final, complete=lambda folder: (folder / meta_file).is_file()) as tmp:
        for f in manifest()[name]["files"]:
            if f == WEIGHTS:
                save_file({k: v.float() for k, v in load_file(src / f).items()}, tmp / f, metadata={"format": "pt"})
            else:
                shutil.copyfile(src / f, tmp / f)
    return True
