"""Token-budget micro-batches: a step's rows grouped by the tokens a forward over them costs.

A fixed row count per micro-batch pads every row to the longest in its micro-batch, and one long
row sets the memory of all of them. Grouping by a token budget ``N`` instead (verl's dynamic batch
size, ``use_dynamic_bsz`` with ``ppo_max_token_len_per_gpu``: ``verl/utils/seqlen_balancing.py``,
``rearrange_micro_batches``) keeps each micro-batch's forward at most ``N`` tokens:

* padded rows (the default): a micro-batch of ``n`` rows costs ``n * (P + w)`` tokens, ``P`` the
  prompt width (TRL left-pads prompts to the generation batch's widest; the positions of a row's
  tokens depend on it, so it is kept) and ``w`` the longest completion in the micro-batch (the
  completion columns past it are trimmed). Rows are taken longest first, each micro-batch filled
  with the next rows while the cost stays within ``N``: first-fit decreasing on sorted rows, which
  for this cost is the fewest micro-batches.
* packed rows (``trainer.padding_free``): a micro-batch costs the sum of its rows' own lengths.
  ``k = ceil(total / N)`` micro-batches (more while one exceeds ``N``), balanced by longest
  processing time first (each row, longest first, to the micro-batch with the fewest tokens),
  the greedy that verl's ``get_seqlen_balanced_partitions`` (Karmarkar-Karp) refines; when no such
  balance fits within fewer micro-batches than next fit on the sorted rows, next fit's.

Never more micro-batches than the fixed row count it replaces: a budget of at least ``m (P + T)``
tokens (``m`` rows per fixed micro-batch, ``T`` the completion width) holds any ``m`` rows, padded
or packed, so next fit on sorted rows fills every micro-batch but the last with at least ``m`` rows:
at most ``ceil(n / m)`` micro-batches, as many forwards and backwards as ``m`` rows at a time or fewer.

Every process must run as many micro-batches (a sharded policy's forwards are collective, and
verl all-reduces the count to its maximum the same way): :func:`group_rows` takes ``num_groups``,
the maximum over processes, and splits the heaviest micro-batches until there are that many.

A row longer than ``N`` on its own is a micro-batch by itself (the caller logs it once): refusing
it would stop a run on one long completion, which the budget exists to absorb.

Formula: cost_padded(g) = |g| * (P + max_{i in g} c_i); cost_packed(g) = sum_{i in g} (p_i + c_i)

The gradient does not depend on the grouping: every aggregation divides by the step's global
counts (:func:`mixrl.trainer.parts.batch_fields.global_counts`), so the micro-batches' losses add
up to the step's whatever the partition.

Paper: verl's dynamic batch size ("HybridFlow: A Flexible and Efficient RLHF Framework",
arXiv 2409.19256); the partition heuristic: Graham, "Bounds on Multiprocessing Timing Anomalies" (LPT).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def completion_lengths(completion_mask: Tensor) -> Tensor:
    """Per row, the columns up to its last trainable-or-attended completion token ([B] long):
    the width a forward over the row alone needs (0: an empty completion)."""
    m = completion_mask.bool()
    cols = torch.arange(1, m.shape[1] + 1, device=m.device).unsqueeze(0)
    return (m.long() * cols).amax(dim=1) if m.shape[1] else torch.zeros(m.shape[0], dtype=torch.long, device=m.device)


def cost(rows: list[int], completion: list[int], *, prompt_width: int, prompt: list[int] | None = None, packed: bool = False) -> int:
    """Tokens of one forward over ``rows`` (indices into ``completion`` / ``prompt``): see the module docstring."""
    if not rows:
        return 0
    if packed:
        return sum((prompt[i] if prompt is not None else prompt_width) + completion[i] for i in rows)
    return len(rows) * (prompt_width + max(max(completion[i] for i in rows), 1))


def group_rows(completion: list[int], budget: int, *, prompt_width: int, prompt: list[int] | None = None,
               packed: bool = False, num_groups: int | None = None) -> list[list[int]]:
    """Row indices per micro-batch, the heaviest micro-batch first; each costs at most ``budget``
    tokens unless it is one row longer than that. ``num_groups``: at least this many micro-batches
    (never more than the rows), by splitting the heaviest ones.

    Args:
        completion: each row's completion width (:func:`completion_lengths`).
        budget: the token budget ``N`` of one micro-batch.
        prompt_width: the prompts' padded width ``P``.
        prompt: each row's own prompt length (packed rows), else every row counts ``P``.
        packed: cost a micro-batch as packed rows (sum of lengths) rather than padded ones.
        num_groups: the number of micro-batches every process runs (the maximum over processes).
    """
    n = len(completion)
    if budget < 1:
        raise ValueError(f"a token budget must be >= 1, got {budget}")
    if n == 0:
        return []
    own = [(prompt[i] if (packed and prompt is not None) else prompt_width) + max(completion[i], 0 if packed else 1) for i in range(n)]
    order = sorted(range(n), key=lambda i: (-own[i], i))  # longest first, ties in row order (deterministic)
    price = lambda g: cost(g, completion, prompt_width=prompt_width, prompt=prompt, packed=packed)  # noqa: E731
    groups, current = [], []
    for i in order:  # next fit on sorted rows (padded rows: the first row of a group is its widest)
        if current and price(current + [i]) > budget:
            groups.append(current)
            current = []
        current.append(i)
    groups.append(current)
    if packed:  # balanced groups, but never more than next fit needs
        for k in range(max(1, math.ceil(sum(own) / budget)), len(groups) + 1):
            lpt = _lpt(order, own, k)
            if all(len(g) == 1 or price(g) <= budget for g in lpt):
                groups = lpt
                break
    target = min(int(num_groups or 0), n)
    while len(groups) < target:  # split the heaviest group that has more than one row
        j = max((g for g in range(len(groups)) if len(groups[g]) > 1), key=lambda g: price(groups[g]))
        g = groups.pop(j)
        if packed:
            a, b = _lpt(g, own, 2)
        else:
            half = (len(g) + 1) // 2
            a, b = g[:half], g[half:]
        groups += [a, b]
    groups = [sorted(g, key=lambda i: (-own[i], i)) for g in groups if g]
    return sorted(groups, key=lambda g: (-price(g), g[0]))


def _lpt(order: list[int], own: list[int], k: int) -> list[list[int]]:
    """Longest processing time first: each row (in ``order``, longest first) to the lightest of ``k`` groups."""
    groups: list[list[int]] = [[] for _ in range(k)]
    load = [0] * k
    for i in sorted(order, key=lambda i: (-own[i], i)):
        j = min(range(k), key=lambda g: (load[g], g))
        groups[j].append(i)
        load[j] += own[i]
    return [g for g in groups if g]


def padding_fraction(real_tokens: float, total_tokens: float) -> float:
    """Padding tokens over all tokens of the forwards run (0 when nothing ran).

    Formula: padding_fraction = 1 - sum(real tokens) / sum(tokens of the forward tensors)
    """
    return 0.0 if total_tokens <= 0 else max(0.0, 1.0 - float(real_tokens) / float(total_tokens))
