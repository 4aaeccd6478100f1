"""TokenBudget: ``trainer.max_tokens_per_micro_batch`` (a step's rows in micro-batches of at most N tokens).

With a budget, TRL hands the whole step's rows of this process to one ``training_step``
(``per_device_train_batch_size`` = the rows per process, no gradient accumulation: see
:func:`mixrl.trainer.trl_args.grpo_args`), and the trainer splits them here: :meth:`TokenBudget.chunks`
groups the rows by :func:`mixrl.core.token_budget.group_rows` (longest first; the number of
micro-batches is the maximum over processes, so that every process runs as many forwards and
backwards) and gives each micro-batch's fields, its completion columns trimmed to its own longest
completion. The trainer runs forward and backward per micro-batch and ONE optimizer step per
generation batch, as with a fixed row count; every aggregation divides by the step's global counts,
so the step's gradient is the fixed-micro-batch step's (tested within 1e-6 in float64).

No-grad scoring forwards (TRL's old and reference log-probs, teachers, behaviour log-probs) run in
token-budget chunks of the same budget (:mod:`mixrl.trainer.parts.scoring_chunks`), each of at most
``trainer.micro_batch_size`` rows when it is set (TRL's row count, through :meth:`TokenBudget.scoring_rows`).

Also here, for every run: :func:`forward_tokens`, the real and total tokens of the loss forwards
as :meth:`mixrl.trainer.parts.forwards.Forwards.by_row_kind` runs them (``batch/padding_fraction``).

Owns: the budget, the cost model (padded or packed rows), the count reducer. Receives per call: the
step's rows (a TRL batch dict). Returns each micro-batch's fields. No state to checkpoint (``state_dict() == {}``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import torch

from mixrl.core import provenance as prov
from mixrl.core.token_budget import completion_lengths, group_rows

logger = logging.getLogger(__name__)


class TokenBudget:
    """Token-budget micro-batches of one process's rows.

    Args:
        budget: ``trainer.max_tokens_per_micro_batch``, tokens per micro-batch forward.
        packed: rows are packed (``trainer.padding_free``): a micro-batch costs its rows' own tokens.
        reduce_max: ``int -> int``, the maximum over processes (identity with one process).
        scoring_batch_size: rows per no-grad scoring forward (``trainer.micro_batch_size``), or None: all.
    """

    def __init__(self, budget: int, *, packed: bool = False, reduce_max: Callable[[int], int] = lambda n: n,
                 scoring_batch_size: int | None = None):
        self.budget = int(budget)
        self.packed = bool(packed)
        self.reduce_max = reduce_max
        self.scoring_batch_size = scoring_batch_size
        self._warned = False

    def groups(self, inputs: dict) -> list[list[int]]:
        """Row indices of each micro-batch (the same count on every process; the heaviest first)."""
        completion = completion_lengths(inputs["completion_mask"]).tolist()
        prompt_width = int(inputs["prompt_ids"].shape[1])
        prompt = inputs["prompt_mask"].sum(-1).tolist() if self.packed else None
        mine = group_rows(completion, self.budget, prompt_width=prompt_width, prompt=prompt, packed=self.packed)
        everyone = int(self.reduce_max(len(mine)))
        groups = mine if everyone == len(mine) else group_rows(completion, self.budget, prompt_width=prompt_width,
                                                                prompt=prompt, packed=self.packed, num_groups=everyone)
        longest = max((prompt[i] if prompt is not None else prompt_width) + completion[i] for i in range(len(completion))) if completion else 0
        if longest > self.budget and not self._warned:
            self._warned = True
            logger.warning("a row of %d tokens exceeds trainer.max_tokens_per_micro_batch=%d: it is a micro-batch of its own "
                           "(logged once; raise the budget to bound every micro-batch's memory)", longest, self.budget)
        return groups

    def chunks(self, inputs: dict) -> list[dict]:
        """Each micro-batch's fields (:func:`take`), in :meth:`groups` order."""
        return [take(inputs, rows) for rows in self.groups(inputs)]

    def scoring_rows(self, args):
        """Context: TRL's no-grad scoring forwards run ``scoring_batch_size`` rows at a time (TRL
        reads ``args.per_device_train_batch_size``, which holds the whole step under a budget)."""
        if not self.scoring_batch_size:
            return contextlib.nullcontext()
        return _swapped(args, "per_device_train_batch_size", int(self.scoring_batch_size))

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@contextlib.contextmanager
def _swapped(obj, name: str, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def take(inputs: dict, rows: list[int]) -> dict:
    """The fields of ``rows``: every tensor with a row dimension indexed; completion-shaped ones
    ([B, T, ...], any field but ``prompt_*``) cut to the rows' longest completion ``w`` (columns
    past it are padding in every one of these rows); anything else as it is."""
    mask = inputs["completion_mask"]
    n, width = mask.shape
    index = torch.as_tensor(rows, dtype=torch.long, device=mask.device)
    w = max(int(completion_lengths(mask[index]).max()), 1) if len(rows) else width
    out = {}
    for key, value in inputs.items():
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == n:
            value = value.index_select(0, index.to(value.device))
            if value.dim() >= 2 and value.shape[1] == width and not key.startswith("prompt_"):
                value = value[:, :w]
        out[key] = value
    return out


def forward_tokens(inputs: dict, *, collective: bool = False, packed: bool = False) -> tuple[int, int]:
    """(real tokens, tokens of the forward tensors) of the loss's forwards over ``inputs``, as
    :meth:`~mixrl.trainer.parts.forwards.Forwards.by_row_kind` runs them: one forward over
    prompt and completion columns, or one per kind of row with the off-policy kinds trimmed to
    their longest completion. ``packed``: rows packed without padding (tokens = real tokens).

    Formula: real = sum(prompt_mask) + sum(completion_mask); total = sum over forwards of rows x (P + width)
    """
    pm, cm = inputs["prompt_mask"], inputs["completion_mask"]
    real = int(pm.sum()) + int(cm.sum())
    if packed:
        return real, real
    n, p, t = pm.shape[0], pm.shape[1], cm.shape[1]
    kinds = inputs["row_source"].unique() if "row_source" in inputs else torch.zeros(1)
    if len(kinds) == 1 or collective:
        return real, n * (p + t)
    total = 0
    for kind in kinds:
        rows = inputs["row_source"] == kind
        w = t if int(kind) == prov.ON_POLICY else int(cm[rows].sum(-1).max().clamp(min=1))
        total += int(rows.sum()) * (p + w)
    return real, total
