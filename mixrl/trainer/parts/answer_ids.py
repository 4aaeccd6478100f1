"""The runtime input of a set-level advantage (``algo.advantage.name=polychromic``): each row's final-answer class.

The completions of this process are decoded, each reduced to its final answer (the arithmetic
task's ``#### <integer>``, :func:`mixrl.tasks.arith.extract_answer`; a completion without one is
keyed by its whole stripped text, so two malformed completions differ unless identical), the keys
gathered over processes and numbered in order of first appearance.

Owns: nothing (functions only); no TRL import.
Receives: the batch's output dict, the tokenizer (decode), the accelerator (gather_object).
Returns: ``answer_ids`` ([N_global] long).
"""

from __future__ import annotations

import torch
from accelerate.utils import gather_object

from mixrl.tasks.arith import extract_answer


def answer_key(text: str) -> str:
    """A completion's diversity key: its final answer, else its stripped text."""
    got = extract_answer(text)
    return f"answer:{got}" if got is not None else f"text:{text.strip()}"


def number_keys(keys: list[str]) -> list[int]:
    """Each key's class: equal keys share one integer, numbered by first appearance."""
    seen: dict[str, int] = {}
    return [seen.setdefault(k, len(seen)) for k in keys]


def answer_ids(out: dict, tokenizer, accelerator) -> torch.Tensor:
    """[N_global] the final-answer class of every row of the global batch."""
    ids, mask = out["completion_ids"], out["completion_mask"].bool()
    texts = [tokenizer.decode(row[m].tolist(), skip_special_tokens=True) for row, m in zip(ids, mask)]
    keys = gather_object([answer_key(t) for t in texts]) if accelerator.num_processes > 1 else [answer_key(t) for t in texts]
    return torch.tensor(number_keys(keys), dtype=torch.long, device=ids.device)
