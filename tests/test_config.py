"""Config composition: groups, recipe overlays, overrides, component defaults, sweeps.

Everything here is pure config work (no model, no data): each test takes milliseconds.
"""

from __future__ import annotations

import re
import pytest
import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from mixrl.config.compose import (
    compose_config,
    conf_dir,
    expand_sweeps,
    group_options,
    to_yaml,
)
from mixrl.config.schema import GROUPS
from mixrl.errors import ConfigError


def _leaves(node, prefix: str = ""):
    """(dotted key, value) for every leaf of a plain mapping; lists are leaves."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "defaults" and not prefix:
                continue
            yield from _leaves(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1], node


def _expected(cfg, value):
    """A file value as the composed config should hold it: an interpolation (``${a.b}`` or a
    resolver) is resolved against the composed config."""
    if isinstance(value, list):
        return [_expected(cfg, v) for v in value]
    if isinstance(value, str):
        m = re.fullmatch(r"\$\{([\w.]+)\}", value)
        if m:
            return OmegaConf.select(cfg, m.group(1))
        if "${" in value:  # a resolver (e.g. ${builtin_teacher:${model.path}}): resolved in the composed config's context
            probe = cfg.copy()
            with open_dict(probe):
                probe._probe = value
            return probe._probe
    return value


def _plain(cfg: DictConfig, key: str):
    value = OmegaConf.select(cfg, key, throw_on_missing=True)
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _compose_error(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        compose_config(overrides)
    msg = str(info.value)
    assert "\n" not in msg.strip(), f"error message is not one line: {msg!r}"
    return msg


# --------------------------------------------------------------------------- defaults and groups
def test_default_config_composes_with_every_group():
    cfg = compose_config([])
    assert isinstance(cfg, DictConfig)
    for group in GROUPS:
        assert cfg[group].name in group_options(group), f"default {group}={cfg[group].name} is not an option"
    assert cfg.algo.name == "grpo"
    assert cfg.recipe_info.name is None  # no recipe unless one is chosen


def test_every_group_has_options():
    for group in GROUPS:
        assert group_options(group), f"config group '{group}' has no options under {conf_dir() / group}"


GROUP_OPTIONS = [(g, o) for g in GROUPS for o in group_options(g)]


@pytest.mark.parametrize("group,option", GROUP_OPTIONS, ids=[f"{g}={o}" for g, o in GROUP_OPTIONS])
def test_each_group_option_composes(group, option):
    # an off-policy source needs an algo that injects its rows (alone it is rejected)
    algo_for = {"replay": "algo=remix", "experience": "algo=exgrpo", "pairs": "algo=simplemix"}  # the algo that injects the source's rows (default: chord's expert rows)
    cfg = compose_config([f"{group}={option}"] + ([algo_for.get(option, "algo=chord")] if group == "offpolicy" and option != "none" else [])
                         + (["algo=opd"] if group == "teacher" and option != "none" else []))  # a teacher needs a term that reads it
    assert cfg[group].name == option
    # every value the option file sets reaches the composed config (the file is its own
    # `_self_`, applied after the defaults it lists, unless it lists `_self_` first)
    own = OmegaConf.to_container(OmegaConf.load(conf_dir() / group / f"{option}.yaml"), resolve=False)
    defaults = own.get("defaults") or []
    if defaults and defaults[0] == "_self_" and len(defaults) > 1:
        pytest.skip(f"{group}/{option}.yaml lists _self_ first: its defaults may override its own values")
    path = conf_dir() / group / f"{option}.yaml"
    at = "" if path.read_text().startswith("# @package _global_") else f"{group}."  # a _global_ file names its keys in full
    for key, value in _leaves(own):
        assert _plain(cfg, f"{at}{key}") == _expected(cfg, value), f"{group}={option}: {at}{key}"


def test_group_option_with_extra_group_overrides_composes():
    cfg = compose_config(["data=gsm8k", "model=qwen2.5-math-1.5b", "reward=math", "hardware=gpu-1x80g", "logger=tensorboard"])
    assert (cfg.data.name, cfg.model.name, cfg.reward.name, cfg.hardware.name, cfg.logger.name) == (
        "gsm8k", "qwen2.5-math-1.5b", "math", "gpu-1x80g", "tensorboard",
    )
    assert cfg.data.source == "openai/gsm8k"
    assert cfg.hardware.device == "cuda"


def test_compose_is_pure():
    """Composing one config does not leak into the next (Hydra global state, caches)."""
    a = compose_config(["seed=7", "trainer.max_steps=3", "data=gsm8k"])
    b = compose_config([])
    assert (a.seed, a.trainer.max_steps, a.data.name) == (7, 3, "gsm8k")
    assert b.seed == 0 and b.trainer.max_steps != 3 and b.data.name == "arith"


# --------------------------------------------------------------------------- overrides
def test_value_overrides_of_the_issue_example():
    cfg = compose_config(["algo=grpo", "trainer.max_steps=20", "algo.loss.clip_high=0.28", "seed=3"])
    assert cfg.algo.name == "grpo"
    assert cfg.trainer.max_steps == 20
    assert cfg.algo.loss.clip_high == pytest.approx(0.28)
    assert cfg.seed == 3


def test_override_schema_key_not_in_any_yaml():
    """Keys of the typed schema that no YAML file lists are overridable without '+'."""
    cfg = compose_config(["trainer.top_p=0.9", "data.limit=10", "hardware.torch_threads=2"])
    assert cfg.trainer.top_p == pytest.approx(0.9)
    assert cfg.data.limit == 10
    assert cfg.hardware.torch_threads == 2


def test_override_values_are_typed():
    cfg = compose_config(["trainer.learning_rate=1e-5", "seed=11"])
    assert isinstance(cfg.trainer.learning_rate, float) and cfg.trainer.learning_rate == pytest.approx(1e-5)
    assert isinstance(cfg.seed, int)


def test_plus_prefixed_override_of_existing_schema_key_is_checked():
    msg = _compose_error(["+trainer.max_stepz=3"])
    assert "trainer.max_stepz" in msg


# --------------------------------------------------------------------------- recipes
RECIPE = "grpo/qwen2.5-math-1.5b-gsm8k"


def test_recipe_overlays_group_defaults():
    base = compose_config([])
    cfg = compose_config([f"recipe={RECIPE}"])
    # the recipe's own group choices replace the defaults of conf/config.yaml
    assert cfg.data.name == "gsm8k" and base.data.name == "arith"
    assert cfg.model.name == "qwen2.5-math-1.5b"
    # a recipe value beats the group file (algo/grpo.yaml sets clip_high 0.2) ...
    assert compose_config(["algo=grpo"]).algo.loss.clip_high == pytest.approx(0.2)
    assert cfg.algo.loss.clip_high == pytest.approx(0.28)
    # ... and the primary config (conf/config.yaml sets max_steps 60)
    assert cfg.trainer.max_steps == 500
    assert cfg.recipe_info.name == RECIPE


@pytest.mark.parametrize("order", ["recipe_first", "recipe_last"])
def test_command_line_beats_recipe(order):
    ovs = ["trainer.max_steps=7", "algo.loss.clip_high=0.3", "data=arith", "hardware=cpu"]
    ovs = [f"recipe={RECIPE}", *ovs] if order == "recipe_first" else [*ovs, f"recipe={RECIPE}"]
    cfg = compose_config(ovs)
    assert cfg.trainer.max_steps == 7
    assert cfg.algo.loss.clip_high == pytest.approx(0.3)
    assert cfg.data.name == "arith" and cfg.data.source == "builtin:arith"
    assert cfg.hardware.name == "cpu"
    # values of the recipe that were not overridden stay
    assert cfg.trainer.learning_rate == pytest.approx(1e-6)


# --------------------------------------------------------------------------- components
def _registry(section: str):
    from mixrl.config.components import registry_for

    return registry_for(section)


@pytest.mark.parametrize("section", ["algo.loss", "algo.aggregation", "algo.advantage"])
def test_component_defaults_filled_from_signature(section):
    cfg = compose_config([])
    node = OmegaConf.select(cfg, section)
    reg = _registry(section)
    defaults = reg.defaults(node.name)
    assert set(node.keys()) == {"name", *defaults}, f"{section}: keys {list(node.keys())} vs parameters {list(defaults)}"
    set_in_yaml = OmegaConf.select(OmegaConf.load(conf_dir() / "algo" / "grpo.yaml"), section.split(".", 1)[1])
    for key, default in defaults.items():
        if key not in set_in_yaml:
            assert node[key] == default, f"{section}.{key}"


def test_ppo_clip_dual_clip_default_listed():
    cfg = compose_config([])
    assert "dual_clip_c" in cfg.algo.loss and cfg.algo.loss.dual_clip_c is None
    assert cfg.algo.advantage.eps == pytest.approx(1e-6) and cfg.algo.advantage.unbiased is True
    assert "max_len" in cfg.algo.aggregation


def test_defaults_listed_in_config_show_yaml():
    text = to_yaml(compose_config([]))
    data = yaml.safe_load(text)
    assert "dual_clip_c" in data["algo"]["loss"]


@pytest.mark.parametrize(
    "override,key,value",
    [
        ("algo.loss.dual_clip_c=3", "algo.loss.dual_clip_c", 3.0),
        ("algo.aggregation.max_len=64", "algo.aggregation.max_len", 64),
        ("algo.advantage.eps=0.01", "algo.advantage.eps", 0.01),
        ("algo.advantage.unbiased=false", "algo.advantage.unbiased", False),
    ],
)
def test_plusless_override_of_unlisted_component_parameter(override, key, value):
    """``dual_clip_c`` etc. appear in no YAML file; no '+' is needed to set them."""
    if key.rsplit(".", 1)[1] in OmegaConf.load(conf_dir() / "algo" / "grpo.yaml")[key.split(".")[1]]:
        pytest.skip(f"algo/grpo.yaml now lists {key}")
    got = OmegaConf.select(compose_config([override]), key)
    assert got == (pytest.approx(value) if isinstance(value, float) else value)


def test_switching_component_fills_new_defaults():
    cfg = compose_config(["algo.advantage.name=rloo"])
    assert OmegaConf.to_container(cfg.algo.advantage) == {"name": "rloo", "singleton_reward": False}  # grpo's eps / unbiased / scale dropped, rloo's one default filled
    cfg = compose_config(["algo.entropy_coef.name=linear", "algo.entropy_coef.steps=10"])
    assert OmegaConf.to_container(cfg.algo.entropy_coef) == {"name": "linear", "start": 0.0, "end": 1.0, "steps": 10}


def test_switching_component_with_new_parameter_in_same_command():
    cfg = compose_config(["algo.controller.name=bapo", "algo.controller.rho0=0.4"])
    assert cfg.algo.controller.rho0 == pytest.approx(0.4)
    assert cfg.algo.controller.high_max == _registry("algo.controller").defaults("bapo")["high_max"]


def test_switching_component_drops_the_group_files_leftover_params():
    # algo/chord.yaml sets ppo_clip's dual_clip_c, which cispo does not take: switching the
    # component drops it, keeps the parameters both share, and fills cispo's defaults
    chord = OmegaConf.load(conf_dir() / "algo" / "chord.yaml")
    if "dual_clip_c" not in chord.loss:
        pytest.skip("algo/chord.yaml no longer sets loss.dual_clip_c")
    cfg = compose_config(["algo=chord", "algo.loss.name=cispo"])
    assert set(cfg.algo.loss.keys()) == {"name", *_registry("algo.loss").defaults("cispo")}
    assert "dual_clip_c" not in cfg.algo.loss
    # an explicit ~ of the same key is not applied twice
    cfg = compose_config(["algo=chord", "algo.loss.name=cispo", "~algo.loss.dual_clip_c"])
    assert "dual_clip_c" not in cfg.algo.loss


def test_switching_component_with_parameter_set_for_the_old_one_errors_clearly():
    msg = _compose_error(["algo.loss.clip_high=0.3", "algo.loss.name=m2po"])
    assert "algo.loss.clip_high" in msg and "m2po" in msg and "m2_budget" in msg
    cfg = compose_config(["algo.loss.name=m2po"])
    assert OmegaConf.to_container(cfg.algo.loss) == {"name": "m2po", "m2_budget": 0.04, "budget_over": "all"}


def test_parameter_of_previous_component_is_rejected_after_switch():
    msg = _compose_error(["algo.loss.name=cispo", "algo.loss.dual_clip_c=3"])
    assert "algo.loss.dual_clip_c" in msg and "cispo" in msg


@pytest.mark.parametrize(
    "override,must_contain",
    [
        ("algo.loss.name=ppo_clp", ["ppo_clp", "ppo_clip"]),
        ("algo.loss.clip_hihg=0.3", ["algo.loss.clip_hihg", "clip_high"]),
        ("algo.loss.clip_high=abc", ["algo.loss.clip_high", "float"]),
        ("algo.aggregation.name=token_mean", ["token_mean", "token-mean"]),
        ("algo.advantage.name=grp", ["grp", "grpo"]),
        ("algo.kl.estimator=k4", ["k4", "k3"]),
        ("algo.kl.coeff=0.1", ["algo.kl.coeff", "did you mean: algo.kl.coef"]),
    ],
)
def test_component_errors_name_key_and_choices(override, must_contain):
    msg = _compose_error([override])
    for text in must_contain:
        assert text in msg, f"{override}: {text!r} not in {msg!r}"


def test_unknown_reward_param_rejected_before_loading():
    """A reward parameter is checked against the reward function like a component's."""
    msg = _compose_error(["reward=math", "+reward.params.float_roundin=3"])
    assert "float_roundin" in msg and "float_rounding" in msg


def test_plusless_override_of_reward_parameter():
    cfg = compose_config(["reward=math", "reward.params.float_rounding=3"])
    assert cfg.reward.params.float_rounding == 3


# --------------------------------------------------------------------------- interpolation
def test_interpolation_resolves():
    cfg = compose_config(["seed=5", "trainer.max_steps=${seed}", "run_dir=/tmp/mixrl-test/${algo.name}-s${seed}"])
    assert cfg.trainer.max_steps == 5
    assert cfg.run_dir == "/tmp/mixrl-test/grpo-s5"
    data = yaml.safe_load(to_yaml(cfg))
    assert data["trainer"]["max_steps"] == 5
    assert data["run_dir"] == "/tmp/mixrl-test/grpo-s5"


def test_interpolation_is_checked_by_rules():
    # seed 0 -> max_steps 0, which the rules reject
    msg = _compose_error(["seed=0", "trainer.max_steps=${seed}"])
    assert "trainer.max_steps" in msg


@pytest.mark.parametrize("override", ["trainer.max_steps=${nope}", "trainer.max_steps=${data.name}"])
def test_bad_interpolation_is_a_config_error(override):
    msg = _compose_error([override])
    assert "trainer.max_steps" in msg


def test_to_yaml_round_trips():
    cfg = compose_config(["recipe=grpo/arith-tiny", "seed=2"])
    assert yaml.safe_load(to_yaml(cfg)) == OmegaConf.to_container(cfg, resolve=True)


# --------------------------------------------------------------------------- cross-field rules
@pytest.mark.parametrize(
    "overrides,must_contain",
    [
        (["trainer.prompts_per_step=8", "algo.num_generations=8", "trainer.micro_batch_size=5"], ["trainer.micro_batch_size", "8, 16"]),
        (["trainer.prompts_per_step=8", "algo.num_generations=8", "hardware.num_processes=3"], ["hardware.num_processes", "prompts_per_step"]),
        (["algo.inject.name=append_rows"], ["algo.inject", "offpolicy"]),
        (["algo.num_generations=1", "trainer.micro_batch_size=8"], ["algo.num_generations"]),
        (["trainer.max_steps=0"], ["trainer.max_steps"]),
        (["algo.kl.coef=-0.1"], ["algo.kl.coef"]),
        (["hardware.device=tpu"], ["hardware.device"]),
        (["algo=clip_cov", "algo.loss.cov_lower=6"], ["algo.loss.cov_lower=6", "cov_upper=5"]),
    ],
)
def test_cross_field_rules(overrides, must_contain):
    msg = _compose_error(overrides)
    for text in must_contain:
        assert text in msg, f"{overrides}: {text!r} not in {msg!r}"


# --------------------------------------------------------------------------- sweeps
def test_expand_sweeps_without_sweep_is_one_job():
    assert expand_sweeps([]) == [[]]
    assert expand_sweeps(["seed=1", "trainer.max_steps=3"]) == [["seed=1", "trainer.max_steps=3"]]


def test_expand_sweeps_choice():
    assert expand_sweeps(["seed=1,2,3"]) == [["seed=1"], ["seed=2"], ["seed=3"]]


def test_expand_sweeps_range():
    assert expand_sweeps(["trainer.max_steps=range(1,4)"]) == [[f"trainer.max_steps={i}"] for i in (1, 2, 3)]


def test_expand_sweeps_cartesian_product_keeps_fixed_overrides():
    jobs = expand_sweeps(["seed=1,2", "trainer.max_steps=3", "algo.loss.clip_high=0.2,0.28"])
    assert jobs == [
        ["seed=1", "trainer.max_steps=3", "algo.loss.clip_high=0.2"],
        ["seed=1", "trainer.max_steps=3", "algo.loss.clip_high=0.28"],
        ["seed=2", "trainer.max_steps=3", "algo.loss.clip_high=0.2"],
        ["seed=2", "trainer.max_steps=3", "algo.loss.clip_high=0.28"],
    ]


def test_expand_sweeps_jobs_compose():
    """Sweep values that need quoting (commas, colons) or are lists survive the expansion."""
    jobs = expand_sweeps(['data.system_prompt="a, b","c: d"', "data.levels=[1,2],[3]"])
    assert len(jobs) == 2 * 2
    seen = set()
    for job in jobs:
        cfg = compose_config(job)
        seen.add((cfg.data.system_prompt, tuple(cfg.data.levels)))
    assert seen == {(p, lv) for p in ("a, b", "c: d") for lv in ((1, 2), (3,))}


def test_expand_sweeps_group_choice():
    jobs = expand_sweeps(["hardware=cpu,gpu-1x80g"])
    assert jobs == [["hardware=cpu"], ["hardware=gpu-1x80g"]]
    assert [compose_config(j).hardware.name for j in jobs] == ["cpu", "gpu-1x80g"]


def test_sweep_without_multirun_is_refused():
    msg = _compose_error(["seed=1,2"])
    assert "seed=1,2" in msg and "-m" in msg


def test_unparsable_override():
    msg = _compose_error(["trainer.max_steps=[1,2"])
    assert "trainer.max_steps=[1,2" in msg
    with pytest.raises(ConfigError):
        expand_sweeps(["seed=1,,2"])


def test_short_keys_for_mixing_knobs():
    """`algo.gamma`, `algo.mu.*` and `algo.token_weight` (the examples in docs/reference/commands.md) reach the
    terms and coefficients of the shipped algos."""
    cfg = compose_config(["algo=luffy", "algo.gamma=0.2"])
    assert cfg.algo.terms.offpolicy.gamma == pytest.approx(0.2)
    cfg = compose_config(["algo=chord", "algo.mu.peak=0.3", "algo.mu.decay=10", "algo.token_weight.name=p"])
    assert cfg.algo.coefs.mu.peak == pytest.approx(0.3) and cfg.algo.coefs.mu.decay == 10
    assert cfg.algo.terms.sft.token_weight.name == "p"
    assert expand_sweeps(["algo.gamma=0.1,0.2"]) == [["algo.terms.offpolicy.gamma=0.1"], ["algo.terms.offpolicy.gamma=0.2"]]
