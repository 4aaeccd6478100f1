"""What the tiny model is, as data: its special tokens, architecture, warm-start recipes, and the
cache key and folder the recipe hashes to (:mod:`mixrl.models.tiny` builds it; the numbers behind
the recipe are in its docstring).

Imports nothing heavy: ``mixrl plan`` reads the cache folder and the token budgets without
loading ``transformers``.

The cache root is ``$MIXRL_CACHE`` if set, else ``$XDG_CACHE_HOME/mixrl``, else
``~/.cache/mixrl``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from mixrl.tasks import arith

#: Bump on any change to the tokenizer, model or warm-start recipe (it is part of the cache key).
TINY_VERSION = "4"

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)

#: Default architecture (see :func:`mixrl.models.tiny_arch.build_model`).
MODEL_SIZE: dict[str, Any] = {
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "intermediate_size": 256,
    "max_position_embeddings": 64,
    # larger than the usual 0.02: the warm start learns much faster (and GRPO seemed less fragile)
    "initializer_range": 0.08,
}

#: Default warm-start recipe (see :func:`mixrl.models.tiny.warm_start`).
WARM_START: dict[str, Any] = {
    "steps": 300,
    "batch_size": 64,
    "lr": 3e-3,
    "warmup_steps": 20,
    "weight_decay": 0.0,
    "levels": list(arith.EASY_LEVELS),
    # fraction of warm-start examples imitating a careless demonstrator that forgets the last term
    "careless_fraction": 0.6,
    "seed": 0,
}

#: The built-in teacher (``model: builtin:tiny-teacher`` in a teacher config): the same architecture and
#: tokenizer, warm-started on expert solutions only (no careless demonstrator), on every level, for longer.
#: Cached beside the student under ``<cache>/tiny-teacher/<key>/``; its held-out accuracy per level is
#: in docs/concepts/teachers.md.
TEACHER_WARM_START: dict[str, Any] = {
    **WARM_START,
    "steps": 600,
    "levels": list(arith.LEVELS),
    "careless_fraction": 0.0,
}
ROLES = ("student", "teacher")

#: Generation budget that fits every ``arith`` completion plus eos.
MAX_COMPLETION_TOKENS = arith.MAX_SOLUTION_CHARS + 1
#: Longest encoded prompt (bos + prompt).
MAX_PROMPT_TOKENS = arith.MAX_PROMPT_CHARS + 1

_META_FILE = "mixrl_tiny.json"


# --------------------------------------------------------------------------- cache


def cache_root() -> Path:
    """``$MIXRL_CACHE``, else ``$XDG_CACHE_HOME/mixrl``, else ``~/.cache/mixrl``."""
    if os.environ.get("MIXRL_CACHE"):
        return Path(os.environ["MIXRL_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "mixrl"
    return Path.home() / ".cache" / "mixrl"


def recipe(steps: int | None = None, role: str = "student") -> dict[str, Any]:
    """Everything the warm-started weights depend on (hashed into the cache key). ``role``:
    ``student`` (the default model) or ``teacher`` (:data:`TEACHER_WARM_START`)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    ws = dict(WARM_START if role == "student" else TEACHER_WARM_START)
    if steps is not None:
        ws["steps"] = int(steps)
    rec = {
        "tiny_version": TINY_VERSION,
        "task": arith.NAME,
        "task_version": arith.TASK_VERSION,
        "alphabet": arith.ALPHABET,
        "model": dict(MODEL_SIZE),
        "warm_start": ws,
    }
    if role != "student":  # the student's key stays what it was
        rec["role"] = role
    return rec


def cache_key(steps: int | None = None, role: str = "student") -> str:
    digest = hashlib.sha256(json.dumps(recipe(steps, role), sort_keys=True).encode()).hexdigest()[:12]
    return f"v{TINY_VERSION}-{digest}"


def default_path(cache_dir: Path | str | None = None, *, steps: int | None = None, role: str = "student") -> Path:
    """Where :func:`mixrl.models.tiny.warm_start` saves (``cache_dir`` defaults to ``cache_root()/"tiny"``, or
    ``cache_root()/"tiny-teacher"`` for the teacher)."""
    folder = "tiny" if role == "student" else f"tiny-{role}"
    base = Path(cache_dir).expanduser() if cache_dir is not None else cache_root() / folder
    return base / cache_key(steps, role)


def is_complete(path: Path) -> bool:
    return (path / _META_FILE).is_file() and (path / "config.json").is_file()
