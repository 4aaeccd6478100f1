"""``algo.engine_correction``: TRL's defaults, the objective and TRL arguments it builds,
``mixrl explain`` rows, one-line errors for bad values."""

from __future__ import annotations

import dataclasses
import re

import pytest
from typer.testing import CliRunner

from mixrl.cli.main import app
from mixrl.config.compose import compose_config
from mixrl.config.builders import build_objective
from mixrl.errors import ConfigError
from mixrl.explain import explain_text

VLLM = ["hardware.use_vllm=true", "hardware.device=cuda"]


def _trl_default(name: str):
    from trl import GRPOConfig

    return next(f.default for f in dataclasses.fields(GRPOConfig) if f.name == name)


def test_defaults_are_trls():
    node = compose_config([]).algo.engine_correction
    assert bool(node.enabled) is _trl_default("vllm_importance_sampling_correction") is True
    assert node.mode == _trl_default("vllm_importance_sampling_mode") == "sequence_mask"
    assert node.c_min is _trl_default("vllm_importance_sampling_clip_min") is None
    assert float(node.c_max) == _trl_default("vllm_importance_sampling_clip_max") == 3.0


def test_objective_has_the_correction_only_when_vllm_generates():
    assert build_objective(compose_config([])).engine_correction is None  # vLLM off: nothing changes
    c = build_objective(compose_config(VLLM)).engine_correction
    assert (c.mode, c.c_min, c.c_max) == ("sequence_mask", None, 3.0)
    c = build_objective(compose_config([*VLLM, "algo.engine_correction.mode=token_truncate",
                                        "algo.engine_correction.c_min=0.5", "algo.engine_correction.c_max=2"])).engine_correction
    assert (c.mode, c.c_min, c.c_max) == ("token_truncate", 0.5, 2.0)
    assert build_objective(compose_config([*VLLM, "algo.engine_correction.enabled=false"])).engine_correction is None
    assert build_objective(compose_config([*VLLM, "algo=chord"])).engine_correction is not None


def test_trl_arguments_follow_the_config(tmp_path):
    from mixrl.trainer.build import grpo_args

    args = grpo_args(compose_config(["algo.engine_correction.mode=token_mask", "algo.engine_correction.c_min=0.25",
                                     "algo.engine_correction.enabled=false"]), tmp_path)
    assert args.vllm_importance_sampling_correction is False
    assert args.vllm_importance_sampling_mode == "token_mask"
    assert (args.vllm_importance_sampling_clip_min, args.vllm_importance_sampling_clip_max) == (0.25, 3.0)


def test_explain_shows_the_correction_with_vllm():
    text = explain_text(compose_config(VLLM))
    assert "per-token loss times the engine-mismatch weight w_t" in text
    assert ("engine      vLLM generates; sequence_mask: w = rho if C_min=none <= rho <= C_max=3, else 0 with "
            "rho = exp(sum_t (log pi_old - log pi_engine)) per row") in text
    off = explain_text(compose_config([*VLLM, "algo.engine_correction.enabled=false"]))
    assert "does not correct for it (algo.engine_correction.enabled=false)" in off
    assert "engine-mismatch" not in off
    plain = explain_text(compose_config([]))
    assert "engine" not in plain and "pi_engine" not in plain


@pytest.mark.parametrize("override,message", [
    ("algo.engine_correction.mode=token", "mode must be one of token_truncate, token_mask"),
    ("algo.engine_correction.c_min=4", "c_min (4) must be less than c_max (3)"),
    ("algo.engine_correction.c_max=-1", "c_max must be a finite number >= 0"),
])
def test_bad_values_are_one_line_errors(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        explain_text(compose_config([override]))  # checked with vLLM off too
    result = CliRunner().invoke(app, ["explain", override])
    assert result.exit_code == 2
    assert message.split(" (")[0] in result.output and len(result.output.strip().splitlines()) == 1


def test_unknown_key_is_refused():
    with pytest.raises(ConfigError, match="engine_correction"):
        compose_config(["algo.engine_correction.cap=2"])


def test_console_texts():
    from mixrl.cli.main import _summary_table
    from mixrl.trainer.callbacks import engine_mismatch_text

    assert engine_mismatch_text({"engine/logp_diff/mean": 0.0123, "engine/masked_frac": 0.25}) == "|dlogp| 0.0123, 25% masked"
    assert engine_mismatch_text({"engine/logp_diff/mean": 0.5, "engine/truncated_frac": 0.0}) == "|dlogp| 0.5, 0% truncated"
    assert engine_mismatch_text({"reward_mean": 1.0}) is None
    summary = {"algo": "grpo", "seed": 0, "steps": 3, "rollouts": 12, "wall_seconds": 1.0, "setup_seconds": 0.5,
               "train_seconds": 0.5, "eval_before": {}, "eval_after": {"n": 8}, "final_metrics": {"reward_mean": 0.5}}
    assert "vLLM" not in _summary_table(summary).caption
    summary["final_metrics"].update({"engine/logp_diff/mean": 0.02, "engine/masked_frac": 0.1})
    assert _summary_table(summary).caption.endswith("; vLLM vs trainer log-probs (last step): |dlogp| 0.02, 10% masked")
