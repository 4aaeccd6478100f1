"""``trainer.generation=compact`` (mixrl.trainer.generation.compact): padded generation whose
decoding steps compute only the rows not yet done. Greedy and same-seed sampled completions equal
plain padded generation's token for token (float32 tiny model), with rows ending at different
steps (eos, a caller's stopping criterion) and prompts of different lengths; the work saved is
counted; every case that falls back to plain ``generate``; the trainer's own generation path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mixrl.trainer.generation.compact import CompactGeneration
from tests.conftest import FAST


def _cfg(extra: list[str], run_dir: Path | None = None):
    from mixrl.config.compose import compose_config

    return compose_config([*FAST, "algo=grpo", *([f"run_dir={run_dir}"] if run_dir else []), *extra])


def _model_and_batch(path: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    texts = ["12+7=", "3*4=", "100-58=", "9+9+9="]  # different lengths: rows are left-padded
    enc = tok(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    return tok, model, enc["input_ids"].repeat_interleave(3, 0), enc["attention_mask"].repeat_interleave(3, 0)


def _gen(tok, **kw):
    from transformers import GenerationConfig

    return GenerationConfig(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, disable_compile=True, **kw)


class StopAt:
    """A caller's stopping criterion (as bench.row_stops.RowLengths): row i is done after lengths[i] new tokens."""

    def __init__(self, lengths: list[int], width: int):
        self.lengths, self.width = torch.tensor(lengths), width

    def __call__(self, input_ids, scores, **kwargs):
        return (input_ids.shape[1] - self.width) >= self.lengths


def _both(model, kwargs: dict, seed: int = 3, shrink: float = 1 / 8):
    """(plain generate's output, the compact one's, the wrapper) for the same call and seed."""
    torch.manual_seed(seed)
    plain = model.generate(**kwargs)
    compact = CompactGeneration(model, shrink=shrink)
    torch.manual_seed(seed)
    out = model.generate(**kwargs)
    del model.generate  # the class's generate again
    assert "forward" not in model.__dict__ and "_get_stopping_criteria" not in model.__dict__  # hooks removed
    return plain, out, compact


@pytest.mark.parametrize("shrink", [0.0, 1 / 8, 0.5])
def test_rows_stopped_by_a_criterion_equal_plain_generate(tiny_model_path, shrink):
    """12 left-padded rows stopped at 12 different lengths by a caller's criterion (eos suppressed,
    min_new_tokens, as the benchmark generates): greedy and sampled (same seed) equal plain
    generate's tensors, finished rows padded; fewer row-steps computed than padded generation's
    12 rows x 11 decoding steps."""
    from transformers import StoppingCriteriaList

    tok, model, ids, mask = _model_and_batch(tiny_model_path)
    lengths = [1, 12, 3, 7, 2, 12, 5, 9, 4, 6, 10, 8]
    for sample in (False, True):
        gen = _gen(tok, max_new_tokens=12, min_new_tokens=12, do_sample=sample, top_k=0)
        stops = StoppingCriteriaList([StopAt(lengths, ids.shape[1])])
        plain, out, compact = _both(model, dict(input_ids=ids, attention_mask=mask, generation_config=gen,
                                                stopping_criteria=stops), shrink=shrink)
        assert torch.equal(out, plain), (sample, shrink)
        W = ids.shape[1]
        assert out.shape == (12, W + 12)
        new = out[:, W:]
        for i, n in enumerate(lengths):  # row i: n tokens, then pad
            assert (new[i, n:] == tok.pad_token_id).all()
        assert compact.calls == 1 and compact.padded == 12 * 11
        if shrink == 0.0:  # a row leaves as soon as it is done: row-steps = sum over steps of the rows not done
            assert compact.computed == sum(sum(1 for n in lengths if n > s) for s in range(1, 12))
        assert compact.computed < compact.padded


def test_rows_ending_at_eos_equal_plain_generate(tiny_model_path):
    """Rows that end by emitting eos (each row's tokens made more likely to be eos by a high
    temperature on a tiny model; eos of a real token): sampled, 24 new tokens, top-k and top-p
    and a repetition penalty on; the same tensors as plain generate over several seeds, and at
    least one row ended early in at least one of them (so rows were dropped)."""
    tok, model, ids, mask = _model_and_batch(tiny_model_path)
    eos = int(tok.convert_tokens_to_ids("1")) if tok.convert_tokens_to_ids("1") is not None else tok.eos_token_id
    dropped = 0
    for seed in range(4):
        gen = _gen(tok, max_new_tokens=24, do_sample=True, temperature=1.5, top_k=20, top_p=0.95, repetition_penalty=1.1)
        gen.eos_token_id = eos
        plain, out, compact = _both(model, dict(input_ids=ids, attention_mask=mask, generation_config=gen), seed=seed, shrink=0.0)
        assert torch.equal(out, plain), seed
        dropped += compact.padded - compact.computed
    assert dropped > 0


def test_falls_back_to_plain_generate(tiny_model_path):
    """Beam search, several sequences per prompt, a configured cache, positional inputs, scores
    asked for: plain generate (nothing compacted); no eos criterion: generate runs through the
    hooks but every row is computed (transformers samples on for rows a criterion ended)."""
    from transformers import StoppingCriteriaList

    tok, model, ids, mask = _model_and_batch(tiny_model_path)
    compact = CompactGeneration(model)
    gen = _gen(tok, max_new_tokens=2)
    model.generate(input_ids=ids, attention_mask=mask, generation_config=_gen(tok, max_new_tokens=2, num_beams=2))
    model.generate(input_ids=ids, attention_mask=mask, generation_config=_gen(tok, max_new_tokens=2, num_return_sequences=2,
                                                                               do_sample=True))
    model.generate(input_ids=ids, attention_mask=mask, generation_config=_gen(tok, max_new_tokens=2, cache_implementation="static"))
    model.generate(ids, attention_mask=mask, generation_config=gen)
    model.generate(input_ids=ids, attention_mask=mask, generation_config=_gen(tok, max_new_tokens=2, return_dict_in_generate=True,
                                                                               output_scores=True))
    assert compact.calls == 0
    no_eos = _gen(tok, max_new_tokens=6)
    no_eos.eos_token_id = None
    stops = StoppingCriteriaList([StopAt([1] * 12, ids.shape[1])])
    torch.manual_seed(0)
    out = model.generate(input_ids=ids, attention_mask=mask, generation_config=no_eos, stopping_criteria=stops)
    assert compact.calls == 1 and compact.computed == compact.padded
    del model.generate
    torch.manual_seed(0)
    assert torch.equal(out, model.generate(input_ids=ids, attention_mask=mask, generation_config=no_eos, stopping_criteria=stops))


def test_trainer_sampled_equals_padded(tiny_model_path, tmp_path):
    """Through the trainer (TRL's _generate_single_turn under MixrlGRPOTrainer), sampled with the
    same seed: the same completion ids from padded generation and from compact generation."""
    from mixrl.trainer import build

    outs = {}
    for mode in ("padded", "compact"):
        cfg = _cfg([f"model.path={tiny_model_path}", f"trainer.generation={mode}"], tmp_path / mode)
        trainer = build.trainer_from_config(cfg, run_dir=tmp_path / mode)
        assert trainer.use_transformers_continuous_batching is False
        assert isinstance(trainer.generation_wrap, CompactGeneration) is (mode == "compact")
        tok = trainer.processing_class
        texts = ["12+7=", "3*4=", "100-58=", "9+9+9="]
        prompt_ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts for _ in range(4)]
        torch.manual_seed(11)
        ids, _ = trainer._generate_single_turn(prompt_ids, None, {}, 4)
        outs[mode] = [list(x) for x in ids]
        if mode == "compact":
            assert trainer.generation_wrap.calls == 1 and trainer.generation_wrap.computed < trainer.generation_wrap.padded
    assert len({len(c) for c in outs["padded"]}) > 1  # rows of different lengths
    assert outs["compact"] == outs["padded"]
