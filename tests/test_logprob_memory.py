"""The policy's per-token log-probs and entropies never build the full-vocabulary log-softmax.

mixrl's loss reads them from ``Forwards.by_row_kind`` (:mod:`mixrl.trainer.parts.forwards`), which
calls TRL 1.16's ``_get_per_token_logps_and_entropies``: ``model(..., labels=..., fused_lm_head=True)`` on a
model whose forward TRL patched with ``add_fused_lm_head`` (the policy and the reference in
``GRPOTrainer.__init__``, every teacher in ``mixrl.trainer.assembly.load_teacher_models``). That head
projects the hidden states through the LM head in ``[TOKEN_CHUNK_SIZE, vocab chunk]`` tiles and
keeps online log-sum-exp statistics per token, ``log p(y_t) = z_{y_t} - logsumexp_v z_v`` and
``H_t = logsumexp_v z_v - sum_v softmax(z)_v z_v`` (``z`` = logits / temperature); backward
recomputes each tile. Every test runs on both forwards of ``trainer.padding_free`` (TRL's padded
rows, and mixrl's rows packed into one sequence: :mod:`mixrl.trainer.parts.packing`). These tests pin that path: its values and gradients equal the plain
``log_softmax`` over the whole ``[B, T, V]`` logits (with padded and prompt positions), and
its largest temporary is a tile, not ``B T V`` (so ``mixrl plan`` may count the tile).
"""

from __future__ import annotations

import contextlib
import inspect
from types import SimpleNamespace

import pytest
import torch

V, H = 1000, 16
TEMPERATURE = 0.7


def _model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    conf = Qwen2Config(vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=1, max_position_embeddings=128, tie_word_embeddings=False)
    return Qwen2ForCausalLM(conf).float()


def _batch():
    """8 rows: 18 prompt tokens (row 0 left-padded by 5), 30 completion tokens (rows 1 and 3
    right-padded), as TRL lays out a micro-batch."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (8, 48), generator=g)
    att = torch.ones_like(ids)
    att[0, :5] = 0
    att[1, 35:] = 0
    att[3, 20:] = 0
    return ids, att, 30


@pytest.fixture(autouse=True, params=["false", "true"], ids=["padded", "padding-free"])
def padding_free(request):
    """Every test on both forwards: TRL's padded rows and mixrl's packed rows (``trainer.padding_free``)."""
    _MODE[0] = request.param
    yield request.param
    _MODE[0] = "false"


_MODE = ["false"]


def _policy_path(model, ids, att, keep):
    """What ``Forwards.by_row_kind`` calls, on the model as TRL prepares it."""
    from trl.trainer.utils import add_fused_lm_head

    from mixrl.trainer.grpo import MixrlGRPOTrainer
    from mixrl.trainer.parts.packing import Packing

    add_fused_lm_head(model, temperature=TEMPERATURE, outputs=("log_probs", "entropy"))  # as GRPOTrainer.__init__
    stub = SimpleNamespace(accelerator=SimpleNamespace(autocast=contextlib.nullcontext, is_main_process=True),
                           parts=SimpleNamespace(packing=Packing(_MODE[0]), score_chunks=None))  # the packing part; no token budget
    logps, ent, _ = MixrlGRPOTrainer._get_per_token_logps_and_entropies(stub, model, ids, att, keep, compute_entropy=True)
    return logps, ent


def _plain(model, ids, att, keep):
    """The full computation: every logit, one log_softmax over the vocabulary."""
    logits = model(input_ids=ids, attention_mask=att).logits[:, -keep - 1:-1] / TEMPERATURE
    logsm = torch.log_softmax(logits, -1)
    logps = logsm.gather(-1, ids[:, -keep:].unsqueeze(-1)).squeeze(-1)
    ent = -(logsm.exp() * logsm).sum(-1)
    mask = att[:, -keep:].bool()
    return logps.masked_fill(~mask, 0.0), ent.masked_fill(~mask, 0.0)


def test_the_trainer_prepares_every_scoring_model_with_the_fused_head():
    """The policy and the reference get TRL's fused head in ``GRPOTrainer.__init__``, the
    teachers in mixrl's ``load_teacher_models``; the policy path calls the model with ``fused_lm_head=True``."""
    from trl import GRPOTrainer

    from mixrl.trainer import assembly
    from mixrl.trainer.grpo import MixrlGRPOTrainer
    from mixrl.trainer.parts.forwards import Forwards

    init = inspect.getsource(GRPOTrainer.__init__)
    assert 'outputs=("log_probs", "entropy")' in init and "add_fused_lm_head(\n                self.ref_model" in init
    assert "add_fused_lm_head(m," in inspect.getsource(assembly.load_teacher_models)
    from mixrl.trainer.parts.packing import Packing

    assert "fused_lm_head=True" in inspect.getsource(GRPOTrainer._get_per_token_logps_and_entropies)  # padded
    assert "GRPOTrainer._get_per_token_logps_and_entropies(" in inspect.getsource(
        MixrlGRPOTrainer._get_per_token_logps_and_entropies)
    assert "fused_lm_head=True" in inspect.getsource(Packing.logps)  # padding-free
    from mixrl.trainer import trl_handles

    assert "trainer._get_per_token_logps_and_entropies(" in inspect.getsource(trl_handles.from_trainer)  # Forwards' logps
    assert "h.per_token_logps" in inspect.getsource(assembly.build_parts)
    assert "self.logps(model, ids, att" in inspect.getsource(Forwards.by_row_kind)


def test_values_and_gradients_equal_the_plain_log_softmax():
    """Against the plain computation in float64 (exact for this purpose): values within 1e-6,
    every parameter's gradient within 1e-6 of its largest entry (float32 rounding; the plain
    computation in float32 is no closer), padded positions exactly 0."""
    ids, att, keep = _batch()
    mask = att[:, -keep:].bool()
    weights = torch.randn(ids.shape[0], keep, generator=torch.Generator().manual_seed(2))

    exact = _model().double()
    lp0, h0 = _plain(exact, ids, att, keep)
    ((lp0 * weights.double()).sum() + (h0 * weights.double().flip(0)).sum()).backward()

    fused_model = _model()
    lp1, h1 = _policy_path(fused_model, ids, att, keep)
    ((lp1 * weights).sum() + (h1 * weights.flip(0)).sum()).backward()

    assert (lp1.double() - lp0)[mask].abs().max() < 1e-6 and (h1.double() - h0)[mask].abs().max() < 1e-6
    assert (lp1[~mask] == 0).all() and (h1[~mask] == 0).all()  # padded positions: zero, no gradient
    grads = {n: p.grad for n, p in exact.named_parameters()}
    for name, p in fused_model.named_parameters():
        ref = grads[name]
        assert (p.grad.double() - ref).abs().max() <= 1e-6 * ref.abs().max(), name
    assert float(fused_model.lm_head.weight.grad.abs().sum()) > 0


def _largest_allocation(fn) -> int:
    """The largest single CPU allocation (bytes) while ``fn`` runs, from torch's memory profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    sizes = [e.nbytes() for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    assert sizes, "the profiler recorded no allocation"
    return max(sizes)


def test_the_largest_temporary_is_a_tile_not_the_whole_vocabulary(monkeypatch):
    """With small tiles (16 tokens x 256 vocabulary entries) the fused path's largest allocation
    stays far below one ``[tokens, V]`` float32 tensor, which the plain path allocates."""
    import trl.kernels.chunked_logprob as kernel
    import trl.trainer.utils as trl_utils

    monkeypatch.setattr(kernel, "TOKEN_CHUNK_SIZE", 16)
    monkeypatch.setattr(trl_utils, "_CHUNKED_LOGPROB_CHUNK_SIZE", 256)
    ids, att, keep = _batch()
    tokens = ids.shape[0] * (ids.shape[1] - 1)  # on CPU the head scores every position
    full = tokens * V * 4
    model = _model()

    def fused():
        lp, ent = _policy_path(model, ids, att, keep)
        (lp.sum() + ent.sum()).backward()

    def plain():
        lp, ent = _plain(model, ids, att, keep)
        (lp.sum() + ent.sum()).backward()

    fused_max, plain_max = _largest_allocation(fused), _largest_allocation(plain)
    assert plain_max >= full  # the check can fail: the plain path holds [tokens, V]
    # the fused path: a 16 x 256 float32 tile, the [V, H] weight-gradient accumulator, or the
    # backbone's own largest tensor (the MLP's [B, T, 64] activations)
    assert fused_max <= max(16 * 256 * 4, V * H * 4, ids.numel() * 64 * 4) < full / 10
    print(f"largest allocation: plain {plain_max:,} B, fused {fused_max:,} B ([tokens, V] float32 = {full:,} B)")


@pytest.mark.parametrize("keep", [1, 20])
def test_entropy_without_gradient_and_short_completions(keep):
    """No-grad scoring (old/ref/teacher log-probs) gives the same values; a 1-token completion too."""
    ids, att, _ = _batch()
    model = _model()
    with torch.no_grad():
        lp0, h0 = _plain(_model().double(), ids, att, keep)
        lp1, h1 = _policy_path(model, ids, att, keep)
    assert (lp1.double() - lp0).abs().max() < 1e-6 and (h1.double() - h0).abs().max() < 1e-6


def test_tile_width_fitted_to_a_small_vocabulary(monkeypatch):
    """TRL allocates its tile 32768 entries wide whatever the vocabulary; the trainer narrows it
    to the vocabulary (``mixrl.trainer.lm_head``): same values, a far smaller largest allocation."""
    import trl.trainer.utils as trl_utils

    from mixrl.trainer.assembly import build_parts
    from mixrl.trainer.lm_head import TRL_TILE_VOCAB, fit_tile_to_vocab

    assert "fit_tile_to_vocab(" in inspect.getsource(build_parts)
    monkeypatch.setattr(trl_utils, "_CHUNKED_LOGPROB_CHUNK_SIZE", TRL_TILE_VOCAB)
    ids, att, keep = _batch()
    model = _model()

    def fused():
        lp, ent = _policy_path(model, ids, att, keep)
        (lp.sum() + ent.sum()).backward()
        return lp.detach(), ent.detach()

    wide = _largest_allocation(fused)
    lp_wide, ent_wide = fused()
    assert wide >= ids.shape[0] * (ids.shape[1] - 1) * TRL_TILE_VOCAB * 4  # the 32768-wide float32 tile
    assert fit_tile_to_vocab([model]) == V == trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE
    narrow = _largest_allocation(fused)
    lp, ent = fused()
    assert narrow * 10 < wide
    assert torch.equal(lp, lp_wide) and torch.equal(ent, ent_wide)
    print(f"largest allocation: TRL's 32768-wide tile {wide:,} B, fitted to V={V}: {narrow:,} B")
    big = _model()
    big.lm_head = torch.nn.Linear(H, 50_000, bias=False)
    assert fit_tile_to_vocab([big]) == TRL_TILE_VOCAB  # never wider than TRL's
    zero3 = _model()
    zero3.lm_head.weight = torch.nn.Parameter(torch.empty(0))  # how DeepSpeed ZeRO-3 leaves a partitioned parameter
    zero3.lm_head.weight.ds_shape = torch.Size([500, H])
    assert fit_tile_to_vocab([zero3]) == 500
