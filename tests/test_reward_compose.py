"""Every reward preset composes from the command line, and ``reward=process`` with every scorer.

``reward=process``'s ``scorer_params`` are the params of its scorer (``reward=judge`` or
``reward=model``); the preset leaves them empty, ``reward.params.scorer_params.<key>=...`` sets one
the current scorer takes (switched in the same command or not), a key the scorer does not take is a
one-line ConfigError naming the scorer's parameters, and switching the scorer drops the params the
old scorer took (as switching a component drops its old parameters).
"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from mixrl.config.compose import compose_config
from mixrl.config.recipe_index import conf_dir
from mixrl.errors import ConfigError
from mixrl.rewards import REWARDS, build_reward, reward_params
from mixrl.rewards.process import SCORERS

PRESETS = sorted(p.stem for p in (conf_dir() / "reward").glob("*.yaml"))
#: one parameter of each scorer and a value for it that builds without a server or a download
SCORER_PARAM = {"judge": ("url", "http://127.0.0.1:9/v1"), "model": ("path", "builtin:tiny-rm"),
                "genprm": ("url", "http://127.0.0.1:9/v1")}


def test_presets_are_the_registered_rewards():
    assert PRESETS == sorted(REWARDS) and set(SCORERS) - {"genprm"} <= set(REWARDS)  # genprm: CAPO's critic, a judge inside


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_composes_and_builds(preset):
    cfg = compose_config([f"reward={preset}"])
    assert cfg.reward.name == preset
    params = OmegaConf.to_container(cfg.reward.params, resolve=True)
    assert set(params) <= set(reward_params(REWARDS[preset]))
    if preset != "judge":  # the judge needs an endpoint or a local model named to build; the process judge below
        build_reward(preset, **params)


@pytest.mark.parametrize("scorer", SCORERS)
def test_process_composes_with_every_scorer(scorer):
    key, value = SCORER_PARAM[scorer]
    cfg = compose_config(["reward=process", f"reward.params.scorer={scorer}", f"reward.params.scorer_params.{key}={value}"])
    params = OmegaConf.to_container(cfg.reward.params, resolve=True)
    assert params["scorer"] == scorer and params["scorer_params"] == {key: value}
    fn = build_reward("process", **params)
    assert fn.fn.scorer_name == scorer
    # the scorer's param alone (the scorer left at the preset's judge, or set first)
    if scorer == "judge":
        assert compose_config(["reward=process", f"reward.params.scorer_params.{key}={value}"]).reward.params.scorer_params[key] == value


def test_a_param_the_scorer_does_not_take_is_one_line():
    with pytest.raises(ConfigError, match=r"the model scorer has no parameter 'url'; its parameters: .*path"):
        compose_config(["reward=process", "reward.params.scorer=model", "reward.params.scorer_params.url=http://x/v1"])
    with pytest.raises(ConfigError, match=r"the judge scorer has no parameter 'pth' \(did you mean: path\?\)"):
        compose_config(["reward=process", "reward.params.scorer_params.pth=x"])


def test_switching_the_scorer_drops_the_old_scorers_params():
    from mixrl.config.compose import _prepare_value_overrides, parse_overrides

    base = compose_config(["reward=process"])
    with_url = OmegaConf.create(OmegaConf.to_container(base))
    with_url.reward.params.scorer_params = {"url": "http://x/v1", "path": "p"}
    out = _prepare_value_overrides(with_url, list(parse_overrides(["reward.params.scorer=model"])))
    assert "~reward.params.scorer_params.url" in out  # the judge's url: the model scorer has none
    assert not any("scorer_params.path" in o for o in out)  # both take path: kept


@pytest.mark.parametrize("extra, says", [
    ([], "Summed: the grpo advantage sees one reward per row"),
    (["algo.advantage.name=capo"], "Per token, critic-free (advantage capo)"),
    (["algo=ppo"], "Per token: every token's reward enters the critic's advantage (gae)"),
])
def test_explain_says_how_a_process_reward_reaches_the_advantage(extra, says):
    """reward=process under group advantages is summed per row (not CAPO's token-level credit); explain says so."""
    from mixrl.explain.render import explain_lines

    text = " ".join(t for label, t in explain_lines(compose_config(["reward=process", *extra])) if label == "reward")
    assert says in text
