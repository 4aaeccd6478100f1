"""Greedy held-out evaluation for plain-text tasks (batched ``model.generate``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import torch


@torch.no_grad()
def greedy_completions(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    batch_size: int = 256,
) -> list[str]:
    """Greedy completions (decoded, special tokens dropped) for ``prompts``; stops on eos."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out: list[str] = []
    try:
        for i in range(0, len(prompts), batch_size):
            chunk = list(prompts[i : i + batch_size])
            enc = tokenizer(chunk, return_tensors="pt", padding=True, padding_side="left").to(device)
            gen = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                temperature=None,
                top_p=None,
                top_k=None,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
            out.extend(tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True))
    finally:
        model.train(was_training)
    return out


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
