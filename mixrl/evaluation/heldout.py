"""Held-out rows are never training rows.

The held-out evaluation reads ``data.eval_source`` / ``data.eval_split`` (default: the
training source's ``test`` split). A single file, or a folder without split-named files,
has no ``test`` split: the loader returns the training rows themselves. So after loading
both, :func:`separate_heldout` compares prompts:

* no shared prompt: the held-out rows are used as they are (``rule: separate``);
* most held-out prompts are training prompts (the same data): the training rows are split
  by a fixed rule, ``rule: split``: shuffle the row indices with seed 0 (the same for every
  run seed, so seeds share one split) and hold out the first ``min(trainer.eval_size,
  20% of the rows)``; training uses the rest (minus any row whose prompt is held out);
* a few shared prompts (separate splits with duplicates): those held-out rows are dropped.

The result is printed and recorded in ``summary.json`` under ``heldout``.
"""

from __future__ import annotations

import json
import random
from typing import Any

from mixrl.errors import DataError

SPLIT_SEED = 0
SPLIT_FRACTION = 0.2
RULE_TEXT = f"fixed shuffle (seed {SPLIT_SEED}), first min(trainer.eval_size, {int(SPLIT_FRACTION * 100)}% of rows) held out"


def _key(prompt: Any) -> str:
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)


def separate_heldout(train_ds, eval_rows: list[dict], eval_size: int, source: str) -> tuple[Any, list[dict], dict]:
    """Return ``(train_ds, eval_rows, info)`` with no held-out prompt among the training rows."""
    n_train = len(train_ds)
    if not eval_rows:
        return train_ds, eval_rows, {"rule": "none", "n_eval": 0, "n_train": n_train}
    train_keys = [_key(p) for p in train_ds["prompt"]]
    in_train = set(train_keys)
    shared = [i for i, r in enumerate(eval_rows) if _key(r["prompt"]) in in_train]
    if not shared:
        return train_ds, eval_rows, {"rule": "separate", "source": source, "n_eval": len(eval_rows), "n_train": n_train}
    if 2 * len(shared) < len(eval_rows):
        keep = [r for i, r in enumerate(eval_rows) if i not in set(shared)]
        return train_ds, keep, {"rule": "separate", "source": source, "n_eval": len(keep), "n_train": n_train,
                                "dropped_shared_prompts": len(shared)}
    n_eval = min(int(eval_size), int(n_train * SPLIT_FRACTION))
    if n_eval < 1:
        raise DataError(
            f"{source} has {n_train} rows, too few to hold any out for evaluation; add rows, "
            "set data.eval_source to a separate file, or trainer.eval_size=0"
        )
    order = list(range(n_train))
    random.Random(SPLIT_SEED).shuffle(order)
    held = sorted(order[:n_eval])
    held_keys = {train_keys[i] for i in held}
    rest = [i for i in range(n_train) if train_keys[i] not in held_keys]
    eval_rows = [{k: v for k, v in train_ds[i].items() if k != "expert"} for i in held]
    info = {"rule": "split", "source": source, "how": RULE_TEXT, "n_eval": len(held), "n_train": len(rest), "n_read": n_train,
            "heldout_indices": held}
    return train_ds.select(rest), eval_rows, info


def describe(info: dict) -> str:
    """One line for the console."""
    if info["rule"] == "split":
        return (f"held-out: {info['n_eval']} rows of {info['source']} ({info['how']}); "
                f"training on the other {info['n_train']}")
    if info["rule"] == "separate":
        extra = f", {info['dropped_shared_prompts']} rows that are also training prompts dropped" \
            if info.get("dropped_shared_prompts") else ""
        return f"held-out: {info['n_eval']} rows of {info['source']}, none among the training rows{extra}"
    return "held-out: none (trainer.eval_size=0)"
