"""Every error before training: one line on stderr, exit 2, no traceback, no model loaded.

Config and machine checks run with every model loader replaced by a function that fails
the test; data-load checks (they need the tokenizer) run the real ``mixrl train`` with the
trainer constructor replaced the same way.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import ModelLoaded, fail_model_loading
from mixrl.cli.main import app

runner = CliRunner()


@pytest.fixture
def no_model(monkeypatch):
    import transformers

    import mixrl.trainer.run as run

    monkeypatch.setattr(run, "train_stages", fail_model_loading)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fail_model_loading)


@pytest.fixture
def no_trainer(monkeypatch):
    import transformers

    from mixrl.trainer.grpo import MixrlGRPOTrainer

    monkeypatch.setattr(MixrlGRPOTrainer, "__init__", fail_model_loading)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fail_model_loading)


def one_line_error(args: list[str]) -> str:
    res = runner.invoke(app, args)
    assert not isinstance(res.exception, ModelLoaded), str(res.exception)
    assert res.exit_code == 2, f"exit {res.exit_code} ({res.exception!r}); output: {res.output[-2000:]}"
    assert "Traceback" not in res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], lines
    return errors[0]


# --------------------------------------------------------------------------- config values and machine
@pytest.mark.parametrize("override, words", [
    ("trainer.temperature=0", ["trainer.temperature=0", "must be > 0"]),
    ("trainer.temperature=-1", ["trainer.temperature=-1", "must be > 0"]),
    ("trainer.max_completion_length=0", ["trainer.max_completion_length=0", "positive"]),
    ("data.limit=0", ["data.limit=0", "no rows"]),
    ("data.limit=-5", ["data.limit=-5", "no rows"]),
])
def test_bad_values_are_one_line(no_model, override, words):
    line = one_line_error(["train", override])
    assert all(w in line for w in words), line


def test_gpu_hardware_without_cuda(no_model):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    line = one_line_error(["train", "hardware=gpu-1x80g"])
    assert "needs a CUDA GPU" in line and "hardware=cpu" in line


@pytest.mark.parametrize("logger, package", [("wandb", "wandb"), ("tensorboard", "tensorboard")])
def test_logger_without_its_package_names_the_extra(no_model, monkeypatch, logger, package):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a))  # as if not installed
    line = one_line_error(["train", f"logger={logger}"])
    assert f"pip install 'mixrl[{package}]'" in line


def test_logger_extras_exist_in_pyproject():
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert 'wandb = ["wandb"]' in text and 'tensorboard = ["tensorboard"]' in text


def test_unwritable_run_dir(no_model, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    line = one_line_error(["train", f"run_dir={blocker}/run"])
    assert "cannot be written" in line and "writable run_dir" in line
    assert blocker.read_text() == "x"  # nothing lost


# --------------------------------------------------------------------------- at data load
def _data(tmp_path: Path, rows: list[dict]) -> str:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _train(fast_overrides, *extra):
    return ["train", *fast_overrides, "trainer.eval_size=0", "data.expert_column=null", *extra]


def test_characters_a_character_model_cannot_encode(no_trainer, tiny_model_path, fast_overrides, tmp_path):
    # a character-level model that is not a mixrl tiny model folder (no mixrl_tiny.json, e.g. a run's
    # model/) cannot be extended: one line naming the characters and builtin:tiny (which extends itself)
    import shutil

    model = shutil.copytree(tiny_model_path, tmp_path / "charmodel", ignore=shutil.ignore_patterns("mixrl_tiny.json"))
    src = _data(tmp_path, [{"prompt": "sort: 3 1 2", "answer": "1 2 3"}] * 4)
    line = one_line_error(_train(fast_overrides, f"data.source={src}", f"model.path={model}"))
    assert "5 character(s) the tokenizer cannot encode" in line and "':orst'" in line
    assert "model.path=builtin:tiny" in line and "extends its vocabulary" in line


def test_prompt_answer_data_needs_no_expert_column_unless_the_algo_reads_expert_rows(no_trainer, fast_overrides, tmp_path):
    src = _data(tmp_path, [{"prompt": "1+1=", "answer": "2"}] * 4)
    # GRPO (the default algo, data=arith configures expert_column=solution): the data loads and the
    # run gets as far as building the trainer
    res = runner.invoke(app, ["train", *fast_overrides, "trainer.eval_size=0", f"data.source={src}"])
    assert isinstance(res.exception, ModelLoaded), res.output[-2000:]
    # LUFFY trains on expert completions: the missing column is one line
    line = one_line_error(["train", *fast_overrides, "trainer.eval_size=0", f"data.source={src}", "algo=luffy"])
    assert "column 'solution' not found" in line and "set data.expert_column" in line and "algo=grpo" in line


@pytest.mark.parametrize("how", ["system_prompt", "messages"])
def test_chat_prompts_with_a_model_without_chat_template(no_trainer, fast_overrides, tmp_path, how):
    if how == "system_prompt":  # a system prompt turns every prompt into chat messages
        src = _data(tmp_path, [{"prompt": "1+1=", "answer": "2"}] * 4)
        extra = ["data.system_prompt=Add the numbers."]
    else:  # the prompt column holds message lists
        src = _data(tmp_path, [{"prompt": [{"role": "user", "content": "1+1="}], "answer": "2"}] * 4)
        extra = []
    line = one_line_error(_train(fast_overrides, f"data.source={src}", *extra))
    assert "row 0: the prompts are chat messages" in line and "has no chat template" in line
    assert ("data.system_prompt is set" if how == "system_prompt" else "column 'prompt' holds chat messages") in line
    assert "data.system_prompt=null" in line


def test_empty_data_file(no_trainer, fast_overrides, tmp_path):
    src = tmp_path / "empty.jsonl"
    src.write_text("")
    line = one_line_error(_train(fast_overrides, f"data.source={src}"))
    assert f"data file {src} is empty" in line


def test_prompt_longer_than_the_model_context(no_trainer, fast_overrides, tmp_path):
    src = _data(tmp_path, [{"prompt": "1+1=", "answer": "2"}, {"prompt": "1+" * 30 + "1=", "answer": "31"}])
    line = one_line_error(_train(fast_overrides, f"data.source={src}"))
    assert "training row 1" in line and "context of 64 tokens" in line and "max_completion_length=24" in line


REWARDS = '''
def raises(prompts, completions, answer, **kw):
    return [float(len(c) / (len(c) - 4)) for c in completions]

def wrong_type(prompts, completions, **kw):
    return ["yes" for _ in completions]

def scalar(prompts, completions, **kw):
    return 1.0
'''


@pytest.mark.parametrize("fn, words", [
    ("raises", ["raises", "ZeroDivisionError", "on row 0"]),
    ("wrong_type", ["wrong_type", "returned str 'yes' on row 0", "float"]),
    ("scalar", ["scalar", "returned float, not a list"]),
])
def test_reward_that_raises_or_returns_the_wrong_type(no_trainer, fast_overrides, tmp_path, fn, words):
    rewards = tmp_path / "rewards.py"
    rewards.write_text(REWARDS)
    src = _data(tmp_path, [{"prompt": "1+2=", "answer": "3333"}, {"prompt": "2+2=", "answer": "4"}])
    line = one_line_error(_train(fast_overrides, f"data.source={src}", f"reward.name={rewards}:{fn}"))
    assert all(w in line for w in words), line
    assert "before training" in line


# --------------------------------------------------------------------------- sources, sampler, templates: before the run directory
def _nothing_created(run_dir: Path) -> None:
    """No run directory at all: no config.yaml, no FAILED, no lock."""
    assert not run_dir.exists(), sorted(p.name for p in run_dir.iterdir())


def _pairs(tmp_path, rows, name="pairs.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize("case, words", [
    ("arms", ["sampler.arms_column=nosuch is not a column of the training data", "set sampler.arms_column"]),
    ("missing", ["data file not found", "missing.jsonl", "offpolicy.source.dataset"]),
    ("no_rejected", ["column 'rejected' not found", "offpolicy.source.rejected_column"]),
    ("chosen_empty", ["no preference pair in", "every row lacks a chosen or a rejected completion"]),
    ("chosen_number", ["row 0 of", "'chosen' holds an int", "offpolicy.source.chosen_column"]),
    ("rejected_numbers", ["row 0 of", "'rejected' holds a list with an int", "offpolicy.source.rejected_column"]),
    ("all_equal", ["no preference pair in", "chosen and rejected completions are the same text", "zero margins"]),
    ("template", ["algo.inject.template='{prompt}{hint} {answer}' has an unknown placeholder {answer}", "{prompt}, {hint}"]),
    ("length", ["sampler.length=", "reaches 64 tokens", "trainer.max_completion_length=24", "set trainer.max_completion_length=64"]),
])
def test_data_checks_of_sources_sampler_and_templates_leave_nothing_behind(no_trainer, fast_overrides, tmp_path, case, words):
    """What the config and the data can refuse is refused before the run directory exists: the
    sampler's columns, a pairs file (missing, a column missing, every chosen empty, cells of another
    type, only zero-margin pairs), a template's placeholders, a length schedule above the cap."""
    ok = {"prompt": "1+1=", "chosen": "2", "rejected": "3"}
    pairs = lambda rows: _pairs(tmp_path, rows, f"{case}.jsonl")  # noqa: E731 - only this case's file is written
    extra = {
        "arms": lambda: ["sampler=curriculum", "sampler.arms_column=nosuch"],
        "missing": lambda: ["algo=hypo", f"offpolicy.source.dataset={tmp_path / 'missing.jsonl'}"],
        "no_rejected": lambda: ["algo=hypo", f"offpolicy.source.dataset={pairs([{'prompt': '1+1=', 'chosen': '2'}])}"],
        "chosen_empty": lambda: ["algo=hypo", f"offpolicy.source.dataset={pairs([{**ok, 'chosen': ''}, {**ok, 'chosen': ' '}])}"],
        "chosen_number": lambda: ["algo=hypo", f"offpolicy.source.dataset={pairs([{**ok, 'chosen': 5}])}"],
        "rejected_numbers": lambda: ["algo=hypo", f"offpolicy.source.dataset={pairs([{**ok, 'rejected': [1, 2]}])}"],
        "all_equal": lambda: ["algo=hypo", f"offpolicy.source.dataset={pairs([{**ok, 'rejected': '2'}])}"],
        "template": lambda: ["algo=guide", "algo.inject.template='{prompt}{hint} {answer}'"],
        "length": lambda: ["sampler=curriculum", "sampler.length={name: linear, start: 8, end: 64, steps: 2}"],
    }
    line = one_line_error(["train", *fast_overrides, "trainer.eval_size=0", *extra[case]()])
    assert all(w in line for w in words), line
    _nothing_created(tmp_path / "run")


def test_characters_of_a_pairs_file_are_checked_like_the_training_rows(no_trainer, tiny_model_path, fast_overrides, tmp_path):
    # a character model that cannot learn new characters: the pairs file's 'ü' is named with the file
    import shutil

    model = shutil.copytree(tiny_model_path, tmp_path / "charmodel", ignore=shutil.ignore_patterns("mixrl_tiny.json"))
    pairs = _pairs(tmp_path, [{"prompt": "1+1=", "chosen": "2", "rejected": "3 ü"}])
    line = one_line_error(["train", *fast_overrides, "trainer.eval_size=0", f"model.path={model}", "algo=hypo",
                           f"offpolicy.source.dataset={pairs}"])
    assert f"offpolicy.source.dataset={pairs} has 1 character(s) the tokenizer cannot encode" in line and "'ü'" in line
    _nothing_created(tmp_path / "run")
