"""Held-out evaluation: greedy accuracy (and sampled pass@k) of a model on a fixed split."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import torch


def _render_prompt(tokenizer, prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)


@torch.no_grad()
def generate_completions(
    model,
    tokenizer,
    prompts: Sequence[Any],
    *,
    max_new_tokens: int,
    batch_size: int = 128,
    do_sample: bool = False,
    temperature: float = 1.0,
    num_return_sequences: int = 1,
    progress: Callable[[int], None] | None = None,
) -> list[list[str]]:
    """Completions (decoded, special tokens removed) for each prompt: a list of n per prompt."""
    was_training = model.training
    model.eval()
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    device = next(model.parameters()).device
    out: list[list[str]] = []
    try:
        for start in range(0, len(prompts), batch_size):
            raw = prompts[start : start + batch_size]
            chunk = [_render_prompt(tokenizer, p) for p in raw]
            # as TRL does: plain prompts get the tokenizer's special tokens (e.g. bos); a rendered
            # chat template already holds them
            plain = isinstance(raw[0], str)
            enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=plain).to(device)
            gen = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=do_sample,
                temperature=temperature if do_sample else None,
                top_p=None,
                top_k=None,
                num_return_sequences=num_return_sequences,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            texts = tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            for i in range(len(chunk)):
                out.append(texts[i * num_return_sequences : (i + 1) * num_return_sequences])
            if progress is not None:
                progress(len(chunk))
    finally:
        tokenizer.padding_side = side
        if was_training:
            model.train()
    return out


def evaluate_accuracy(
    model,
    tokenizer,
    rows: Sequence[dict],
    reward_fn: Callable,
    *,
    max_new_tokens: int,
    batch_size: int = 128,
    pass_k: int = 0,
    temperature: float = 1.0,
    progress: Callable[[int], None] | None = None,
) -> dict[str, float]:
    """Greedy accuracy (reward >= 1) on ``rows`` (each with ``prompt`` and ``answer``), per
    ``level`` when rows carry one, and sampled pass@k when ``pass_k`` > 0."""
    prompts = [r["prompt"] for r in rows]
    kwargs = {k: [r[k] for r in rows] for k in rows[0] if k not in ("prompt", "completion")} if rows else {}
    greedy = [c[0] for c in generate_completions(model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size, progress=progress)]
    scores = reward_fn(prompts=prompts, completions=greedy, **kwargs)
    correct = [float(s is not None and s >= 1.0 - 1e-6) for s in scores]
    result = {"accuracy": sum(correct) / max(len(correct), 1), "n": float(len(correct))}
    if rows and "level" in rows[0]:
        by_level: dict[int, list[float]] = defaultdict(list)
        for r, c in zip(rows, correct):
            by_level[int(r["level"])].append(c)
        for level, cs in sorted(by_level.items()):
            result[f"accuracy/level{level}"] = sum(cs) / len(cs)
    if pass_k > 0 and rows:
        samples = generate_completions(
            model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=max(batch_size // pass_k, 1),
            do_sample=True, temperature=temperature, num_return_sequences=pass_k,
        )
        flat_prompts = [p for p in prompts for _ in range(pass_k)]
        flat_kwargs = {k: [v for v in vs for _ in range(pass_k)] for k, vs in kwargs.items()}
        flat = reward_fn(prompts=flat_prompts, completions=[c for cs in samples for c in cs], **flat_kwargs)
        hits = [any((s or 0) >= 1.0 - 1e-6 for s in flat[i * pass_k : (i + 1) * pass_k]) for i in range(len(rows))]
        result[f"pass@{pass_k}"] = sum(hits) / len(hits)
        result["sampled_accuracy"] = sum(float((s or 0) >= 1.0 - 1e-6) for s in flat) / len(flat)
    return result
