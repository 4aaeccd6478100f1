"""The pin model with TRL's fused LM head, and rows in TRL's layout: shared by the forward tests of
padding-free rows (tests/test_padding_free.py) and of the scoring chunks (tests/test_scoring_chunks.py)."""

from __future__ import annotations

from pathlib import Path

import torch

PIN_MODEL = Path(__file__).resolve().parent / "fixtures" / "pin-model"


def fused_pin_model():
    """The pin model in float32 with TRL's fused head (log-probs and entropies, never the full logits)."""
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    m = AutoModelForCausalLM.from_pretrained(str(PIN_MODEL), dtype=torch.float32)
    add_fused_lm_head(m, outputs=("log_probs", "entropy"))
    return m


def trl_rows(prompt_lens, completion_lens, seed=0):
    """TRL's layout: prompts left-padded to the longest, completions right-padded (pad 0):
    (ids, attention mask, completion width)."""
    g = torch.Generator().manual_seed(seed)
    P, C = max(prompt_lens), max(max(completion_lens), 1)
    ids = torch.zeros(len(prompt_lens), P + C, dtype=torch.long)
    att = torch.zeros_like(ids)
    for i, (p, c) in enumerate(zip(prompt_lens, completion_lens)):
        ids[i, P - p: P + c] = torch.randint(3, 18, (p + c,), generator=g)
        att[i, P - p: P + c] = 1
    return ids, att, C
