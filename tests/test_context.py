"""The context check (mixrl/config/context.py): the prompt budget plus trainer.max_completion_length
within the policy's max_position_embeddings, read from known.py, a local config.json or the HF cache;
refused in one line (ConfigError, exit 2) by plan, explain, train (before any run directory) and the
rehearsal (against the real model, not the tiny one it swaps in)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mixrl.cli.main import app
from mixrl.config import rehearsal
from mixrl.config.compose import compose_config
from mixrl.config.context import PROMPT_TOKENS, check_context, model_positions, prompt_budget
from mixrl.errors import ConfigError
from mixrl.models.known import KNOWN_MODELS

GPU_RECIPES = rehearsal.gpu_recipes()

#: the ten recipes of issue 48 that could not start, with the (model, max_completion_length) they shipped
#: with before the fix: 8192 on a 4096-position model, or 4096 (no room for the prompt)
OLD_SETTINGS = {
    "luffy/qwen2.5-math-7b-openr1": ("qwen2.5-math-7b", 8192),
    "rl_plus/qwen2.5-math-7b-openr1": ("qwen2.5-math-7b", 8192),
    "exgrpo/qwen2.5-math-7b-openr1": ("qwen2.5-math-7b", 8192),
    "prefix_rft/qwen2.5-math-7b-openr1": ("qwen2.5-math-7b", 8192),
    "bapo/qwen2.5-math-7b-openr1": ("qwen2.5-math-7b", 8192),
    "soup/qwen2.5-math-7b-openr1": ("qwen2.5-math-7b", 8192),
    "remix/qwen2.5-math-7b-openr1": ("qwen2.5-math-7b", 4096),
    "kdrl/qwen2.5-math-1.5b-openr1": ("qwen2.5-math-1.5b", 4096),
    "opd/qwen2.5-math-1.5b-openr1": ("qwen2.5-math-1.5b", 4096),
    "opsd/qwen2.5-math-1.5b-openr1": ("qwen2.5-math-1.5b", 4096),
}


def _folder(tmp_path: Path, positions: int, name: str = "m") -> Path:
    """A local model folder holding only a config.json (no weights: the check reads nothing else)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2", "max_position_embeddings": positions}))
    return folder


# --------------------------------------------------------------------------- the recipes


@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_every_gpu_recipe_fits_its_real_models_context(recipe):
    cfg = compose_config([f"recipe={recipe}"])
    checked = check_context(cfg)
    policy = dict(checked.models)["model.path"]
    assert policy.n is not None, f"{recipe}: {cfg.model.path} has no known context"
    assert checked.need == PROMPT_TOKENS + int(cfg.trainer.max_completion_length) <= policy.n


def test_the_ten_recipes_are_all_gpu_recipes():
    assert set(OLD_SETTINGS) <= set(GPU_RECIPES)


@pytest.mark.parametrize("recipe", sorted(OLD_SETTINGS))
def test_the_old_settings_of_the_ten_are_refused(recipe):
    model, length = OLD_SETTINGS[recipe]
    cfg = compose_config([f"recipe={recipe}", f"model={model}", f"trainer.max_completion_length={length}"])
    with pytest.raises(ConfigError) as e:
        check_context(cfg)
    line = str(e.value)
    assert "\n" not in line
    room = 4096 - PROMPT_TOKENS  # both models: max_position_embeddings 4096 (known.py)
    assert f"{PROMPT_TOKENS + length} positions" in line and "4096 positions" in line
    assert f"trainer.max_completion_length<={room}" in line


def test_the_authors_16k_model_is_what_luffy_rl_plus_and_exgrpo_train():
    for recipe in ("luffy/qwen2.5-math-7b-openr1", "rl_plus/qwen2.5-math-7b-openr1", "exgrpo/qwen2.5-math-7b-openr1"):
        cfg = compose_config([f"recipe={recipe}"])
        assert cfg.model.path == "Elliott/Qwen2.5-Math-7B-16k-think" and int(cfg.trainer.max_completion_length) == 8192
    known = KNOWN_MODELS["Elliott/Qwen2.5-Math-7B-16k-think"]
    base = KNOWN_MODELS["Qwen/Qwen2.5-Math-7B"]
    assert known["max_position_embeddings"] == 16384 and known["rope_theta"] == 40000.0
    assert {k: v for k, v in known.items() if k not in ("max_position_embeddings", "rope_theta")} == \
        {k: v for k, v in base.items() if k != "max_position_embeddings"}  # the same weights' shape


def test_the_refusal_names_the_longer_context_model():
    cfg = compose_config(["recipe=luffy/qwen2.5-math-7b-openr1", "model=qwen2.5-math-7b"])
    with pytest.raises(ConfigError, match=r"or model=qwen2.5-math-7b-16k-think \(Elliott/Qwen2.5-Math-7B-16k-think, 16384 positions\)"):
        check_context(cfg)


# --------------------------------------------------------------------------- the check on a local folder


def test_a_local_folder_is_read_from_its_config_json(tmp_path):
    folder = _folder(tmp_path, 2000)
    pos = model_positions(str(folder))
    assert pos.n == 2000 and pos.source == str(folder / "config.json")
    # 512 + 1488 = 2000 fits exactly; 1489 is one position too many
    assert check_context(compose_config([f"model.path={folder}", "data.source=x.jsonl", "trainer.max_completion_length=1488"])).need == 2000
    with pytest.raises(ConfigError, match=r"2001 positions .* 2000 positions .*trainer.max_completion_length<=1488.*data.max_prompt_tokens=N"):
        check_context(compose_config([f"model.path={folder}", "data.source=x.jsonl", "trainer.max_completion_length=1489"]))


def test_a_nested_text_config_is_read(tmp_path):
    folder = tmp_path / "vl"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "x", "text_config": {"max_position_embeddings": 2048}}))
    assert model_positions(str(folder)).n == 2048


def test_the_default_budget_is_at_most_half_a_small_models_context(tmp_path):
    folder = _folder(tmp_path, 64)  # e.g. a copied tiny model: 512 prompt tokens would refuse any completion
    cfg = compose_config([f"model.path={folder}", "data.source=x.jsonl", "trainer.max_completion_length=32"])
    assert prompt_budget(cfg, 64) == 32 and check_context(cfg).need == 64
    with pytest.raises(ConfigError, match=r"65 positions \(a 32-token prompt budget"):
        check_context(compose_config([f"model.path={folder}", "data.source=x.jsonl", "trainer.max_completion_length=33"]))


def test_data_max_prompt_tokens_is_the_budget(tmp_path):
    folder = _folder(tmp_path, 1000)
    cfg = compose_config([f"model.path={folder}", "data.source=x.jsonl", "data.max_prompt_tokens=100",
                          "trainer.max_completion_length=900"])
    assert prompt_budget(cfg, 1000) == 100 and check_context(cfg).need == 1000
    with pytest.raises(ConfigError, match="use a model with a longer context"):  # the stated prompts alone fill it
        check_context(compose_config([f"model.path={folder}", "data.source=x.jsonl", "data.max_prompt_tokens=1000",
                                      "trainer.max_completion_length=8"]))
    with pytest.raises(ConfigError, match=r"data.max_prompt_tokens=0 is out of range"):
        compose_config(["data.max_prompt_tokens=0"])


def test_plan_prompt_tokens_is_the_budget(tmp_path):
    folder = _folder(tmp_path, 2000)
    cfg = compose_config([f"model.path={folder}", "data.source=x.jsonl", "trainer.max_completion_length=1700"])
    with pytest.raises(ConfigError):
        check_context(cfg)  # 512 + 1700 > 2000
    assert check_context(cfg, prompt_tokens=300).need == 2000  # mixrl plan --prompt-tokens 300


def test_unknown_and_builtin_models_are_not_checked(tmp_path):
    assert model_positions("some-org/not-a-model-mixrl-knows").n is None
    assert model_positions("builtin:tiny-bpe").n is None
    marked = _folder(tmp_path, 64, "tiny")
    (marked / "mixrl_tiny_bpe.json").write_text("{}")
    assert model_positions(str(marked)).n is None  # a built-in model's cached folder: prompts are measured at load
    cfg = compose_config(["model.path=some-org/not-a-model-mixrl-knows", "trainer.max_completion_length=100000"])
    assert check_context(cfg).need == prompt_budget(cfg) + 100000  # nothing to refuse against


def test_a_longer_prompt_than_data_max_prompt_tokens_is_refused_at_data_load(tiny_model_path, fast_overrides, tmp_path):
    """The budget the config-time check assumed is enforced on every training row once the tokenizer is loaded."""
    src = tmp_path / "data.jsonl"
    src.write_text("".join(json.dumps({"prompt": p, "answer": "1"}) + "\n" for p in ["1+0=", "1+0=", "10+20+30+40=", "1+0="]))
    result = CliRunner().invoke(app, ["train", *fast_overrides, "trainer.eval_size=0", "data.expert_column=null",
                                      f"data.source={src}", f"model.path={tiny_model_path}", "data.max_prompt_tokens=6"])
    line = _one_line_error(result)
    assert line.startswith("error: training row 2: the prompt is ") and "longer than data.max_prompt_tokens=6" in line


def test_the_hugging_face_cache_is_read(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    snap = cache / "models--org--cached" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"max_position_embeddings": 777}))
    (cache / "models--org--cached" / "refs").mkdir()
    (cache / "models--org--cached" / "refs" / "main").write_text("abc")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    pos = model_positions("org/cached")
    assert pos.n == 777 and "Hugging Face cache" in pos.source


def test_vllm_max_model_length_is_checked():
    cfg = compose_config(["recipe=grpo/qwen2.5-math-1.5b-gsm8k", "hardware=gpu-8x80g-vllm", "hardware.vllm_max_model_length=1024"])
    with pytest.raises(ConfigError, match=r"hardware.vllm_max_model_length=1024"):
        check_context(cfg)  # 512 + 1024 > 1024
    cfg = compose_config(["recipe=grpo/qwen2.5-math-1.5b-gsm8k", "hardware=gpu-8x80g-vllm", "hardware.vllm_max_model_length=1536"])
    assert check_context(cfg).vllm_max_model_length == 1536


def test_a_short_teacher_is_shown_not_refused():
    # the recipe's earlier online teachers (its header's override list): the 4k-context Math teacher
    cfg = compose_config(["recipe=ampo/qwen2.5-7b-instruct-openr1", "data=openr1-math", "offpolicy=none", "teacher=model",
                          "teacher.source.models=[Qwen/Qwen2.5-Math-7B-Instruct,Qwen/Qwen2.5-14B-Instruct]",
                          "algo.inject.name=refill_failed", "algo.terms.offpolicy.tokens=[teacher]",
                          "algo.terms.offpolicy.normalise_over=[on_policy,teacher]",
                          "algo.terms.policy.normalise_over=[on_policy,teacher]"])
    checked = check_context(cfg)  # the policy (32768) holds 8704
    assert [(role, pos.path, pos.n) for role, pos in checked.too_short()] == \
        [("teacher.source.models[0]", "Qwen/Qwen2.5-Math-7B-Instruct", 4096)]
    assert any("does NOT hold it" in line for line in checked.lines())


# --------------------------------------------------------------------------- the commands


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


def test_plan_refuses_and_prints_the_context():
    runner = CliRunner()
    line = _one_line_error(runner.invoke(app, ["plan", "recipe=luffy/qwen2.5-math-7b-openr1", "model=qwen2.5-math-7b"]))
    assert "exceed the context of model.path=Qwen/Qwen2.5-Math-7B: 4096 positions" in line
    ok = runner.invoke(app, ["plan", "luffy/qwen2.5-math-7b-openr1"])
    assert ok.exit_code == 0, ok.output
    assert "context (prompt budget 512 tokens + trainer.max_completion_length 8,192 = 8,704 positions" in ok.output
    assert "Elliott/Qwen2.5-Math-7B-16k-think: 16,384 positions >= 8,704" in ok.output


def test_explain_refuses():
    line = _one_line_error(CliRunner().invoke(app, ["explain", "recipe=kdrl/qwen2.5-math-1.5b-openr1",
                                                    "trainer.max_completion_length=4096"]))
    assert "model.path=Qwen/Qwen2.5-Math-1.5B: 4096 positions" in line


def test_train_refuses_before_a_run_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    line = _one_line_error(CliRunner().invoke(app, ["train", "recipe=opd/qwen2.5-math-1.5b-openr1", "hardware=cpu",
                                                    "trainer.max_completion_length=4096", f"run_dir={run}"]))
    assert "trainer.max_completion_length<=3584" in line
    assert not run.exists() and not (tmp_path / "runs").exists()


def test_the_rehearsal_checks_the_real_model():
    cfg = compose_config(["recipe=soup/qwen2.5-math-7b-openr1", "trainer.max_completion_length=8192"])
    with pytest.raises(ConfigError, match="model.path=Qwen/Qwen2.5-Math-7B: 4096 positions"):
        rehearsal.plan_rehearsal(cfg, vllm=False)
    swaps = rehearsal.plan_rehearsal(compose_config(["recipe=soup/qwen2.5-math-7b-openr1"]), vllm=False)
    note = next(s for s in swaps if s.key == "context")
    assert note.override is None and note.recipe == "512 prompt + 3,584 completion = 4,096 positions"
    assert "Qwen/Qwen2.5-Math-7B 4,096" in note.rehearsal


# --------------------------------------------------------------------------- engine correction (issue 48)


@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_gpu_recipes_train_without_engine_correction_and_say_why(recipe):
    """The authors' pipelines recompute the old log-probs with the trainer and correct no vLLM/trainer
    mismatch; every GPU recipe turns mixrl's correction off and says, in the recipe, on what basis."""
    from mixrl.config.recipe_index import recipes_dir

    cfg = compose_config([f"recipe={recipe}"])
    assert cfg.algo.engine_correction.enabled is False  # without vLLM it has no effect; off so a switch to vLLM adds none
    text = (recipes_dir() / f"{recipe}.yaml").read_text()
    assert "engine correction off (issue 48)" in text and ("the authors' pipeline" in text or "our choice" in text)
    back = compose_config([f"recipe={recipe}", "algo.engine_correction.enabled=true"])  # the option stays reachable
    assert back.algo.engine_correction.enabled is True and back.algo.engine_correction.c_max == 3.0


# --------------------------------------------------------------------------- the rehearsal's chat template

REAL_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\nREAL-TEMPLATE {{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _cache_with_tokenizer_config(tmp_path: Path, repo_id: str, template: str) -> Path:
    """A Hugging Face cache holding only ``repo_id``'s tokenizer_config.json (the layout huggingface_hub reads)."""
    cache = tmp_path / "hub"
    folder = cache / f"models--{repo_id.replace('/', '--')}"
    snap = folder / "snapshots" / "rev0"
    snap.mkdir(parents=True)
    (snap / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("rev0")
    return cache


def test_the_rehearsal_renders_prompts_with_the_real_models_cached_chat_template(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    cache = _cache_with_tokenizer_config(tmp_path, "Qwen/Qwen2.5-Math-7B", REAL_TEMPLATE)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    template, where = rehearsal.real_chat_template("Qwen/Qwen2.5-Math-7B")
    assert template == REAL_TEMPLATE and where.endswith("tokenizer_config.json")
    swaps = rehearsal.plan_rehearsal(compose_config(["recipe=soup/qwen2.5-math-7b-openr1"]), vllm=False)
    model = next(s for s in swaps if s.key == "model")
    assert "Qwen/Qwen2.5-Math-7B's own chat template" in model.why
    folder = Path(next(s for s in swaps if s.key == "model.path").rehearsal)
    assert (folder / "chat_template.jinja").read_text() == REAL_TEMPLATE
    assert json.loads((folder / "config.json").read_text())["max_position_embeddings"] == rehearsal.CONTEXT
    text = AutoTokenizer.from_pretrained(folder).apply_chat_template([{"role": "user", "content": "1+1?"}], tokenize=False,
                                                                     add_generation_prompt=True)
    assert text == "<|im_start|>user\nREAL-TEMPLATE 1+1?<|im_end|>\n<|im_start|>assistant\n"


def test_without_a_cached_template_the_rehearsal_says_whose_template_it_uses(tmp_path, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "empty"))
    assert rehearsal.real_chat_template("Qwen/Qwen2.5-Math-7B")[0] is None
    swaps = rehearsal.plan_rehearsal(compose_config(["recipe=soup/qwen2.5-math-7b-openr1"]), vllm=False)
    model = next(s for s in swaps if s.key == "model")
    assert "Qwen2.5's chat template and the built-in task's default system message, not Qwen/Qwen2.5-Math-7B's own" in model.why
    assert Path(next(s for s in swaps if s.key == "model.path").rehearsal).name.endswith(f"-context{rehearsal.CONTEXT}")
