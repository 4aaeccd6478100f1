"""ScoringChunks: the no-grad scoring forwards in token-budget chunks (``trainer.max_tokens_per_micro_batch``).

The training forwards under a token budget run micro-batches of at most ``N`` tokens
(:mod:`mixrl.trainer.parts.token_budget`). The no-grad forwards that score a whole generation
batch (TRL's old and reference log-probs, the behaviour log-probs of lagged or async rows, the
teachers' and the injections' scoring, the shaping's entropies: every call of TRL's
``_get_per_token_logps_and_entropies`` under ``torch.no_grad``) otherwise take a fixed number of
rows per forward, each forward padded to the longest completion of the whole batch. Here, under a
budget, the rows go longest first into chunks of at most ``N`` tokens (:func:`mixrl.core.token_budget.group_rows`,
the same cost as the training micro-batches: ``rows x (P + w)`` padded, the rows' own tokens
packed), each chunk's completion columns trimmed to its own longest completion ``w``, and at most
the forward's row count (``trainer.micro_batch_size`` when set) per chunk. Packed rows cost their
own tokens whatever their neighbours, so where the row count splits the budget's groups they are
dealt to balanced chunks instead (:func:`snake`): cutting rows sorted by length would put the
longest together, one chunk far heavier than the rest (measured 1.2x slower than the fixed rows'
unsorted chunks on the variable-length benchmark's batch, ``python -m bench.scoring``). Each chunk's
per-token values are scattered back into the ``[B, T]`` layout, in the rows' original order, with
0 past ``w`` (what TRL's fused head returns wherever the label is ``-100``).

The prompts' columns are kept: TRL left-pads prompts to the batch's widest and the positions of a
row's tokens count that padding (absolute position embeddings see it), so trimming them would
change a value; the completion columns past a chunk's longest completion are padding in every
row of the chunk and, the model being causal, change no scored token. Equal to the fixed-row
forwards up to float rounding (kernels of other shapes): tested within 1e-5 in float32.

Sharding: under FSDP or ZeRO-3 every process joins every policy forward
(:class:`mixrl.trainer.parts.forwards.Forwards`), and the budget's chunk counts differ between
processes. There (``collective``) the chunk count stays the fixed-row path's, ``ceil(B / rows)``
on every process (so :meth:`Forwards.deficit`'s count holds and no collective is added), with the
same rows per chunk, but taken longest first and trimmed (padded; packed rows: balanced chunks of
at most as many rows): each forward is never wider than before.

Owns: the budget, whether forwards are collective, the packing rule, a re-entry flag. Receives per
call: the model, the rows, TRL's per-chunk forward. Returns tensors. No state to checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mixrl.core.token_budget import completion_lengths, group_rows


class ScoringChunks:
    """No-grad per-token log-probs of ``[B, P + T]`` rows in token-budget chunks.

    Args:
        budget: ``trainer.max_tokens_per_micro_batch``, tokens per chunk.
        collective: every policy forward needs every process (keep the fixed-row chunk count).
        packed: ``model -> bool``, whether the model's rows are packed (``Packing.applies``).
    """

    def __init__(self, budget: int, *, collective: bool, packed: Callable[[object], bool] = lambda model: False):
        self.budget = int(budget)
        self.collective = bool(collective)
        self.packed = packed
        self._inside = False  # the per-chunk forward re-enters the trainer's per-token log-probs

    def takes(self, *, aux_loss: bool = False, multimodal: dict | None = None) -> bool:
        """A scoring forward (no grad) of text rows, not one of this part's own chunks."""
        return (not self._inside and not torch.is_grad_enabled() and not aux_loss
                and all(v is None for v in (multimodal or {}).values()))

    def groups(self, attention_mask: torch.Tensor, logits_to_keep: int, rows: int | None, *,
               packed: bool) -> list[list[int]]:
        """Row indices of each chunk, longest first (see the module docstring)."""
        n = attention_mask.size(0)
        width = attention_mask.size(1) - int(logits_to_keep)
        completion = completion_lengths(attention_mask[:, width:]).tolist()
        prompt = attention_mask[:, :width].sum(-1).tolist() if packed else None
        rows = int(rows) if rows else n
        if self.collective:  # the fixed-row path's count, at most as many rows per chunk
            own = [(prompt[i] if prompt is not None else width) + completion[i] for i in range(n)]
            order = sorted(range(n), key=lambda i: (-own[i], i))
            if packed:  # balanced (see below)
                return snake(order, -(-n // rows))
            return [order[k:k + rows] for k in range(0, n, rows)]  # padded: longest rows together, trimmed
        groups = group_rows(completion, self.budget, prompt_width=width, prompt=prompt, packed=packed)
        if not packed:  # padded: longest first, so each chunk is trimmed to rows of like length
            return [g[k:k + rows] for g in groups for k in range(0, len(g), rows)]
        if all(len(g) <= rows for g in groups):
            return groups
        # packed rows under a row cap: cutting the budget's groups would put the longest rows
        # together (measured: 1.2x slower than unsorted rows); as many balanced chunks as the cap needs
        own = [prompt[i] + completion[i] for i in range(n)]
        order = sorted(range(n), key=lambda i: (-own[i], i))
        k = max(len(groups), -(-n // rows))
        while True:
            out = snake(order, k)
            if k >= n or all(len(g) == 1 or sum(own[i] for i in g) <= self.budget for g in out):
                return out
            k += 1

    def logps(self, forward: Callable, model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
              logits_to_keep: int, *, batch_size: int | None = None, compute_entropy: bool = False):
        """``(logps [B, C], entropies [B, C] or None, None)`` as TRL's per-token log-probs return
        them; ``forward`` is that function (called once per chunk, with the chunk's rows)."""
        C = int(logits_to_keep)
        n, width = input_ids.size(0), input_ids.size(1) - C
        lengths = completion_lengths(attention_mask[:, width:])
        logps = entropies = None
        self._inside = True
        try:
            if n == 0:  # no rows: the forward as it was asked for (re-entered without chunks)
                return forward(model, input_ids, attention_mask, C, batch_size=batch_size, compute_entropy=compute_entropy)
            for rows in self.groups(attention_mask, C, batch_size, packed=bool(self.packed(model))):
                index = torch.as_tensor(rows, dtype=torch.long, device=input_ids.device)
                w = max(int(lengths[index].max()), 1)
                lp, ent, _ = forward(model, input_ids[index, :width + w], attention_mask[index, :width + w], w,
                                     batch_size=len(rows), compute_entropy=compute_entropy)
                if logps is None:
                    logps = lp.new_zeros((n, C))
                    entropies = ent.new_zeros((n, C)) if compute_entropy else None
                logps[index, :w] = lp
                if compute_entropy:
                    entropies[index, :w] = ent
        finally:
            self._inside = False
        return logps, entropies, None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def snake(order: list[int], k: int) -> list[list[int]]:
    """Rows (``order``: longest first) dealt to ``k`` chunks back and forth (0..k-1, k-1..0, ...):
    every chunk ``ceil(n / k)`` rows or one fewer, their tokens balanced."""
    out: list[list[int]] = [[] for _ in range(k)]
    for j, i in enumerate(order):
        lap, at = divmod(j, k)
        out[at if lap % 2 == 0 else k - 1 - at].append(i)
    return [g for g in out if g]
