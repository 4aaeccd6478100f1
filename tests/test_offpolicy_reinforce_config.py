"""The opmd / asymre / rec / vespo presets compose with their papers' defaults, and a bad
string option of these losses is one line at compose time (exit 2), like a bad number."""

import pytest

from mixrl.config.compose import compose_config
from mixrl.errors import ConfigError

EXPECTED = {
    "opmd": {"name": "opmd", "form": "k2", "tau": 0.2},
    "asymre": {"name": "asymre", "baseline_shift": -0.1},
    "rec": {"name": "rec", "clip_mode": "one-side", "weight": "none", "clip_low": 0.2, "clip_high": 0.2},
    "vespo": {"name": "vespo", "k_pos": 2.0, "lambda_pos": 3.0, "k_neg": 3.0, "lambda_neg": 2.0},
}


@pytest.mark.parametrize("algo", sorted(EXPECTED))
def test_preset_defaults(algo):
    cfg = compose_config([f"algo={algo}"])
    assert {k: cfg.algo.loss[k] for k in EXPECTED[algo]} == EXPECTED[algo]
    assert cfg.algo.advantage.name == ("grpo" if algo == "vespo" else "dr_grpo")


@pytest.mark.parametrize("override, key", [
    ("algo.loss.clip_mode=gspo-one-side", "algo.loss.clip_mode must be one of none, one-side, two-side, ring"),
    ("algo.loss.weight=is", "algo.loss.weight must be one of"),
    ("algo.loss.regularizer=kl", "algo.loss.regularizer must be one of"),
])
def test_rec_bad_option_is_one_line(override, key):
    with pytest.raises(ConfigError) as e:
        compose_config(["algo=rec", override])
    assert str(e.value).startswith(key) and "\n" not in str(e.value).strip()


def test_opmd_bad_form_and_asymre_positive_shift_are_rejected():
    with pytest.raises(ConfigError, match="algo.loss.form must be one of k2, trinity"):
        compose_config(["algo=opmd", "algo.loss.form=kimi"])
    with pytest.raises(ConfigError, match="baseline_shift"):
        compose_config(["algo=asymre", "algo.loss.baseline_shift=0.2"])
