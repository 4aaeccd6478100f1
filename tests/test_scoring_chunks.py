"""No-grad scoring forwards in token-budget chunks (:mod:`mixrl.trainer.parts.scoring_chunks`).

* On the pin model with TRL's fused head (float32): per-token log-probs and entropies of rows in
  token-budget chunks (padded, packed, and the collective rule) against TRL's fixed-row forward,
  within 1e-4 (the padded-vs-packed margin of ``tests/test_padding_free.py``; float kernels of other
  shapes differ by ~1e-6); padding scores 0; the rows come back in their original order although
  the chunks take them longest first; every chunk within the budget and trimmed to its own widest.
* Through the trainer (pins harness, ``trainer.max_tokens_per_micro_batch``): TRL's reference
  (``algo.kl.coef > 0``) and old (``trainer.num_iterations = 2``) log-probs equal those of the
  fixed-row forwards, and the chunks really ran.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from fused_rows import fused_pin_model, trl_rows

from mixrl.core.token_budget import completion_lengths
from mixrl.trainer.parts.packing import Packing
from mixrl.trainer.parts.scoring_chunks import ScoringChunks

HERE = Path(__file__).resolve().parent
PIN_MODEL = HERE / "fixtures" / "pin-model"
TOL = 1e-4  # see tests/test_padding_free.py: kernel differences of ~3e-6 between CPU kernel sets, 30x margin

PROMPTS = [7, 3, 1, 5, 2, 4, 6, 2]
COMPLETIONS = [9, 0, 30, 1, 6, 12, 2, 25]  # an empty completion, two long rows among short ones


@pytest.fixture(scope="module")
def model():
    return fused_pin_model()


_rows = trl_rows  # TRL's layout (tests/fused_rows.py)


def _fixed(seen: list | None = None):
    """TRL 1.16's ``_get_per_token_logps_and_entropies`` (trl/trainer/grpo_trainer.py): fixed row
    chunks of ``batch_size``, each padded to the batch's width. ``seen``: each forward's shape."""
    def run(m, ids, att, C, batch_size=None, compute_entropy=False):
        batch_size = batch_size or ids.size(0)
        lps, ents = [], []
        for s in range(0, ids.size(0), batch_size):
            i, a = ids[s:s + batch_size], att[s:s + batch_size]
            if seen is not None:
                seen.append(tuple(i.shape))
            labels = i.masked_fill(a == 0, -100)
            labels[:, :-C] = -100
            out = m(input_ids=i, attention_mask=a, labels=labels, fused_lm_head=True)
            lps.append(out.log_probs[:, -C:])
            ents.append(out.entropy[:, -C:])
        return torch.cat(lps), (torch.cat(ents) if compute_entropy else None), None
    return run


def _close(a, b):
    return a.shape == b.shape and float((a - b).abs().max()) <= TOL


def test_padded_chunks_equal_the_fixed_row_forward_in_the_original_order(model):
    ids, att, C = _rows(PROMPTS, COMPLETIONS)
    P = ids.size(1) - C
    chunks = ScoringChunks(4 * (P + 10), collective=False)
    with torch.no_grad():
        lp0, ent0, _ = _fixed()(model, ids, att, C, batch_size=2, compute_entropy=True)
        seen: list = []
        lp1, ent1, _ = chunks.logps(_fixed(seen), model, ids, att, C, batch_size=None, compute_entropy=True)
    assert _close(lp1, lp0) and _close(ent1, ent0), float((lp1 - lp0).abs().max())
    assert lp0.abs().sum() > 0 and (lp1[att[:, -C:] == 0] == 0).all() and (ent1[att[:, -C:] == 0] == 0).all()
    groups = chunks.groups(att, C, None, packed=False)
    assert sorted(i for g in groups for i in g) == list(range(len(PROMPTS)))  # every row once
    assert [i for g in groups for i in g] != list(range(len(PROMPTS)))  # longest first: not the rows' order
    lengths = completion_lengths(att[:, P:])
    for g, shape in zip(groups, seen):  # one forward per chunk, trimmed to its own longest completion
        w = int(lengths[g].max())
        assert shape == (len(g), P + w)
        assert len(g) == 1 or len(g) * (P + w) <= chunks.budget
    assert len(seen) > 1 and min(s[1] for s in seen) < P + C  # split and trimmed otherwise


def test_rows_per_chunk_never_exceed_the_forward_s_batch_size(model):
    ids, att, C = _rows(PROMPTS, COMPLETIONS)
    chunks = ScoringChunks(10_000, collective=False)  # the budget alone: one chunk
    assert [len(g) for g in chunks.groups(att, C, None, packed=False)] == [8]
    assert [len(g) for g in chunks.groups(att, C, 3, packed=False)] == [3, 3, 2]
    with torch.no_grad():
        lp0, _, _ = _fixed()(model, ids, att, C)
        lp1, _, _ = chunks.logps(_fixed(), model, ids, att, C, batch_size=3)
    assert _close(lp1, lp0)


def test_packed_chunks_equal_the_fixed_row_forward(model):
    ids, att, C = _rows(PROMPTS, COMPLETIONS)
    packing = Packing("true")
    calls = []

    def packed(m, i, a, w, batch_size=None, compute_entropy=False):
        calls.append((i.size(0), int(a.sum())))
        return packing.logps(m, i, a, w, batch_size=batch_size, compute_entropy=compute_entropy,
                             padded=lambda ids_, att_: _fixed()(m, ids_, att_, w, compute_entropy=compute_entropy))

    chunks = ScoringChunks(40, collective=False, packed=packing.applies)
    with torch.no_grad():
        lp0, ent0, _ = _fixed()(model, ids, att, C, batch_size=2, compute_entropy=True)
        lp1, ent1, _ = chunks.logps(packed, model, ids, att, C, compute_entropy=True)
    assert _close(lp1, lp0) and _close(ent1, ent0)
    # packed cost: the rows' own tokens (a row longer than the budget alone)
    assert len(calls) > 1 and all(tokens <= 40 or rows == 1 for rows, tokens in calls)
    assert sum(tokens for _, tokens in calls) == int(att.sum())


def test_packed_rows_under_a_row_cap_go_to_balanced_chunks():
    """Rows (own lengths 10 9 8 7 6 5 4 3, longest first) capped at 2 per chunk, a budget that would
    hold them all: 4 chunks dealt back and forth, 2 rows each, tokens balanced (13 13 13 13)."""
    prompts, completions = [1] * 8, [9, 8, 7, 6, 5, 4, 3, 2]
    _, att, C = _rows(prompts, completions)
    groups = ScoringChunks(1000, collective=False).groups(att, C, 2, packed=True)
    assert groups == [[0, 7], [1, 6], [2, 5], [3, 4]]
    # collective: the fixed-row count, balanced likewise
    assert ScoringChunks(1, collective=True).groups(att, C, 2, packed=True) == groups
    # a budget tighter than the balanced chunks: more of them
    assert len(ScoringChunks(8, collective=False).groups(att, C, 2, packed=True)) > 4


def test_collective_keeps_the_fixed_row_count_and_sizes(model):
    """Under sharding every process must run as many forwards as the others: ceil(B / rows),
    as the fixed-row path, whatever the budget; the rows go longest first, each chunk trimmed."""
    ids, att, C = _rows(PROMPTS, COMPLETIONS)
    P = ids.size(1) - C
    chunks = ScoringChunks(1, collective=True)  # a budget that would split every row
    seen: list = []
    with torch.no_grad():
        lp0, _, _ = _fixed()(model, ids, att, C, batch_size=3)
        lp1, _, _ = chunks.logps(_fixed(seen), model, ids, att, C, batch_size=3)
    assert _close(lp1, lp0)
    assert len(seen) == math.ceil(len(PROMPTS) / 3) and [s[0] for s in seen] == [3, 3, 2]
    assert seen[0][1] == P + C and seen[-1][1] < P + C  # the longest rows together; the short ones trimmed
    assert chunks.groups(att, C, 3, packed=False)[0] == [2, 7, 5]


def test_no_rows_go_to_the_forward_once(model):
    ids, att, C = _rows([3], [2])
    chunks, calls = ScoringChunks(10, collective=False), []

    def forward(m, i, a, w, batch_size=None, compute_entropy=False):  # the trainer's: re-enters the part
        calls.append(i.shape)
        assert not chunks.takes()
        return i.new_zeros(i.shape[0], w, dtype=torch.float32), None, None

    with torch.no_grad():
        lp, _, _ = chunks.logps(forward, model, ids[:0], att[:0], C)
    assert lp.shape == (0, C) and calls == [(0, ids.size(1))] and not chunks._inside


def test_takes_only_no_grad_text_forwards_outside_its_own_chunks():
    chunks = ScoringChunks(100, collective=False)
    assert not chunks.takes()  # a training forward (grad on)
    with torch.no_grad():
        assert chunks.takes() and not chunks.takes(aux_loss=True)
        assert not chunks.takes(multimodal={"pixel_values": torch.zeros(1)})
        assert chunks.takes(multimodal={"pixel_values": None})
        chunks._inside = True  # the per-chunk forward re-enters the trainer's per-token log-probs
        assert not chunks.takes()


# --------------------------------------------------------------------------- through the trainer (pins harness)
BASE = ["algo=grpo", "trainer.max_steps=1", "trainer.prompts_per_step=4", "algo.num_generations=4",
        "trainer.micro_batch_size=8", "trainer.max_grad_norm=0", "trainer.eval_size=0", "trainer.max_completion_length=24",
        "trainer.logging_steps=1", "data.train_size=16", "logger.progress=false", "hardware.torch_threads=1",
        "algo.kl.coef=0.04", "trainer.num_iterations=2"]


def _scored(overrides: list[str], out_dir: Path):
    """The first generation batch's reference and old log-probs as TRL computed them, and the
    number of chunked scoring calls (fixed rollouts: tests/pins/harness.py)."""
    sys.path.insert(0, str(HERE / "pins"))
    import trl
    from harness import patch_generation

    from mixrl.config.compose import compose_config
    from mixrl.trainer import build

    original = trl.GRPOTrainer._generate_single_turn
    patch_generation()
    try:
        cfg = compose_config([*overrides, f"model.path={PIN_MODEL}", f"run_dir={out_dir / 'run'}"])
        Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
        trainer = build.trainer_from_config(cfg)
        batches, chunked = [], []
        gen = trainer._generate_and_score_completions
        trainer._generate_and_score_completions = lambda inputs: batches.append(gen(inputs)) or batches[-1]
        sc = trainer.parts.score_chunks
        if sc is not None:  # each chunked call: (rows, chunks)
            run = sc.logps
            sc.logps = lambda forward, m, ids, att, keep, **k: chunked.append(
                (ids.size(0), len(sc.groups(att, keep, k.get("batch_size"), packed=sc.packed(m))))) or run(forward, m, ids, att, keep, **k)
        trainer.train()
        return batches[0], chunked
    finally:
        trl.GRPOTrainer._generate_single_turn = original


@pytest.mark.parametrize("padding_free", ["false", pytest.param("true", marks=pytest.mark.slow)])  # ~10 s each
def test_reference_and_old_log_probs_under_a_budget_equal_the_fixed_rows(tmp_path, padding_free):
    over = [*BASE, f"trainer.padding_free={padding_free}"]
    fixed, none = _scored(over, tmp_path / "fixed")
    budget, chunked = _scored([*over, "trainer.max_tokens_per_micro_batch=120"], tmp_path / "budget")
    assert not none and len(chunked) == 2  # the old and the reference log-probs, each in chunks
    assert all(rows == 16 and n > 1 for rows, n in chunked), chunked  # the step's 16 rows in several chunks
    for key in ("ref_per_token_logps", "old_per_token_logps"):
        a, b = fixed[key], budget[key]
        assert a is not None and b is not None and a.abs().sum() > 0, key
        assert _close(b, a), (key, float((b - a).abs().max()))
