"""The width of TRL's fused LM-head tile, fitted to the vocabulary.

TRL 1.16 computes every per-token log-prob and entropy of the policy, the reference and the
teachers with a fused, chunked LM head (``trl.trainer.utils.add_fused_lm_head``): the hidden
states are projected in tiles of ``4096`` tokens x ``trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE``
(32768) vocabulary entries, each folded into an online log-sum-exp, so the ``[tokens, V]``
logits never exist. The tile buffer is allocated 32768 wide whatever the vocabulary: for
Qwen2.5's 152k vocabulary that is one fifth of it, but for a small vocabulary (the built-in
character model has 18 entries) the buffer is thousands of times the whole logits (measured
on the tiny model: 512 MB allocated per forward for 0.8 MB of log-softmax).

:func:`fit_tile_to_vocab` narrows the width to the largest vocabulary of the models that score
tokens (never below it, never above TRL's 32768). TRL reads the width at call time from its
module, so this is process-wide; the width changes how the vocabulary is split into tiles,
never the values (a smaller width than a model's vocabulary would only mean more tiles).
"""

from __future__ import annotations

from trl.trainer import utils as trl_utils

TRL_TILE_VOCAB = 32768  # trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE in TRL 1.16


def fit_tile_to_vocab(models) -> int:
    """Set TRL's tile width to ``min(32768, the largest vocabulary of models)``; returns the width.
    (Another trainer built later in the same process sets it again for its own models.)"""
    vocab = 0
    for m in models:
        emb = m.get_output_embeddings() if hasattr(m, "get_output_embeddings") else None
        weight = getattr(emb, "weight", None) if emb is not None else None
        if weight is not None:  # DeepSpeed ZeRO-3 partitions the parameter: its full shape is ds_shape
            shape = getattr(weight, "ds_shape", None) or weight.shape
            vocab = max(vocab, int(shape[0]) if len(shape) else 0)
    if vocab:
        trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE = min(TRL_TILE_VOCAB, vocab)
    return int(trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE)
