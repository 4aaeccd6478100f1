"""A small deterministic micro-batch for pinning ``compute_objective`` (see make_pins.py).

``make_batch(kind, seed)`` returns fresh float32 tensors (B = 8 rows, T = 7 tokens):

* ``logp``       [B, T] negative log-probs, a leaf with ``requires_grad``
* ``mask``       [B, T] ragged completion mask (row lengths 7 5 1 6 3 7 4 2; row 2 has one token)
* ``advantages`` [B]    mixed signs, rows 1 and 4 exactly 0 (expert rows of ``aux_loss``: 0)
* ``old_logp``   [B, T] ``logp + 0.3 * noise`` (ratios far enough from 1 that PPO clips act)
* ``ref_logp``   [B, T] ``logp + 0.2 * noise``
* ``entropies``  [B, T] positive, a leaf with ``requires_grad``
* ``row_source`` [B]    long, 0 = on-policy, 1 = expert, by ``kind``:
  ``none`` all 0; ``aux_loss`` last 3 rows expert (advantage 0); ``group_inject`` groups of
  4 rows, the last row of each group expert; ``sft`` all expert.

Every value is finite, masked positions included (the objective is not padding-safe today).
Pure function of (kind, seed): a private ``torch.Generator``, no global RNG state touched.
"""

from __future__ import annotations

import torch

B, T = 8, 7
LENGTHS = (7, 5, 1, 6, 3, 7, 4, 2)
KINDS = ("none", "aux_loss", "group_inject", "sft")


def make_batch(kind: str, seed: int = 0) -> dict[str, torch.Tensor]:
    if kind not in KINDS:
        raise ValueError(f"unknown batch kind {kind!r}; one of {KINDS}")
    g = torch.Generator().manual_seed(int(seed))

    def rand(*shape):
        return torch.rand(*shape, generator=g, dtype=torch.float64)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    logp = -(0.05 + 2.0 * rand(B, T))  # log-probs in [-2.05, -0.05]
    mask = torch.zeros(B, T)
    for i, n in enumerate(LENGTHS):
        mask[i, :n] = 1.0
    adv = randn(B)
    adv[1] = 0.0
    adv[4] = 0.0
    adv[0], adv[2] = abs(adv[0]) + 0.1, -abs(adv[2]) - 0.1  # at least one of each sign
    old_logp = logp + 0.3 * randn(B, T)
    ref_logp = logp + 0.2 * randn(B, T)
    entropies = 0.05 + 1.5 * rand(B, T)

    source = torch.zeros(B, dtype=torch.long)
    if kind == "aux_loss":
        source[-3:] = 1
        adv[-3:] = 0.0
    elif kind == "group_inject":
        source[3::4] = 1
    elif kind == "sft":
        source[:] = 1

    f32 = torch.float32
    return {
        "logp": logp.to(f32).requires_grad_(True),
        "mask": mask,
        "advantages": adv.to(f32),
        "old_logp": old_logp.to(f32),
        "ref_logp": ref_logp.to(f32),
        "entropies": entropies.to(f32).requires_grad_(True),
        "row_source": source,
    }
