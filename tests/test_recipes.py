"""Every shipped recipe composes, validates, describes itself, and (for hub datasets) its
data settings load a small local file with the same schema as the hub dataset."""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path

import pytest
from omegaconf import DictConfig, ListConfig, OmegaConf

from mixrl.config.compose import compose_config, list_recipe_names, load_recipe, recipes_dir
from mixrl.config.geometry import geometry

FIXTURES = Path(__file__).parent / "fixtures"

#: hub dataset id -> local fixtures with the same columns (tests/fixtures/make_fixtures.py)
HUB_FIXTURES = {
    "openai/gsm8k": ["gsm8k.jsonl"],
    "gsm8k": ["gsm8k.jsonl"],
    "open-r1/OpenR1-Math-220k": ["openr1_math.jsonl", "openr1_math.parquet"],
    "hendrycks/competition_math": ["math.jsonl"],
    "EleutherAI/hendrycks_math": ["math.jsonl"],
    "DigitalLearningGmbH/MATH-lighteval": ["math.jsonl"],
    "HuggingFaceH4/MATH-500": ["math.jsonl"],
    "Elliott/Openr1-Math-46k-8192": ["luffy_openr1.jsonl"],
    "SII-Enigma/OpenR1-Math-4LongCoTs-8.5k": ["ampo_openr1_4longcots.jsonl"],
    "hkgc/math3to5_olympiads_aime": ["ghpo_math3to5.jsonl"],
    "HuggingFaceH4/ultrafeedback_binarized": ["ultrafeedback_binarized.jsonl"],
    "critique-GRPO/openr1_math_4k_train_qwenformat": ["critique_grpo_openr1_4k.jsonl"],  # a clone of their repository
}

RECIPES = list_recipe_names()


@lru_cache(maxsize=None)
def _recipe_cfg(name: str) -> DictConfig:
    """The composed recipe, once per recipe (read-only: tests must not modify it)."""
    cfg = compose_config([f"recipe={name}"])
    OmegaConf.set_readonly(cfg, True)
    return cfg


def _is_hub_id(source: str | None) -> bool:
    return bool(source) and not source.startswith("builtin:") and not os.path.exists(source) and "/" in source and not source.startswith((".", "/"))


def _leaves(node, prefix: str = ""):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "defaults" and not prefix:
                continue
            yield from _leaves(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1], node


def _expected(cfg, value):
    """A file value as the composed config should hold it: a plain ``${a.b}`` interpolation
    is resolved against the composed config."""
    if isinstance(value, str):
        m = re.fullmatch(r"\$\{([\w.]+)\}", value)
        if m:
            return OmegaConf.select(cfg, m.group(1))
    return value


def _fixtures_for(source: str) -> list[Path]:
    names = HUB_FIXTURES.get(source)
    assert names, (
        f"no local fixture for hub dataset '{source}': add a small file with its columns to tests/fixtures/ "
        "(make_fixtures.py) and map it in HUB_FIXTURES of tests/test_recipes.py"
    )
    return [FIXTURES / n for n in names]


def test_there_are_recipes():
    assert RECIPES, f"no recipes under {recipes_dir()}"
    assert "grpo/arith-tiny" in RECIPES


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_composes_and_validates(name):
    cfg = _recipe_cfg(name)
    assert isinstance(cfg, DictConfig)
    geometry(cfg)  # the batch geometry is consistent (validate already checks it; must not raise)


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_info(name):
    cfg = _recipe_cfg(name)
    info = cfg.recipe_info
    assert info.name == name, f"recipes/{name}.yaml sets recipe_info.name={info.name!r}; it must equal its file name"
    for key in ("paper", "hardware"):
        assert isinstance(info[key], str) and info[key].strip(), f"recipe {name}: recipe_info.{key} is empty"


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_values_reach_the_config(name):
    """Every value a recipe sets wins over the group defaults."""
    raw = OmegaConf.to_container(load_recipe(name), resolve=False)
    cfg = _recipe_cfg(name)
    for key, value in _leaves(raw):
        got = OmegaConf.select(cfg, key)
        if isinstance(got, (DictConfig, ListConfig)):
            got = OmegaConf.to_container(got, resolve=True)
        value = _expected(cfg, value)
        assert got == value, f"recipe {name}: {key} = {value!r} in the file, {got!r} in the composed config"


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_command_line_wins(name):
    cfg = compose_config([f"recipe={name}", "trainer.max_steps=3", "seed=9"])
    assert cfg.trainer.max_steps == 3 and cfg.seed == 9
    assert cfg.recipe_info.name == name


def _non_empty_prompt(prompt) -> bool:
    if isinstance(prompt, str):
        return bool(prompt.strip())
    users = [m["content"] for m in prompt if m["role"] == "user"]
    return bool(users) and all(u and u.strip() for u in users)


@pytest.mark.parametrize("name", RECIPES)
def test_hub_recipe_data_settings_load_local_fixture(name):
    from mixrl.trainer.build import load_eval_rows, load_train_rows

    source = _recipe_cfg(name).data.source
    if not _is_hub_id(source):
        pytest.skip(f"data.source={source} is not a hub dataset")
    for fixture in _fixtures_for(source):
        cfg = compose_config([f"recipe={name}", f"data.source={fixture}", f"data.eval_source={fixture}", "trainer.eval_size=3"])
        train = load_train_rows(cfg)
        assert len(train) > 0
        has_answer = cfg.data.answer_column is not None  # null: data with no gold answers (a reward model scores it)
        assert {"prompt", "answer"} <= set(train.column_names) if has_answer else "prompt" in train.column_names
        if cfg.data.expert_column:
            assert "expert" in train.column_names, f"{name}: data.expert_column={cfg.data.expert_column} gave no expert column"
        for row in train:
            assert _non_empty_prompt(row["prompt"]), f"{name} on {fixture.name}: empty prompt {row['prompt']!r}"
            assert not has_answer or str(row["answer"]).strip(), f"{name} on {fixture.name}: empty answer"
            if cfg.data.expert_column:
                assert row["expert"] and all(e.strip() for e in row["expert"]), f"{name} on {fixture.name}: empty expert"
        if cfg.data.system_prompt:
            assert train[0]["prompt"][0] == {"role": "system", "content": cfg.data.system_prompt}

        rows = load_eval_rows(cfg)
        assert 0 < len(rows) <= 3
        for row in rows:
            assert _non_empty_prompt(row["prompt"]) and (not has_answer or str(row["answer"]).strip())
