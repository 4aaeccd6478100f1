"""The worked example of docs/extending.md: a new source and a new term, added without
editing mixrl, compose, explain, validate and train."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mixrl.config.compose import compose_config
from mixrl.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "answer_source.py"
OVERRIDES = ["plugins=[answer_source]", "algo=chord", "offpolicy.source.name=answers", "algo.terms.sft.name=focal_nll",
             "algo.terms.sft.tokens=[answer]", "algo.terms.sft.gamma=1.0"]


@pytest.fixture(scope="module")
def example():
    """The example on sys.path, as a user's PYTHONPATH would put it; `plugins=[...]` imports it."""
    sys.path.insert(0, str(EXAMPLE.parent))
    yield
    sys.path.remove(str(EXAMPLE.parent))


def test_example_is_under_60_lines():
    assert len(EXAMPLE.read_text().splitlines()) < 60


def test_plugins_are_imported_before_validation(example):
    from mixrl.core.terms import TERMS
    from mixrl.sources import SOURCES

    compose_config(OVERRIDES)
    assert "answers" in SOURCES and "focal_nll" in TERMS
    with pytest.raises(ConfigError, match="plugins: could not import 'no_such_plugin'"):
        compose_config(["plugins=[no_such_plugin]"])


def test_focal_nll_by_hand(example):
    compose_config(OVERRIDES)  # imports the plugin
    from mixrl.core.objective import Objective, TermSpec, compute_objective
    from mixrl.core.provenance import code

    logp = torch.tensor([[-0.2, -1.5]], requires_grad=True)
    src = torch.full((1, 2), code("answer"))
    obj = Objective([TermSpec("sft", "focal_nll", ("answer",), None, 1.0, "token-mean", {}, {"gamma": 2.0})])
    loss, _ = compute_objective(obj, logp=logp, mask=torch.ones(1, 2), advantages=torch.zeros(1), token_source=src)
    w = [(1 - math.exp(x)) ** 2 for x in (-0.2, -1.5)]
    assert loss.item() == pytest.approx((w[0] * 0.2 + w[1] * 1.5) / 2, rel=1e-6)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-w[0] / 2, -w[1] / 2], rel=1e-6)


def test_example_composes_and_explains(example):
    from mixrl.explain import explain_text

    cfg = compose_config(OVERRIDES)
    assert cfg.algo.terms.sft.gamma == 1.0 and "token_weight" not in cfg.algo.terms.sft
    text = explain_text(cfg)
    assert "focal_nll" in text and "answers" in text and "(1 - p_t)^1" in text


def test_a_ratio_term_on_answer_tokens_is_rejected(example):
    with pytest.raises(ConfigError, match="no behaviour"):
        compose_config([*OVERRIDES, "algo.terms.policy.tokens=[on_policy,answer]"])


def test_answers_need_a_term_that_trains_them(example):
    with pytest.raises(ConfigError, match="'expert' tokens, but nothing puts them in the batch"):
        compose_config(["plugins=[answer_source]", "algo=chord", "offpolicy.source.name=answers"])
    with pytest.raises(ConfigError, match="adds 'answer' tokens but no term trains on them"):
        compose_config(["plugins=[answer_source]", "algo=chord", "offpolicy.source.name=answers", "algo.terms.sft.tokens=[on_policy]"])


@pytest.mark.slow
def test_example_trains_two_steps_through_the_cli(example, fast_overrides, tmp_path):
    """As a user runs it: `PYTHONPATH=docs/examples mixrl train plugins=[answer_source] ...`."""
    run_dir = tmp_path / "answers"
    args = [*OVERRIDES, *[o for o in fast_overrides if not o.startswith("run_dir=")], f"run_dir={run_dir}",
            "trainer.eval_size=0", "algo.inject.rows=4"]
    env = {**os.environ, "PYTHONPATH": str(EXAMPLE.parent), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "mixrl.cli.main", "train", *args], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(rows) == 2
    assert all(r["answer/rows"] == 4 and math.isfinite(r["loss/sft"]) and r["loss/sft"] > 0 for r in rows)
