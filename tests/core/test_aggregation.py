"""Aggregations: hand values, empty masks, gradient-accumulation invariance with num_items."""

import pytest
import torch

from mixrl.core import AGGREGATIONS, aggregate

LOSS = [[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 0.0, 0.0], [5.0, 0.0, 0.0, 0.0]]
MASK = [[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]]  # row 2 is all padding


def agg(mode, loss=LOSS, mask=MASK, **kw):
    return AGGREGATIONS.get(mode)(torch.tensor(loss), torch.tensor(mask), **kw)


def test_hand_values():
    # token-mean: (1+2+3+4+10+20) / 6 tokens
    assert agg("token-mean").item() == pytest.approx(40 / 6)
    # seq-mean-token-mean: rows 0, 1 are non-empty: (10/4 + 30/2) / 2
    assert agg("seq-mean-token-mean").item() == pytest.approx((2.5 + 15.0) / 2)
    # seq-mean-token-sum: (10 + 30) / 2
    assert agg("seq-mean-token-sum").item() == pytest.approx(20.0)
    # Dr.GRPO: (10/8 + 30/8) / 2 with max_len 8; default max_len = T = 4
    assert agg("seq-mean-token-sum-norm", max_len=8).item() == pytest.approx((10 / 8 + 30 / 8) / 2)
    assert agg("seq-mean-token-sum-norm").item() == pytest.approx((10 / 4 + 30 / 4) / 2)


def test_num_items_overrides_local_count():
    assert agg("token-mean", num_items=10).item() == pytest.approx(40 / 10)
    assert agg("seq-mean-token-sum", num_items=4).item() == pytest.approx(40 / 4)
    assert agg("seq-mean-token-mean", num_items=5).item() == pytest.approx(17.5 / 5)


def test_masked_nan_does_not_leak():
    loss = [[1.0, float("nan")], [float("inf"), 3.0]]
    mask = [[1, 0], [0, 1]]
    for mode in AGGREGATIONS.names():
        assert torch.isfinite(agg(mode, loss, mask)), mode


@pytest.mark.parametrize("mode", AGGREGATIONS.names())
def test_empty_mask_is_zero_with_connected_graph(mode):
    x = torch.ones(2, 3, requires_grad=True)
    out = AGGREGATIONS.get(mode)(x * 2.0, torch.zeros(2, 3))
    assert out.item() == 0.0
    out.backward()
    assert torch.equal(x.grad, torch.zeros(2, 3))
    # zero-row batches too
    empty = torch.zeros(0, 3, requires_grad=True)
    out = AGGREGATIONS.get(mode)(empty, torch.zeros(0, 3))
    out.backward()
    assert out.item() == 0.0


@pytest.mark.parametrize("mode", AGGREGATIONS.names())
def test_gradient_accumulation_invariance(mode):
    """Two half batches with the global normaliser give the full-batch value and gradient,
    even when the halves are padded to different widths."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 5, generator=g, dtype=torch.float64, requires_grad=True)
    lengths = [5, 2, 0, 3, 1, 1]  # row 2 is empty; second half never longer than 3
    mask = torch.tensor([[1.0] * n + [0.0] * (5 - n) for n in lengths], dtype=torch.float64)
    tokens = float(mask.sum())
    rows = float(sum(1 for n in lengths if n > 0))
    num_items = tokens if mode == "token-mean" else rows

    full = aggregate(w.pow(2), mask, mode, max_len=8, num_items=None)
    (g_full,) = torch.autograd.grad(full, w)

    first = aggregate(w[:3].pow(2), mask[:3], mode, max_len=8, num_items=num_items)
    # the second half is trimmed to its own padded width (3)
    second = aggregate(w[3:, :3].pow(2), mask[3:, :3], mode, max_len=8, num_items=num_items)
    (g_acc,) = torch.autograd.grad(first + second, w)

    assert (first + second).item() == pytest.approx(full.item())
    assert torch.allclose(g_acc, g_full)


def test_unknown_mode_message():
    with pytest.raises(KeyError) as e:
        aggregate(torch.zeros(1, 1), torch.ones(1, 1), "token_mean")
    assert "did you mean: token-mean" in str(e.value)
