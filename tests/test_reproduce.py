"""`mixrl reproduce toy` runs its grid as separate training processes, then compares."""

from __future__ import annotations

import json

import pytest

from mixrl.reproduce import TOY_RECIPES, job_overrides, reproduce_toy


def test_every_toy_recipe_composes_for_every_seed(tmp_path):
    from mixrl.config.compose import compose_config

    for recipe in TOY_RECIPES:
        cfg = compose_config(job_overrides(recipe, 2, tmp_path, []))
        assert cfg.seed == 2 and cfg.trainer.eval_every == 10
        assert cfg.run_dir.endswith(recipe.replace("/", "-") + "-s2")


@pytest.mark.slow
def test_reproduce_runs_the_grid_resumes_and_compares(tmp_path, fast_overrides):
    extra = [o for o in fast_overrides if not o.startswith("run_dir=")]
    recipes = ("grpo/arith-tiny", "sft/arith-tiny")
    logs = []
    result = reproduce_toy(tmp_path, seeds=[0], jobs=2, extra=extra, recipes=recipes, log=logs.append)
    for r in recipes:
        summary = json.loads((tmp_path / "runs" / f"{r.replace('/', '-')}-s0" / "summary.json").read_text())
        assert summary["steps"] == 2
    table = (tmp_path / "compare.md").read_text()
    assert "grpo/arith-tiny" in table and "sft/arith-tiny" in table
    assert json.loads((tmp_path / "reproduce.json").read_text())["seeds"] == [0]
    assert result["compare"].endswith("compare.md")
    # a second call finds every run done and only compares again
    logs.clear()
    reproduce_toy(tmp_path, seeds=[0], jobs=1, extra=extra, recipes=recipes, log=logs.append)
    assert "(2 already done)" in logs[0] and len(logs) == 1


def test_no_seeds_is_a_one_line_error(tmp_path):
    from mixrl.errors import ConfigError

    with pytest.raises(ConfigError, match="--seeds N with N >= 1"):
        reproduce_toy(tmp_path, seeds=[], jobs=1)
