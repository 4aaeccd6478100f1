"""The tiny model covers the characters of a user's own task: its vocabulary is extended
with the characters the data needs (a cached copy; the warm-started model is untouched)."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from conftest import FAST
from mixrl.cli.main import app
from mixrl.models import tiny_spec, tiny_vocab


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def base(tiny_model_path, tmp_path) -> Path:
    """A private copy of the test tiny model (extensions are written next to it)."""
    return Path(shutil.copytree(tiny_model_path, tmp_path / "cache" / Path(tiny_model_path).name))


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_missing_characters_are_found_per_byte(base):
    tok = AutoTokenizer.from_pretrained(base)
    assert tiny_vocab.missing_characters(tok, ["1+2=3", "#### 3"]) == []
    assert tiny_vocab.missing_characters(tok, ["sort: 312", "café"]) == [":", "a", "c", "f", "o", "r", "s", "t", "é"]
    extended = tiny_vocab.extend_tokenizer(tok, [":", "é"])
    assert len(extended) == len(tok) + 3  # ':' and the two bytes of 'é'
    assert tiny_vocab.missing_characters(extended, ["é:1"]) == []


def test_extend_keeps_old_ids_and_weights_and_leaves_the_base_alone(base):
    before = _digests(base)
    old_tok = AutoTokenizer.from_pretrained(base)
    path = tiny_vocab.extend(base, [":", "s", "é"])
    assert path != base and path.parent == base.parent and tiny_spec.is_complete(path)
    assert _digests(base) == before  # the warm-started model is not modified

    tok = AutoTokenizer.from_pretrained(path)
    for text in ("s: 312", "é:1+2=3", "1+2=3 #### 3"):
        ids = tok(text)["input_ids"]
        assert tok.decode(ids, skip_special_tokens=True) == text
    vocab = tok.get_vocab()
    assert {k: vocab[k] for k in old_tok.get_vocab()} == old_tok.get_vocab()  # old ids keep their meaning

    old = AutoModelForCausalLM.from_pretrained(base).get_input_embeddings().weight
    model = AutoModelForCausalLM.from_pretrained(path)
    emb = model.get_input_embeddings().weight
    assert emb.shape == (len(tok), old.shape[1]) and model.config.vocab_size == len(tok)
    assert torch.equal(emb[: len(old_tok)], old)
    new = emb[len(old_tok):]
    assert torch.cdist(new, new).add(torch.eye(len(new)) * 1e9).min() > 1e-3  # distinct rows, not one mean vector
    assert abs(new.norm(dim=1).mean() / old.norm(dim=1).mean() - 1) < 0.5  # typical size, not an outlier
    assert model.get_output_embeddings().weight.data_ptr() == emb.data_ptr()  # still tied

    meta = json.loads((path / "mixrl_tiny.json").read_text())
    assert meta["added_characters"] == ":sé" and meta["extends"] == str(base.resolve())
    # cached: the same characters give the same folder without a rebuild; others another folder
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert tiny_vocab.extend(base, ["s", ":", "é"]) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert tiny_vocab.extend(base, [":"]) != path
    assert tiny_vocab.extend(base, ["1", "+"]) == base  # nothing missing: the model itself


def test_extend_is_deterministic(base, tmp_path):
    other = Path(shutil.copytree(base, tmp_path / "elsewhere" / base.name))
    a = AutoModelForCausalLM.from_pretrained(tiny_vocab.extend(base, [":"])).get_input_embeddings().weight
    b = AutoModelForCausalLM.from_pretrained(tiny_vocab.extend(other, [":"])).get_input_embeddings().weight
    assert torch.equal(a, b)


def _sort_task(path: Path, n: int = 40) -> str:
    rng = random.Random(0)
    with path.open("w") as f:
        for _ in range(n):
            digits = "".join(rng.choice("0123456789") for _ in range(3))
            f.write(json.dumps({"prompt": f"sort: {digits}", "answer": "".join(sorted(digits))}) + "\n")
    return str(path)


def test_digit_sorting_task_trains_and_keeps_the_colon(base, tmp_path):
    src = _sort_task(tmp_path / "sort.jsonl")
    run_dir = tmp_path / "run"
    res = CliRunner().invoke(app, ["train", *FAST, f"model.path={base}", f"run_dir={run_dir}", f"data.source={src}"])  # GRPO: no data.expert_column=null needed
    assert res.exit_code == 0, res.output[-3000:]
    assert "added the data's 5 new character(s) ':orst'" in res.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2
    tok = AutoTokenizer.from_pretrained(run_dir / "model")
    ids = tok("sort: 312")["input_ids"]
    assert len(ids) == 1 + len("sort: 312")  # bos + one id per character: nothing dropped
    assert tok.decode(ids, skip_special_tokens=True) == "sort: 312"
    assert AutoModelForCausalLM.from_pretrained(run_dir / "model").config.vocab_size == len(tok)


def test_the_tiny_model_learns_the_characters_of_a_pairs_file_and_a_hint_template(base, tmp_path):
    """Every text the run tokenizes counts, not only the training rows: a pairs file's completions
    and a hint template's literal text extend the tiny model's vocabulary before training."""
    from rich.console import Console

    from mixrl.config.compose import compose_config
    from mixrl.trainer.build import prepare_inputs

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": "1+1=", "chosen": "2", "rejected": "3 ü"}) + "\n")
    cfg = compose_config([*FAST, f"model.path={base}", f"run_dir={tmp_path / 'run'}", "algo=hypo",
                          f"offpolicy.source.dataset={pairs}", "logger.progress=false"])
    inputs = prepare_inputs(cfg, Console(quiet=True))
    assert tiny_vocab.missing_characters(inputs.tokenizer, ["ü"]) == [] and inputs.model_path != str(base)
    assert not (tmp_path / "run").exists()
    guide = compose_config([*FAST, f"model.path={base}", f"run_dir={tmp_path / 'run'}", "algo=guide",
                            "algo.inject.template='{prompt} Hint§ {hint}'", "logger.progress=false"])
    tok = prepare_inputs(guide, Console(quiet=True)).tokenizer
    assert tiny_vocab.missing_characters(tok, ["Hint§"]) == []
