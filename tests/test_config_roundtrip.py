"""A run's saved ``config.yaml`` must always load back: for every shipped algo and recipe,
the config is composed, written as a run directory holds it (:func:`mixrl.trainer.state.rundir.config_text`),
then loaded and validated as ``resume=`` and ``mixrl eval`` do, giving the same config.
Compose-only (no model, no training)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from mixrl.config.compose import compose_config, group_options, list_recipe_names
from mixrl.trainer.saved_eval import eval_config
from mixrl.trainer.state.resume import resume_config
from mixrl.trainer.state.rundir import config_text

CASES = [f"algo={a}" for a in group_options("algo")] + [f"recipe={r}" for r in list_recipe_names()]


def _plain(cfg) -> dict:
    out = OmegaConf.to_container(cfg, resolve=True)
    out.pop("run_dir", None)
    out.pop("resume", None)
    return out


@pytest.mark.parametrize("override", CASES)
def test_saved_config_loads_back_for_resume_and_eval(override, tmp_path):
    cfg = compose_config([override])
    (tmp_path / "config.yaml").write_text(config_text(cfg))

    evaluated, path = eval_config(tmp_path, [])  # mixrl eval RUN_DIR
    assert path == tmp_path / "config.yaml"
    assert _plain(evaluated) == _plain(cfg)
    if cfg.algo.get("stages"):
        with pytest.raises(Exception, match="cannot be resumed yet"):
            resume_config(str(tmp_path), [])
        return
    resumed = resume_config(str(tmp_path), [])  # mixrl train resume=RUN_DIR
    assert _plain(resumed) == _plain(cfg)
    assert resumed.run_dir == str(tmp_path)


def test_every_algo_and_recipe_is_covered():
    assert len([c for c in CASES if c.startswith("algo=")]) >= 27
    assert {"algo=prefixrl", "algo=prefix_rft", "algo=uft"} <= set(CASES)
    assert len(CASES) > 60
