"""Fit the tiny model's character vocabulary to a user's task.

The warm-started tiny model (:mod:`mixrl.models.tiny`) knows the arithmetic task's
characters only. ``mixrl train`` with ``model.path=builtin:tiny`` (or a tiny model folder,
recognised by its ``mixrl_tiny.json``) calls :func:`extend` with the characters of the
training and held-out rows that its tokenizer lacks:

* the tokenizer gets one new id per missing UTF-8 byte, appended after the old ids (which
  keep their meaning), so every character of the data encodes and decodes back exactly;
* the model's (tied) embedding matrix grows by as many rows, each drawn (with a fixed seed)
  around the mean of the trained rows with their per-dimension spread: a new token starts
  as a typical token, neither an outlier nor a copy of another new token (transformers'
  ``mean_resizing`` gives every new row the same vector when, as here, there are fewer
  trained rows than dimensions);
* the result is saved next to the model it extends (or under the mixrl cache when that
  folder is read-only) in a folder keyed by the base model and the added characters, and
  reused; the base model is never modified.

Why extend, rather than a byte-level vocabulary of all 256 bytes from the start: the
default run (arithmetic, the warm-started model, its measured accuracies) stays exactly
as it was, the output softmax stays over the ~20 symbols a task uses instead of 260, and
only a run whose data needs more characters pays for them (a resize and a save, about a
second, no retraining).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from mixrl.models import tiny_arch, tiny_spec
from mixrl.models.atomic import publishing

#: seed of the draw that initialises new embedding rows
SEED = 0


def is_tiny(path: Path | str) -> bool:
    """Whether ``path`` is a tiny model folder written by mixrl (it carries ``mixrl_tiny.json``)."""
    return (Path(path) / tiny_spec._META_FILE).is_file()


def missing_characters(tokenizer, texts: Iterable[str]) -> list[str]:
    """Characters of ``texts`` with a UTF-8 byte the tiny tokenizer has no id for (sorted)."""
    vocab = tokenizer.get_vocab()
    chars = {ch for text in texts for ch in text}
    return sorted(ch for ch in chars if any(sym not in vocab for sym in tiny_arch.byte_symbols(ch)))


def extend_tokenizer(tokenizer, chars: Iterable[str]):
    """A tiny tokenizer with one id appended per UTF-8 byte of ``chars`` it lacks (old ids unchanged)."""
    vocab = tokenizer.get_vocab()
    new = [sym for sym in tiny_arch.byte_symbols("".join(sorted(set(chars)))) if sym not in vocab]
    if not new:
        return tokenizer
    ordered = sorted(vocab, key=vocab.__getitem__)
    if [vocab[t] for t in ordered] != list(range(len(ordered))):
        raise ValueError(f"the tokenizer's ids are not 0..{len(ordered) - 1}; not a mixrl tiny tokenizer")
    return tiny_arch.tokenizer_from_vocab({tok: i for i, tok in enumerate([*ordered, *new])})


def extended_path(base: Path | str, chars: Iterable[str]) -> Path:
    """Where :func:`extend` keeps ``base`` extended with ``chars``."""
    base = Path(base).resolve()
    meta = json.loads((base / tiny_spec._META_FILE).read_text())
    added = "".join(sorted(set(chars)))
    key = json.dumps({"base": str(base), "created": meta.get("created"), "chars": added}, sort_keys=True)
    name = f"{base.name}+chars-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    root = base.parent if os.access(base.parent, os.W_OK | os.X_OK) else tiny_spec.cache_root() / "tiny"
    return root / name


def extend(base: Path | str, chars: Iterable[str]) -> Path:
    """A copy of the tiny model at ``base`` whose tokenizer also covers ``chars`` (see the module
    docstring); built once, then reused. Returns ``base`` itself when nothing is missing."""
    base = Path(base)
    chars = sorted(set(chars))
    tokenizer = AutoTokenizer.from_pretrained(base)
    extended = extend_tokenizer(tokenizer, chars)
    if len(extended) == len(tokenizer):
        return base
    final = extended_path(base, chars)
    if tiny_spec.is_complete(final):
        return final

    model = AutoModelForCausalLM.from_pretrained(base)
    model.resize_token_embeddings(len(extended), mean_resizing=False)
    with torch.no_grad():
        _init_new_rows(model.get_input_embeddings().weight, len(tokenizer))

    # a folder already there lacks its meta file (an interrupted build): it is replaced
    with publishing(final, complete=tiny_spec.is_complete, replace=True) as tmp:
        model.save_pretrained(tmp)
        extended.save_pretrained(tmp)
        meta = json.loads((base / tiny_spec._META_FILE).read_text())
        meta.update(
            key=final.name,
            extends=str(base.resolve()),
            added_characters="".join(chars),
            vocab_size=len(extended),
            extended=time.strftime("%Y-%m-%dT%H:%M:%S"),
        )
        (tmp / tiny_spec._META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return final


def _init_new_rows(weight, n_old: int) -> None:
    """Rows ``n_old:`` of ``weight`` drawn (seeded) around the mean of the trained rows with their
    per-dimension spread: each new token starts as a typical token, distinct from the others."""
    old = weight[:n_old].float()
    gen = torch.Generator().manual_seed(SEED)
    noise = torch.randn((weight.shape[0] - n_old, weight.shape[1]), generator=gen)
    weight[n_old:] = (old.mean(0) + noise * old.std(0)).to(weight.dtype)
