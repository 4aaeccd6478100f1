"""The BPE chat model (``model=tiny-bpe``): tokenizer, chat template, cached warm start, selection."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from rich.console import Console
from transformers import AutoModelForCausalLM, AutoTokenizer

from mixrl.config.compose import compose_config
from mixrl.models import supervised, tiny_bpe, tiny_spec
from mixrl.tasks import arith


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def saved(tiny_bpe_model_path):
    """``(path, tokenizer reloaded with AutoTokenizer)`` of the session's warm-started BPE model."""
    return Path(tiny_bpe_model_path), AutoTokenizer.from_pretrained(tiny_bpe_model_path)


@pytest.fixture(scope="module")
def fresh():
    """The tokenizer as :func:`tiny_bpe.build` makes it (merges learned again, ~2 s)."""
    return tiny_bpe.build_tokenizer(tiny_bpe.training_texts(**tiny_bpe.CORPUS))


def test_tokenizer_reloads_identically(saved, fresh):
    path, tok = saved
    assert type(tok).__name__ == "Qwen2Tokenizer"
    assert tok.get_vocab() == fresh.get_vocab()
    assert tok.chat_template == tiny_bpe.CHAT_TEMPLATE
    assert (tok.pad_token, tok.eos_token, tok.bos_token) == ("<|endoftext|>", "<|im_end|>", None)
    assert json.loads((path / "config.json").read_text())["model_type"] == "qwen2"
    for p in arith.generate(200, seed=1, levels=arith.LEVELS, split="all"):
        text = tiny_bpe.chat_text(p["prompt"], p["solution"])
        assert tok(text, add_special_tokens=False)["input_ids"] == fresh(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(tok(text)["input_ids"]) == text  # no bos, nothing lost


def test_load_tokenizer_pads_left_and_templates_like_chat_text(saved):
    from mixrl.trainer.build import load_tokenizer

    path, _ = saved
    tok = load_tokenizer(str(path), compose_config([f"model.path={path}"]))
    assert tok.padding_side == "left" and tok.pad_token == "<|endoftext|>"
    p = arith.make_problem([3, 9, 8])
    # what TRL does with a conversational prompt = what the warm start trained on
    templ = tok.apply_chat_template(tiny_bpe.chat_messages(p["prompt"]), add_generation_prompt=True, tokenize=True)
    ids = templ["input_ids"] if isinstance(templ, dict) or hasattr(templ, "keys") else templ
    assert ids == tiny_bpe.encode_chat(tok, p, p["solution"])[0]
    assert tok.decode(ids) == tiny_bpe.chat_text(p["prompt"])
    # without a system message the template inserts the model's own
    assert tok.apply_chat_template([{"role": "user", "content": p["prompt"]}], add_generation_prompt=True,
                                   tokenize=False) == tiny_bpe.chat_text(p["prompt"])


def test_tokens_span_several_characters(saved):
    """What the character model hides: one token covers several characters, so a character cut
    is not a token boundary, and text joined at a cut re-tokenizes otherwise than its parts."""
    _, tok = saved
    p = arith.make_problem([4, 6, 7])  # solution "10 17 #### 17"
    prompt_ids, completion_ids = tiny_bpe.encode_chat(tok, p, p["solution"])
    pieces = tok.convert_ids_to_tokens(completion_ids)
    assert "\u0120####" in pieces and pieces[-1] == "<|im_end|>"  # " ####" is one token
    assert max(len(tok.convert_tokens_to_string([t])) for t in pieces) >= 5
    assert max(len(tok.convert_tokens_to_string([t])) for t in tok.convert_ids_to_tokens(prompt_ids)) >= 6  # "assistant"
    cut = p["solution"].index("####") + 2  # inside " ####"
    head, tail = p["solution"][:cut], p["solution"][cut:]
    parts = tok(head, add_special_tokens=False)["input_ids"] + tok(tail, add_special_tokens=False)["input_ids"]
    assert parts != tok(p["solution"], add_special_tokens=False)["input_ids"]
    assert tok.decode(parts) == p["solution"]
    longest = max(len(tiny_bpe.encode_chat(tok, q, q["solution"])[0])
                  for q in arith.generate(300, seed=0, levels=arith.LEVELS, split="all"))
    assert longest <= tiny_bpe.MAX_PROMPT_TOKENS
    assert longest + tiny_bpe.MAX_COMPLETION_TOKENS <= tiny_bpe.MODEL_SIZE["max_position_embeddings"]


def test_warm_start_is_deterministic_and_cached_apart(saved, tmp_path):
    path, _ = saved
    again = tiny_bpe.warm_start(tmp_path, steps=10, progress=False)
    assert again.name == path.name and again != path
    a = AutoModelForCausalLM.from_pretrained(path).state_dict()
    b = AutoModelForCausalLM.from_pretrained(again).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert tiny_bpe.warm_start(tmp_path, steps=10, progress=False) == again  # cached: no retraining
    meta = json.loads((again / "mixrl_tiny_bpe.json").read_text())
    assert meta["warm_start"]["steps"] == 10 and meta["vocab"] == len(AutoTokenizer.from_pretrained(again))
    assert not (again / tiny_spec._META_FILE).exists()  # the character model's vocabulary extension never touches it
    assert tiny_bpe.is_tiny_bpe(again) and not tiny_bpe.is_tiny_bpe(tiny_spec.default_path(tmp_path))
    assert tiny_bpe.cache_key(10) != tiny_bpe.cache_key() and tiny_bpe.default_path().parent.name == "tiny-bpe"
    model = AutoModelForCausalLM.from_pretrained(again)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    tok = AutoTokenizer.from_pretrained(again)
    assert model.config.vocab_size == meta["vocab"] == len(tok)
    assert model.generation_config.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>") == tok.eos_token_id
    assert model.generation_config.pad_token_id == tok.pad_token_id and model.generation_config.bos_token_id is None


def test_warm_start_trains_on_completion_tokens_only(saved):
    """Labels cover ``completion <|im_end|>`` exactly; the chat prompt is masked."""
    _, tok = saved
    problems = arith.train_split(4, seed=0, levels=arith.EASY_LEVELS)
    ids, mask, lab = supervised._batch(tok, problems, None, tiny_bpe.encode_chat)
    for i, p in enumerate(problems):
        want = tok(p["solution"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        got = lab[i][lab[i] != -100].tolist()
        assert got == want
        prompt_len = len(tiny_bpe.encode_chat(tok, p, p["solution"])[0])
        assert (lab[i, :prompt_len] == -100).all() and ids[i, prompt_len:prompt_len + len(want)].tolist() == want


def test_model_selection(tiny_bpe_model_path, monkeypatch):
    from mixrl.errors import ConfigError
    from mixrl.trainer import build

    cfg = compose_config(["model=tiny-bpe"])
    assert (cfg.model.name, cfg.model.path, cfg.data.system_prompt) == ("tiny-bpe", "builtin:tiny-bpe", None)
    monkeypatch.setattr(tiny_bpe, "warm_start", lambda **kw: Path(tiny_bpe_model_path))
    assert build.resolve_model_path(cfg) == tiny_bpe_model_path
    with pytest.raises(ConfigError, match="builtin:tiny-bpe"):
        build.resolve_model_path(compose_config(["model.path=builtin:nope"]))


@pytest.mark.parametrize("how", ["builtin", "folder", "char", "plain"])
def test_builtin_task_gives_chat_prompts_to_the_bpe_model(how, tiny_bpe_model_path):
    from mixrl.trainer import build

    overrides = {"builtin": ["model=tiny-bpe"], "folder": [f"model.path={tiny_bpe_model_path}"], "char": [],
                 "plain": ["model=tiny-bpe", "data.system_prompt="]}[how]
    cfg = compose_config([*overrides, "data.train_size=8", "trainer.eval_size=4"])
    train, heldout = build.load_train_rows(cfg), build.load_eval_rows(cfg)
    for prompt, problem in ((train[0]["prompt"], arith.train_split(8, seed=0)[0]),
                            (heldout[0]["prompt"], arith.heldout_split(4)[0])):
        if how in ("builtin", "folder"):
            assert prompt == tiny_bpe.chat_messages(problem["prompt"])
        else:
            assert prompt == problem["prompt"]


def test_plan_knows_the_bpe_model(fresh):
    from mixrl import plan

    cfg = compose_config(["model=tiny-bpe"])
    shape = plan.model_shape(cfg)
    assert shape is not None and shape.hidden == tiny_bpe.MODEL_SIZE["hidden_size"]
    assert plan.default_prompt_tokens(cfg) == tiny_bpe.MAX_PROMPT_TOKENS
    # the table's entry is what the build makes (vocabulary and context included)
    known = plan.KNOWN_MODELS["builtin:tiny-bpe"]
    assert known["vocab_size"] == len(fresh)
    assert known["max_position_embeddings"] == tiny_bpe.MODEL_SIZE["max_position_embeddings"]


FLIP_REWARD = """
def flip_reward(prompts, completions, trainer_state=None, **kwargs):
    step = trainer_state.global_step if trainer_state is not None else 0
    return [float(step % 2 == 0) for _ in completions]
"""


def _flip_reward(tmp_path: Path) -> str:
    """Every rollout of step 0 solves, none of step 1: each group of step 1 is uniform, and its
    prompt's stored rollouts differ in reward, so replay refills it on any model (the test model
    solves nothing of its own)."""
    path = tmp_path / "flip_reward.py"
    path.write_text(FLIP_REWARD)
    return f"reward.name={path}:flip_reward"


#: one method of each family: extra overrides, and the metrics (of the last step) that show its mechanism ran
FAMILIES = {
    "grpo": ([], []),
    "chord": ([], ["expert/rows", "loss/sft"]),                 # expert rows
    "luffy": ([], ["expert/rows", "expert/token_prob"]),        # expert rows in the GRPO group (in-group injection)
    "prefix_rft": ([], ["prefix/rows", "prefix/mean_tokens"]),  # demonstration prefixes
    "guide": ([], ["hinted/rows"]),                             # hints in the prompt
    "repo_replay": (["FLIP"], ["replay/rows"]),                 # past rollouts refill uniform groups
    "opd": (["teacher=model"], ["teacher/scored_tokens"]),      # teacher: the same BPE model (set below)
}


@pytest.mark.parametrize("algo", list(FAMILIES))
def test_every_family_trains_two_steps_on_chat_prompts(algo, tiny_bpe_model_path, tmp_path):
    """``mixrl train`` with the BPE model on chat-formatted built-in prompts, 2 steps per family (~2 s each)."""
    from conftest import FAST

    from mixrl.trainer.run import train

    extra, active = FAMILIES[algo]
    extra = [_flip_reward(tmp_path) if e == "FLIP" else e for e in extra]
    if algo == "opd":
        extra.append(f"teacher.source.models=[{tiny_bpe_model_path}]")
    cfg = compose_config([f"algo={algo}", *FAST, f"model.path={tiny_bpe_model_path}", f"run_dir={tmp_path / 'run'}",
                          "trainer.eval_size=0", *extra])
    result = train(cfg)
    assert result.summary["steps"] == 2
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(rows) == 2 and all(math.isfinite(r["loss"]) for r in rows)
    for key in active:
        assert rows[-1].get(key, 0) > 0, (key, {k: v for k, v in rows[-1].items() if "/" in k})
    if algo == "opd":
        # The teacher is a copy of the student's starting weights. Step 1: the same weights score the same
        # tokens, so the k2 loss (half the squared log-prob difference) is zero within float error: the
        # two forwards differ only in batching (|difference| < 1e-5 gives < 5e-11; measured 3e-15 avx2,
        # 7e-15 default, 1.3e-14 avx512). Its gradient is that float noise, which Adam's first step turns
        # into an update of up to the learning rate per weight, so at step 2 the student is one such
        # update away from the teacher: a loss that float noise decides (measured 9.5e-7 avx2, 1.8e-6
        # default, 3.4e-6 avx512), bounded here by 20 x the learning rate (1e-3, 290x the largest).
        first, second = rows[0]["loss/distill"], rows[1]["loss/distill"]
        assert abs(first) < 1e-10, first
        assert second >= 0, second  # not kernel-bound: a mean of squares, never negative in float arithmetic
        assert second < 20 * rows[0]["learning_rate"], second
    assert tiny_bpe.is_tiny_bpe(result.run_dir / "model")  # a later stage or `mixrl eval` gives it chat prompts too
    saved_tok = AutoTokenizer.from_pretrained(result.run_dir / "model")
    assert saved_tok.chat_template == tiny_bpe.CHAT_TEMPLATE
    assert saved_tok.get_vocab() == AutoTokenizer.from_pretrained(tiny_bpe_model_path).get_vocab()


def test_character_model_machinery_leaves_it_alone(saved, tiny_model_path):
    """No vocabulary extension, no unencodable characters (byte-level), and a teacher with the
    character tokenizer (``teacher=tiny``) refused in one line."""
    from mixrl.config.checks import unencodable_characters
    from mixrl.errors import ConfigError
    from mixrl.sources.teacher import TeacherSource
    from mixrl.trainer import build

    path, tok = saved
    texts = ["sort: 3,1,2 -> 1,2,3", "héllo wörld ✓"]
    assert build.tiny_missing_characters(compose_config([f"model.path={path}"]), str(path), tok, texts) == []
    assert unencodable_characters(tok, texts) == []
    teacher = TeacherSource(models=[tiny_model_path])
    teacher.paths = [tiny_model_path]
    with pytest.raises(ConfigError, match="another tokenizer than the student"):
        teacher.check_tokenizer(tok)
    same = TeacherSource(models=[str(path)])
    same.paths = [str(path)]
    same.check_tokenizer(tok)  # the BPE model as its own teacher passes


def test_mixrl_eval_gives_a_bpe_folder_chat_prompts(tiny_bpe_model_path, monkeypatch):
    """`mixrl eval FOLDER` with no run config next to it: the folder is the BPE model, so chat prompts."""
    from mixrl.trainer import saved_eval

    seen = []

    def fake_eval(model, tokenizer, rows, *a, **k):
        seen.extend(r["prompt"] for r in rows)
        return {"accuracy": 0.0}

    monkeypatch.setattr(saved_eval, "evaluate_accuracy", fake_eval)
    cfg, saved = saved_eval.eval_config(tiny_bpe_model_path, ["trainer.eval_size=4", "hardware.torch_threads=1"])
    assert saved is None and cfg.model.path == "builtin:tiny"
    saved_eval.evaluate_saved_model(tiny_bpe_model_path, cfg)
    assert seen == [tiny_bpe.chat_messages(p["prompt"]) for p in arith.heldout_split(4)]


def test_build_commands(tiny_bpe_model_path, monkeypatch, capsys):
    """`python -m mixrl.models.tiny_bpe` reuses a cached build; `mixrl model build-tiny --bpe` builds this model."""
    from typer.testing import CliRunner

    from mixrl.cli.main import app

    path = Path(tiny_bpe_model_path)
    assert tiny_bpe.main(["--cache-dir", str(path.parent), "--steps", "10", "--no-progress"]) == 0
    assert capsys.readouterr().out.strip() == str(path)
    calls = []
    monkeypatch.setattr(tiny_bpe, "warm_start", lambda **kw: calls.append(kw) or path)
    res = CliRunner().invoke(app, ["model", "build-tiny", "--bpe"])
    assert res.exit_code == 0 and calls == [{"force": False, "progress": True}]
    assert "tiny BPE model" in res.stdout


def test_a_builtin_model_can_be_named_as_a_teacher(tiny_bpe_model_path, monkeypatch):
    """teacher.source.models=[builtin:tiny-bpe] resolves to the built BPE model; an unknown built-in name is one line."""
    from mixrl.errors import ConfigError
    from mixrl.models import tiny_bpe
    from mixrl.sources.teacher import TeacherSource

    monkeypatch.setattr(tiny_bpe, "warm_start", lambda **kw: tiny_bpe_model_path)
    assert TeacherSource(models=["builtin:tiny-bpe"]).resolve(progress=False) == [str(tiny_bpe_model_path)]
    with pytest.raises(ConfigError, match="unknown built-in model 'builtin:nope'.*builtin:tiny-bpe"):
        TeacherSource(models=["builtin:nope"]).resolve(progress=False)


def test_the_default_teacher_follows_the_students_family(tiny_bpe_model_path, tiny_model_path):
    """teacher=tiny (KDRL, OPD, ...) resolves to the built-in teacher of the student's family: the BPE
    teacher for the BPE chat model (builtin:tiny-bpe or a folder it wrote), the character teacher
    otherwise; a teacher named on the command line stays as named."""
    for student in ("model=tiny-bpe", f"model.path={tiny_bpe_model_path}"):
        assert list(compose_config(["algo=kdrl", student]).teacher.source.models) == ["builtin:tiny-bpe-teacher"]
    for student in ("model=tiny", f"model.path={tiny_model_path}"):
        assert list(compose_config(["algo=kdrl", student]).teacher.source.models) == ["builtin:tiny-teacher"]
    named = compose_config(["algo=opd", "model=tiny-bpe", "teacher.source.models=[builtin:tiny-teacher]"])
    assert list(named.teacher.source.models) == ["builtin:tiny-teacher"]


@pytest.mark.parametrize("student, teacher, builder, words", [
    ("bpe", "builtin:tiny-teacher", "tiny", r"'builtin:tiny-teacher' has the character-level tokenizer.*teacher=tiny gives model=tiny-bpe"),
    ("char", "builtin:tiny-bpe-teacher", "tiny_bpe", r"'builtin:tiny-bpe-teacher' has the BPE chat model's tokenizer.*use teacher=tiny"),
])
def test_a_built_in_teacher_of_another_family_is_refused_before_it_is_built(student, teacher, builder, words, tiny_bpe_model_path,
                                                                           tiny_model_path, monkeypatch, tmp_path):
    """A built-in teacher named for a student of the other family: one line naming the fix, before
    the teacher's minutes-long build starts and before any run directory exists."""
    from mixrl.errors import ConfigError
    from mixrl.models import tiny
    from mixrl.trainer import run

    def no_build(*a, **k):
        raise AssertionError("the built-in teacher was built before the refusal")

    monkeypatch.setattr(tiny if builder == "tiny" else tiny_bpe, "teacher_warm_start", no_build)
    path = tiny_bpe_model_path if student == "bpe" else tiny_model_path
    cfg = compose_config(["algo=opd", f"model.path={path}", f"teacher.source.models=[{teacher}]",
                          f"run_dir={tmp_path / 'run'}", "logger.progress=false", "trainer.eval_size=0"])
    with pytest.raises(ConfigError, match=words):
        run.prepare_inputs(cfg, Console(quiet=True))
    assert not (tmp_path / "run").exists()