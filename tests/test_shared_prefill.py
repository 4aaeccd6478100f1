"""``trainer.generation=shared-prefill`` (mixrl.trainer.generation.shared_prefill): each group's
prompt prefilled once, its cache expanded to the group's rows. Greedy completions equal plain
padded generation's token for token, through the trainer's own generation path; sampled ones
come from the same random stream and follow the model's distribution; the grouping, the
positions, and every case that falls back to plain ``generate``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mixrl.trainer.generation.shared_prefill import SharedPrefill, positions, prompt_groups
from tests.conftest import FAST


def _cfg(extra: list[str], run_dir: Path | None = None):
    from mixrl.config.compose import compose_config

    return compose_config([*FAST, "algo=grpo", *([f"run_dir={run_dir}"] if run_dir else []), *extra])


def test_prompt_groups_by_hand():
    """Rows 0, 2, 3 share a prompt; row 4 has the ids of row 1 but another mask (not the same prompt)."""
    ids = torch.tensor([[0, 5, 6], [7, 8, 9], [0, 5, 6], [0, 5, 6], [7, 8, 9]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 1, 1], [0, 1, 1], [0, 1, 1]])
    first, index = prompt_groups(ids, mask)
    assert first.tolist() == [0, 1, 4]  # the first row of each distinct prompt, in order of appearance
    assert index.tolist() == [0, 1, 0, 0, 2]
    assert torch.equal(ids[first][index], ids) and torch.equal(mask[first][index], mask)


def test_positions_as_generate_derives_them():
    """Left padding at 0, then 0, 1, 2, ... over the real tokens (transformers 5.x's rule)."""
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert positions(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]


def _install(model) -> SharedPrefill:
    from transformers import DynamicCache

    return SharedPrefill(model, new_cache=lambda: DynamicCache(config=model.config))


def _model_and_batch(path: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    texts = ["12+7=", "3*4=", "100-58=", "9+9+9="]  # different lengths: rows are left-padded
    enc = tok(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    return tok, model, enc["input_ids"].repeat_interleave(3, 0), enc["attention_mask"].repeat_interleave(3, 0)


def _gen(tok, **kw):
    from transformers import GenerationConfig

    return GenerationConfig(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, disable_compile=True, **kw)


def test_greedy_and_sampled_equal_plain_generate(tiny_model_path):
    """12 rows (4 prompts x 3), 12 new tokens: greedy, and sampled with the same seed (the decoding
    steps and their random draws are the plain path's), the same tensors as plain generate; the
    prefill ran on the 4 distinct prompts only."""
    tok, model, ids, mask = _model_and_batch(tiny_model_path)
    outs = {}
    for sample in (False, True):
        gen = _gen(tok, max_new_tokens=12, min_new_tokens=12, do_sample=sample, top_k=0)
        torch.manual_seed(3)
        outs["plain", sample] = model.generate(input_ids=ids, attention_mask=mask, generation_config=gen)
        shared = _install(model)
        torch.manual_seed(3)
        outs["shared", sample] = model.generate(input_ids=ids, attention_mask=mask, generation_config=gen)
        del model.generate  # the class's generate again
        W = ids.shape[1]
        assert shared.calls == 1 and shared.prefilled == 4 * (W - 1) and shared.saved == 8 * (W - 1)
        assert outs["plain", sample].shape == (12, W + 12)
        assert torch.equal(outs["shared", sample], outs["plain", sample]), sample
    assert not torch.equal(outs["plain", True], outs["plain", False])  # sampling did sample


def test_falls_back_to_plain_generate(tiny_model_path):
    """No repeated prompt, a one-token prompt, beam search, several sequences per prompt, a
    configured cache, positional inputs: plain generate, nothing prefilled."""
    tok, model, ids, mask = _model_and_batch(tiny_model_path)
    shared = _install(model)
    gen = _gen(tok, max_new_tokens=2)
    model.generate(input_ids=ids[::3], attention_mask=mask[::3], generation_config=gen)  # 4 distinct prompts
    model.generate(input_ids=ids[:, -1:], attention_mask=mask[:, -1:], generation_config=gen)  # one-token prompts
    model.generate(input_ids=ids, attention_mask=mask, generation_config=_gen(tok, max_new_tokens=2, num_beams=2))
    model.generate(input_ids=ids, attention_mask=mask, generation_config=_gen(tok, max_new_tokens=2, num_return_sequences=2,
                                                                               do_sample=True))
    model.generate(input_ids=ids, attention_mask=mask, generation_config=_gen(tok, max_new_tokens=2, cache_implementation="static"))
    model.generate(ids, attention_mask=mask, generation_config=gen)
    assert shared.calls == shared.prefilled == 0


@pytest.mark.slow
def test_sampled_two_tokens_in_distribution(tiny_model_path):
    """Sampled, temperature 1: 600 rows of one prompt, two tokens each. The first token follows
    p(t1 | prompt) (the last prompt position computed over the shared cache), the pair follows
    p(t1) p(t2 | t1) (the decoding step reads the expanded cache): every outcome of probability
    > 0.05 within 5 standard errors (sqrt(p (1 - p) / N)) of it, the probabilities from plain
    forwards of the model."""
    tok, model, ids, mask = _model_and_batch(tiny_model_path)
    n = 600
    prompt = ids[3:4][mask[3:4].bool()].unsqueeze(0)  # "3*4=", unpadded
    shared = _install(model)
    torch.manual_seed(0)
    gen = _gen(tok, max_new_tokens=2, min_new_tokens=2, do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
    draws = model.generate(input_ids=prompt.repeat(n, 1), attention_mask=torch.ones(n, prompt.shape[1], dtype=torch.long),
                           generation_config=gen)[:, -2:]
    assert shared.calls == 1
    with torch.no_grad():
        p1 = torch.softmax(model(prompt).logits[0, -1].float(), -1)
    freq1 = torch.bincount(draws[:, 0], minlength=p1.numel()).float() / n
    big = p1 > 0.05
    assert big.any()
    assert ((freq1 - p1).abs()[big] <= 5 * (p1 * (1 - p1) / n).sqrt()[big]).all(), (freq1[big], p1[big])
    checked = 0
    for t1 in big.nonzero().flatten().tolist():
        with torch.no_grad():
            p2 = torch.softmax(model(torch.cat([prompt, torch.tensor([[t1]])], 1)).logits[0, -1].float(), -1)
        pair = p1[t1] * p2
        freq = torch.bincount(draws[draws[:, 0] == t1, 1], minlength=p2.numel()).float() / n
        keep = pair > 0.05
        se = (pair * (1 - pair) / n).sqrt()
        assert ((freq - pair).abs()[keep] <= 5 * se[keep]).all(), (t1, freq[keep], pair[keep])
        checked += int(keep.sum())
    assert checked > 0


def test_trainer_greedy_equals_padded(tiny_model_path, tmp_path):
    """Through the trainer (TRL's _generate_single_turn under MixrlGRPOTrainer), greedy: the same
    completion ids from padded generation and from shared prefill, row by row; TRL's padded
    engine (not continuous batching) in both."""
    from mixrl.trainer import build

    outs = {}
    for mode in ("padded", "shared-prefill"):
        cfg = _cfg([f"model.path={tiny_model_path}", f"trainer.generation={mode}"], tmp_path / mode)
        trainer = build.trainer_from_config(cfg, run_dir=tmp_path / mode, generation_kwargs={"do_sample": False})
        assert trainer.use_transformers_continuous_batching is False
        assert isinstance(trainer.generation_wrap, SharedPrefill) is (mode == "shared-prefill")
        tok = trainer.processing_class
        texts = ["12+7=", "3*4=", "100-58=", "9+9+9="]
        prompt_ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts for _ in range(2)]
        ids, _ = trainer._generate_single_turn(prompt_ids, None, {}, 2)
        outs[mode] = [list(x) for x in ids]
        if mode == "shared-prefill":
            assert trainer.generation_wrap.calls == 1 and trainer.generation_wrap.saved > 0
    assert any(len(c) > 1 for c in outs["padded"])
    assert outs["shared-prefill"] == outs["padded"]
