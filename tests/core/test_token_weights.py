"""Token weights (detached) and LUFFY's shaped ratio, by hand."""

import math

import pytest
import torch

from mixrl.core import TOKEN_WEIGHTS, luffy_shaped_ratio

PS = [0.05, 0.1, 0.5, 0.9]


def weights(name, **kw):
    logp = torch.tensor([[math.log(p) for p in PS]], dtype=torch.float64, requires_grad=True)
    w = TOKEN_WEIGHTS.get(name)(logp, **kw)
    assert not w.requires_grad and w.shape == logp.shape
    return w[0].tolist()


def test_values():
    assert weights("one") == pytest.approx([1.0] * 4)
    assert weights("p") == pytest.approx(PS)
    assert weights("chord_phi") == pytest.approx([p * (1 - p) for p in PS])
    assert weights("luffy") == pytest.approx([p / (p + 0.1) for p in PS])
    assert weights("luffy", gamma=0.5) == pytest.approx([p / (p + 0.5) for p in PS])


@pytest.mark.parametrize("name", [n for n in TOKEN_WEIGHTS.names() if n != "chord_phi_clamp"])
def test_cutoff_zeroes_confident_tokens(name):
    full = weights(name)
    cut = weights(name, cutoff=0.4)
    assert cut == pytest.approx([w if p <= 0.4 else 0.0 for w, p in zip(full, PS)])


def test_chord_phi_clamp_keeps_the_weight_above_the_cutoff():
    """Trinity-RFT's cutoff clamps log p in the nll term instead (tests/core/test_peer_options.py)."""
    assert weights("chord_phi_clamp", cutoff=0.4) == pytest.approx([p * (1 - p) for p in PS])


def test_weighted_sft_gradient_is_weight_times_grad_logp():
    logp = torch.tensor([math.log(p) for p in PS], dtype=torch.float64, requires_grad=True)
    loss = -(TOKEN_WEIGHTS.get("chord_phi")(logp) * logp).sum()
    loss.backward()
    assert logp.grad.tolist() == pytest.approx([-p * (1 - p) for p in PS])


def test_luffy_shaped_ratio_has_gradient_gamma_p_over_p_plus_gamma_squared():
    logp = torch.tensor([math.log(p) for p in PS], dtype=torch.float64, requires_grad=True)
    f = luffy_shaped_ratio(logp, gamma=0.1)
    assert f.tolist() == pytest.approx([p / (p + 0.1) for p in PS])
    f.sum().backward()
    grads = [0.1 * p / (p + 0.1) ** 2 for p in PS]
    assert logp.grad.tolist() == pytest.approx(grads)
    # the weight peaks at p = gamma with value 1/4, like p(1-p) at p = 0.5
    assert grads[1] == pytest.approx(0.25) and max(grads) == grads[1]
