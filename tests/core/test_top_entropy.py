"""Prefix-RFT's top-entropy selection (``advantage_nll``, ``top_entropy``) at its boundary:
the k-th highest entropy is the threshold, compared in the entropies' own dtype, so the
boundary token (often the only one kept) always passes. Values chosen by hand: float32(0.1)
is 0.10000000149..., above the float64 0.1, so a float32-rounded threshold dropped it."""

from __future__ import annotations

import math

import pytest
import torch

from mixrl.core.terms import TERMS, TermInputs


def _run(h: torch.Tensor, *, top_entropy, mask=None, adv=2.0):
    """advantage_nll on one row of entropies ``h`` (logp -0.5 everywhere, A = adv); which tokens got a loss."""
    h = h.reshape(1, -1)
    logp = torch.full(h.shape, -0.5, dtype=torch.float32)
    m = torch.ones(h.shape, dtype=torch.bool) if mask is None else torch.tensor([mask])
    x = TermInputs(logp=logp, mask=m, advantages=torch.tensor([adv]), behaviour_logp=torch.zeros_like(logp), entropies=h)
    out = TERMS.get("advantage_nll")(x, top_entropy=top_entropy)
    kept = (out.per_token != 0).reshape(-1).tolist()
    return kept, out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_k1_keeps_the_single_highest_entropy_token(dtype):
    """5 tokens, top_entropy 0.2: k = ceil(0.2 * 5) = 1, only the 0.1 token; its loss -A log p = -2 * -0.5 = 1."""
    h = torch.tensor([0.05, 0.1, 0.02, 0.01, 0.03], dtype=dtype)
    kept, out = _run(h, top_entropy=0.2)
    assert kept == [False, True, False, False, False]
    assert out.per_token[0, 1].item() == pytest.approx(1.0)
    assert out.metrics["advantage_nll/kept"] == pytest.approx(1 / 5)


def test_float64_boundary_not_representable_in_float32_is_kept():
    """The old code rounded the threshold to float32: float32(0.1) > 0.1 in float64 dropped the token."""
    assert float(torch.tensor(0.1, dtype=torch.float32)) > 0.1  # the premise of this test
    h = torch.tensor([0.1, 0.3, 0.7, 0.2], dtype=torch.float64)  # k = ceil(0.75 * 4) = 3: 0.7, 0.3, 0.2
    kept, _ = _run(h, top_entropy=0.75)
    assert kept == [False, True, True, True]
    h = torch.tensor([0.1, 0.05, 0.07], dtype=torch.float64)  # k = ceil(0.3 * 3) = 1: the 0.1 token, float32-rounded up
    kept, _ = _run(h, top_entropy=0.3)
    assert kept == [True, False, False]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_ties_at_the_threshold_are_all_kept(dtype):
    """k = ceil(0.25 * 4) = 1 but two tokens share the top entropy: both pass (documented)."""
    h = torch.tensor([0.3, 0.1, 0.3, 0.2], dtype=dtype)
    kept, out = _run(h, top_entropy=0.25)
    assert kept == [True, False, True, False]
    assert out.metrics["advantage_nll/kept"] == pytest.approx(0.5)


def test_quantile_is_over_the_selected_tokens_only():
    """Unselected tokens (mask False) neither count towards k nor get kept, whatever their entropy."""
    h = torch.tensor([9.0, 0.1, 0.2, 0.4, 0.3], dtype=torch.float64)
    kept, _ = _run(h, top_entropy=0.5, mask=[False, True, True, True, True])  # k = ceil(0.5 * 4) = 2: 0.4, 0.3
    assert kept == [False, False, False, True, True]


def test_random_float64_batches_always_keep_exactly_k_distinct_tokens():
    """The failure the issue measured (boundary dropped in 9 of 24 random float64 batches): with
    distinct random entropies exactly k = ceil(share * n) tokens are kept, every time."""
    g = torch.Generator().manual_seed(0)
    for _ in range(24):
        h = torch.rand(40, generator=g, dtype=torch.float64) * 3
        kept, _ = _run(h, top_entropy=0.05)
        assert sum(kept) == math.ceil(0.05 * 40)
        assert kept[int(h.argmax())]
