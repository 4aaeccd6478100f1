"""The minpro / etr / r2vpo / vcpo / sfpo / alp presets compose, and an out-of-range setting of
their losses, controllers and update hooks is one line at compose time (ConfigError, exit 2)."""

import pytest

from mixrl.config.compose import compose_config
from mixrl.errors import ConfigError


@pytest.mark.parametrize("algo, loss, extra", [
    ("minpro", "minpro", {}),
    ("etr", "etr", {"advantage": "dr_grpo"}),
    ("r2vpo", "r2vpo", {"controller": "r2vpo_dual"}),
    ("vcpo", "ppo_clip", {"controller": "vcpo_ess"}),
    ("sfpo", "ppo_clip", {"reposition": {"alpha": 0.8}}),
    ("alp", "ppo_clip", {"perturbation": {"sigma": 0.01}}),
])
def test_presets_compose(algo, loss, extra):
    cfg = compose_config([f"algo={algo}"])
    assert cfg.algo.loss.name == loss
    if "advantage" in extra:
        assert cfg.algo.advantage.name == extra["advantage"]
    if "controller" in extra:
        assert cfg.algo.controller.name == extra["controller"]
    for key in ("reposition", "perturbation"):
        if key in extra:
            assert dict(cfg.algo[key]) == extra[key]


@pytest.mark.parametrize("overrides, start", [
    (["algo=vcpo", "algo.controller.base_ess_ratio=0"], "algo.controller.base_ess_ratio=0 is out of range"),
    (["algo=vcpo", "algo.controller.scaling_rule=cube"], "algo.controller (vcpo_ess): scaling_rule must be one of"),
    (["algo=r2vpo", "algo.controller.dual_lr=-1"], "algo.controller.dual_lr=-1 is out of range"),
    (["algo=r2vpo", "algo.controller.delta=-0.1"], "algo.controller.delta=-0.1 is out of range"),
    (["algo=r2vpo", "algo.loss.var_coef=-1"], "algo.loss.var_coef=-1 is out of range"),
    (["algo=r2vpo", "algo.loss.name=ppo_clip"], "algo.controller=r2vpo_dual: it sets the ratio-variance multiplier"),
    (["algo=etr", "algo.loss.alpha=-1"], "algo.loss.alpha=-1 is out of range"),
    (["algo=minpro", "algo.loss.clip_low=0.2"], "algo.loss.clip_low and algo.loss.clip_high of minpro go together"),
    (["algo=minpro", "algo.loss.weight_max=0"], "algo.loss.weight_max=0 is out of range"),
    (["algo=sfpo", "algo.reposition.alpha=2"], "algo.reposition.alpha=2 is out of range"),
    (["algo=sfpo", "+algo.reposition.fast_steps=3"], "algo.reposition takes only alpha"),
    (["algo=alp", "algo.perturbation.sigma=0"], "algo.perturbation.sigma=0 is out of range"),
    (["algo=alp", "hardware.gradient_checkpointing=true"], "algo.perturbation with hardware.gradient_checkpointing=true"),
])
def test_bad_setting_is_one_line(overrides, start):
    with pytest.raises(ConfigError) as e:
        compose_config(overrides)
    assert str(e.value).startswith(start), str(e.value)
    assert "\n" not in str(e.value).strip()
