"""Every loss-family preset in conf/algo/ composes with its paper defaults and trains
end-to-end on the built-in task for two steps."""

from __future__ import annotations

import json
import math

import pytest

from mixrl.config.compose import compose_config

PRESETS = ["grpo", "dr_grpo", "gspo", "cispo", "topr", "sapo", "m2po", "bapo"]
#: presets checked for composition and paper header only (their recipes train; suite budget)
COMPOSE_ONLY = ["clip_cov", "kl_cov", "gmpo"]

#: the defaults each preset must carry (paper / reference-implementation values)
EXPECTED = {
    "grpo": {"loss.name": "ppo_clip", "loss.clip_low": 0.2, "loss.clip_high": 0.2, "advantage.name": "grpo"},
    "dr_grpo": {
        "loss.name": "ppo_clip",
        "advantage.name": "dr_grpo",
        "aggregation.name": "seq-mean-token-sum-norm",
    },
    "gspo": {
        "loss.name": "gspo",
        "loss.clip_low": 3e-4,
        "loss.clip_high": 4e-4,
        "aggregation.name": "seq-mean-token-mean",
    },
    "cispo": {"loss.name": "cispo", "loss.clip_low": 1.0, "loss.clip_high": 0.28, "aggregation.name": "token-mean"},
    "topr": {"loss.name": "topr", "advantage.name": "reinforce", "kl.coef": 0.0},
    "sapo": {"loss.name": "sapo", "loss.tau_pos": 1.0, "loss.tau_neg": 1.05},
    "m2po": {"loss.name": "m2po", "loss.m2_budget": 0.04, "aggregation.name": "token-mean"},
    "bapo": {"loss.name": "ppo_clip", "controller.name": "bapo", "controller.rho0": 0.5, "controller.high_max": 3.0},
    "clip_cov": {"loss.name": "clip_cov", "loss.clip_ratio": 2e-4, "loss.cov_lower": 1.0, "loss.cov_upper": 5.0,
                 "loss.clip_low": None, "aggregation.name": "token-mean"},
    "kl_cov": {"loss.name": "kl_cov", "loss.kl_ratio": 2e-4, "loss.kl_coef": 1.0, "aggregation.name": "token-mean"},
    "gmpo": {"loss.name": "gmpo", "loss.clip_low": 0.4, "loss.clip_high": 0.4, "aggregation.name": "seq-mean-token-mean"},
}


def _get(node, dotted):
    for part in dotted.split("."):
        node = node[part]
    return node


@pytest.mark.parametrize("name", PRESETS + COMPOSE_ONLY)
def test_preset_composes_with_paper_defaults(name):
    cfg = compose_config([f"algo={name}"])
    assert cfg.algo.name == name
    assert cfg.algo.inject.name == "none" and cfg.offpolicy.source.name == "none"
    assert list(cfg.algo.terms) == ["policy"] and cfg.algo.terms.policy.tokens == ["on_policy"]
    for key, value in EXPECTED[name].items():
        got = _get(cfg.algo, key)
        assert got == pytest.approx(value) if isinstance(value, float) else got == value, (key, got)


@pytest.mark.parametrize("name", [p for p in PRESETS + COMPOSE_ONLY if p != "grpo"])
def test_preset_file_names_its_paper(name):
    from mixrl.config.compose import conf_dir

    text = (conf_dir() / "algo" / f"{name}.yaml").read_text()
    header = "".join(line for line in text.splitlines(True) if line.startswith("#"))
    assert "Changes vs grpo" in header and "20" in header  # a year: the paper is cited


def test_dr_grpo_max_len_follows_max_completion_length():
    from mixrl.config.builders import build_objective

    cfg = compose_config(["algo=dr_grpo", "trainer.max_completion_length=48"])
    assert build_objective(cfg).terms[0].aggregation_params == {"max_len": 48, "count_empty_rows": False}
    cfg = compose_config(["algo=dr_grpo", "algo.aggregation.max_len=100"])
    assert build_objective(cfg).terms[0].aggregation_params == {"max_len": 100, "count_empty_rows": False}


@pytest.mark.slow
@pytest.mark.parametrize("name", PRESETS)
def test_preset_trains_two_steps(name, fast_overrides):
    from mixrl.trainer.run import train

    # held-out evaluation is covered elsewhere; skipping it keeps each run to a few seconds
    result = train(compose_config([f"algo={name}", *fast_overrides, "trainer.eval_size=0"]))
    assert result.summary["steps"] == 2
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(rows) == 2
    for row in rows:
        losses = {k: v for k, v in row.items() if k == "loss" or k.startswith("loss/policy")}
        assert "loss" in losses and "loss/policy" in losses, sorted(row)
        assert all(math.isfinite(v) for v in losses.values()), losses
    if name == "bapo":
        assert 1.2 <= rows[-1]["bapo/ratio_high"] <= 3.0
