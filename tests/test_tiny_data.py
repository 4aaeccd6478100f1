"""`mixrl model build-tiny data.source=...`: the tiny model warm-started on a user's own rows."""

from __future__ import annotations

import hashlib
import json
import random
import re

import pytest
from typer.testing import CliRunner

from conftest import FAST
from mixrl.cli.main import app
from mixrl.models import tiny_data
from mixrl.models.supervised import _epochs

# a task of its own: upper-case a word ("up: qé" -> "QÉ", so a two-byte character is in the data)
WORDS = [a + b + ("é" if i % 7 == 0 else "") for i, (a, b) in enumerate((a, b) for a in "qwxyz" for b in "kmnpqrst")]


def _write(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture()
def data(tmp_path):
    return _write(tmp_path / "up.jsonl", [{"prompt": f"up: {w}", "answer": w.upper()} for w in WORDS])


def _build(data, cache, *extra):
    res = CliRunner().invoke(app, ["model", "build-tiny", f"data.source={data}", "--steps", "2", "--quiet", *extra],
                             env={"MIXRL_CACHE": str(cache)})
    return res, res.output


def test_examples_take_the_expert_then_the_answer_then_the_prompt():
    rows = [{"prompt": "a", "answer": "1", "expert": ["x"]}, {"prompt": "b", "answer": "2", "expert": ["y"]}]
    assert tiny_data.examples_from_rows(rows)[1:] == (["x", "y"], "expert")
    rows = [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2", "expert": ["y"]}]
    assert tiny_data.examples_from_rows(rows)[1:] == (["1", "2"], "answer")
    problems, completions, target = tiny_data.examples_from_rows([{"prompt": "ab"}, {"prompt": "cd", "answer": ""}])
    assert (problems, completions, target) == ([{"prompt": ""}, {"prompt": ""}], ["ab", "cd"], "prompt")


def test_epochs_visit_every_row_once_per_epoch():
    problems, completions = _epochs(([{"prompt": str(i)} for i in range(5)], list("abcde")), 12, seed=0)
    first, second = completions[:5], completions[5:10]
    assert sorted(first) == sorted(second) == list("abcde") and first != second  # two shuffled epochs
    assert [p["prompt"] for p in problems] == [str("abcde".index(c)) for c in completions]  # pairs kept


def test_build_on_data_excludes_heldout_covers_the_data_and_trains(data, tmp_path):
    cache = tmp_path / "cache"
    res, text = _build(data, cache, "trainer.eval_size=8")
    assert res.exit_code == 0, text
    path = re.search(r"model\.path=(\S+)", text).group(1)
    assert f"next: mixrl train model.path={path} data.source={data} trainer.eval_size=8" in text
    meta = json.loads((tiny_data.Path(path) / "mixrl_tiny.json").read_text())
    # held-out rows by the rule of mixrl.evaluation.heldout, recomputed here: shuffle seed 0, first min(8, 20%)
    order = list(range(len(WORDS)))
    random.Random(0).shuffle(order)
    held = set(order[:8])
    train = [[f"up: {w}", w.upper()] for i, w in enumerate(WORDS) if i not in held]
    assert meta["data"]["rows"] == len(WORDS) - 8 and meta["data"]["target"] == "answer"
    assert meta["data"]["sha256"] == hashlib.sha256(json.dumps(train).encode()).hexdigest()
    assert meta["warm_start"]["steps"] == 2

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    for prompt, answer in train:  # every character of the training rows encodes and decodes back exactly
        assert tok.decode(tok(prompt + answer, add_special_tokens=False)["input_ids"]) == prompt + answer

    again, text2 = _build(data, cache, "trainer.eval_size=8")
    assert again.exit_code == 0 and "(cached; --force rebuilds)" in text2 and path in text2

    run_dir = tmp_path / "run"
    res = CliRunner().invoke(app, ["train", *FAST, "trainer.max_steps=1", f"model.path={path}", f"data.source={data}",
                                   f"run_dir={run_dir}"])
    assert res.exit_code == 0, res.output
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 1


@pytest.mark.parametrize("case", ["no-such-dir", "missing-column"])
def test_bad_data_is_one_line_exit_2_and_nothing_created(case, data, tmp_path):
    cache = tmp_path / "cache"
    if case == "no-such-dir":
        res, text = _build(tmp_path / "nope", cache)
    else:
        res, text = _build(data, cache, "data.prompt_column=question")
    assert res.exit_code == 2, text
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), text
    assert ("question" in text) if case == "missing-column" else ("nope" in text)
    assert not cache.exists()


def test_exact_match_accuracy_is_the_share_of_rows_whose_every_target_token_is_the_argmax():
    """Formula: acc = (1/N) sum_i 1[argmax p(. | x_i, y_i,<t) = y_i,t for every target token t],
    computed here by hand on a model whose logits are fixed per position."""
    import torch

    class Tok:  # ids: a=1, b=2; pad 0, eos 9
        pad_token_id, eos_token_id = 0, 9

        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": ([8] if add_special_tokens else []) + [{"a": 1, "b": 2}[c] for c in text]}

    class Model(torch.nn.Module):  # predicts, at every position, the token "a" (1) then eos (9): "a" is right, "b" is not
        def forward(self, input_ids, attention_mask):
            logits = torch.zeros(*input_ids.shape, 10)
            logits[:, :, 1] = 1.0
            logits[:, 1:, 1] = 0.0
            logits[:, 1:, 9] = 1.0
            return type("Out", (), {"logits": logits})()

    # prompt "<s>" (empty prompt), targets: "a" (a, eos: both argmax) and "b" (b is not): 1 of 2 right
    problems, completions = [{"prompt": ""}, {"prompt": ""}], ["a", "b"]
    assert tiny_data.exact_match_accuracy(Model(), Tok(), problems, completions) == 0.5
    assert tiny_data.exact_match_accuracy(Model(), Tok(), problems[:1], completions[:1]) == 1.0


def test_the_warm_start_stops_when_stop_says_so():
    import torch

    from mixrl.models.supervised import train_supervised
    from mixrl.models.tiny_arch import build_model, build_tokenizer

    tok = build_tokenizer("ab")
    torch.manual_seed(0)
    model = build_model(tok, max_new_tokens=4, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16)
    seen = []
    losses = train_supervised(model, tok, steps=50, batch_size=2, lr=1e-3, warmup_steps=1, weight_decay=0.0, levels=(),
                              seed=0, progress=False, examples=([{"prompt": "a"}, {"prompt": "b"}], ["b", "a"]),
                              stop=lambda m, step: seen.append(step) or step == 3)
    assert len(losses) == 3 and seen == [1, 2, 3]


def test_build_on_data_states_the_target_accuracy_and_the_steps_it_ran(data, tmp_path):
    res, text = _build(data, tmp_path / "cache", "--target-accuracy", "1")
    assert res.exit_code == 0, text
    assert re.search(r"2 of at most 2 steps on \d+ rows \(answer\), every step run; training accuracy \d\.\d{3} "
                     r"\(exact, greedy, on \d+ training rows\)", text), text
    bad = CliRunner().invoke(app, ["model", "build-tiny", "--target-accuracy", "0.5", "--quiet"])
    assert bad.exit_code == 2 and "--target-accuracy applies to a warm start on your data" in bad.output
