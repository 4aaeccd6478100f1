"""The one batched HF generate loop (mixrl.evaluation.generate): held-out greedy evaluation, the
benchmarks' HF backend and the acting loop's id generation give the same greedy completions of
the same prompts on the tiny model; the model's mode and the tokenizer's padding side come back as
they were; ``stop`` ends the loop between batches."""

from __future__ import annotations

import pytest

from mixrl.benchmarks.runner import HFGenerator
from mixrl.evaluation import generate
from mixrl.evaluation.accuracy import EvaluationInterrupted, generate_completions
from mixrl.evaluation.greedy import greedy_completions
from mixrl.tasks import arith


@pytest.fixture(scope="module")
def model_tok(tiny_model_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    tok.pad_token = tok.pad_token or tok.eos_token
    return AutoModelForCausalLM.from_pretrained(tiny_model_path), tok


def test_every_path_gives_the_same_greedy_completions(model_tok):
    model, tok = model_tok
    prompts = [p["prompt"] for p in arith.heldout_split(9, levels=[1, 2, 3])]
    held_out = greedy_completions(model, tok, prompts, max_new_tokens=6, batch_size=4)
    assert [c[0] for c in generate_completions(model, tok, prompts, max_new_tokens=6, batch_size=9)] == held_out
    bench = HFGenerator(lambda: model, tok, batch_size=4)
    assert bench.generate(prompts, pairs=list(range(9)), temperature=0.0, top_p=None, max_new_tokens=6, seed=0) == held_out
    ids = generate.generate_ids(model, tok, [tok(p)["input_ids"] for p in prompts], max_new_tokens=6)
    assert [tok.decode(x, skip_special_tokens=True) for x in ids] == held_out
    # a row's own budget cuts its ids (the multi-turn loops give each row what is left of it)
    short = generate.generate_ids(model, tok, [tok(p)["input_ids"] for p in prompts[:3]], max_new_tokens=[1, 2, 6])
    assert [len(x) for x in short][:2] == [1, 2] and short[2] == ids[2]


def test_mode_and_padding_side_come_back_and_stop_ends_between_batches(model_tok):
    model, tok = model_tok
    prompts = ["1+2=", "3+4=", "5+6="]
    side = tok.padding_side
    for training in (True, False):
        model.train(training)
        generate_completions(model, tok, prompts, max_new_tokens=2, batch_size=2)
        assert model.training is training and tok.padding_side == side
    done = []  # progress after each batch; stop turns True once one batch is done
    model.train(True)
    with pytest.raises(EvaluationInterrupted, match="stopped after 1 of 3"):
        generate_completions(model, tok, prompts, max_new_tokens=1, batch_size=1, stop=lambda: bool(done),
                             progress=done.append)
    assert model.training is True and tok.padding_side == side
    assert done == [1]
    model.eval()
