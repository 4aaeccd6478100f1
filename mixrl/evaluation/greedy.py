"""Greedy held-out evaluation for plain-text tasks (through :mod:`mixrl.evaluation.generate`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from mixrl.evaluation.generate import generate_completions


def greedy_completions(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    batch_size: int = 256,
) -> list[str]:
    """Greedy completions (decoded, special tokens dropped) for ``prompts``; stops on eos
    (:func:`mixrl.evaluation.generate.generate_completions`, one completion each)."""
    out = generate_completions(model, tokenizer, list(prompts), max_new_tokens=max_new_tokens, batch_size=batch_size)
    return [c[0] for c in out]


def accuracy_by_level(
    model: Any,
    tokenizer: Any,
    problems: Sequence[dict[str, Any]],
    verify: Callable[[str, str], bool],
    *,
    max_new_tokens: int,
    batch_size: int = 256,
) -> dict[str, float]:
    """Greedy accuracy: ``{"all": acc, "level_1": acc, ...}`` (levels present in ``problems``)."""
    completions = greedy_completions(
        model, tokenizer, [p["prompt"] for p in problems], max_new_tokens=max_new_tokens, batch_size=batch_size
    )
    hits: dict[Any, list[bool]] = defaultdict(list)
    for p, c in zip(problems, completions, strict=True):
        ok = verify(c, p["answer"])
        hits["all"].append(ok)
        if "level" in p:
            hits[int(p["level"])].append(ok)
    res = {"all": sum(hits["all"]) / max(len(hits["all"]), 1)}
    for lvl in sorted(k for k in hits if k != "all"):
        res[f"level_{lvl}"] = sum(hits[lvl]) / len(hits[lvl])
    return res
