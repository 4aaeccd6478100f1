"""Two-step training runs of the methods of issue 25 part 2 (A-LoL, PALU, SRPO, RL-PLUS) on the
built-in task with the FAST overrides: each trains, logs its own metrics, and reads what its
terms need (reference log-probs on expert rows, teacher log-probs on failed rows...)."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from mixrl.config.compose import compose_config


def _train(overrides: list[str]):
    from transformers import set_seed

    from mixrl.trainer import build

    cfg = compose_config([*overrides, "trainer.save_steps=0"])
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    set_seed(0)
    trainer = build.trainer_from_config(cfg)
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.train()
    moved = any(not torch.equal(before[k], v.detach()) for k, v in trainer.model.named_parameters())
    logs = [r for r in trainer.state.log_history if "loss/total" in r]
    return trainer, logs, moved


def test_alol_trains_offline_on_expert_rows_against_the_reference(fast_overrides):
    trainer, logs, moved = _train([*fast_overrides, "recipe=alol/arith-tiny"])
    assert len(logs) == 2 and moved
    assert all(math.isfinite(r["loss/offline"]) for r in logs)
    # the policy is the reference at the first step: every kept row's sequence weight is exactly 1
    # (reference log-probs were computed on the expert rows, not taken as the policy's own)
    first = logs[0]
    assert 0.0 < first["alol/kept"] <= 1.0  # the expert rows beat the rollouts' mean reward somewhere
    assert abs(first["alol/weight"] - 1.0) < 1e-4
    assert first["expert/rows"] > 0


REWARD = "def half(prompts, completions, **kw):\n    return [float(len(c) % 2 == 0) for c in completions]\n"


def test_palu_controller_sets_a_budget_from_the_rollouts(fast_overrides, tmp_path):
    """A reward that marks about half the rollouts correct (even length). target 0: the constraint
    always holds, so the multiplier sits at 0 and the budget moves to the correct rollouts' lengths;
    target 1: it never holds, the multiplier sits at its upper extreme and no budget is set."""
    (tmp_path / "half.py").write_text(REWARD)
    reward = f"reward.name={tmp_path / 'half.py'}:half"
    trainer, logs, moved = _train([*fast_overrides, "recipe=palu/arith-tiny", "algo.controller.target=0", reward])
    assert len(logs) == 2 and moved
    assert all(r["palu/lambda"] == 0.0 for r in logs)
    c = trainer.parts.controller.controller
    assert c.num_updates == 2 and c.lam == 0.0
    assert 1 <= c.budget <= 24 and logs[-1]["palu/budget"] == c.budget
    assert 0 < logs[0]["palu/accuracy"] < 1
    trainer, logs, _ = _train([*fast_overrides, "recipe=palu/arith-tiny", "algo.controller.target=1", reward,
                               f"run_dir={tmp_path / 'run-2'}"])
    assert all(r["palu/lambda"] == 1.0 for r in logs) and trainer.parts.controller.controller.budget is None


def test_srpo_routes_failed_rollouts_to_weighted_self_distillation(fast_overrides, tmp_path):
    """With about half the rollouts correct, both routes train: the policy term on correct rollouts,
    the distillation on failed ones, weighted by the self-teacher's entropies (in (0, 1])."""
    (tmp_path / "half.py").write_text(REWARD)
    trainer, logs, moved = _train([*fast_overrides, "recipe=srpo/arith-tiny", f"reward.name={tmp_path / 'half.py'}:half"])
    assert len(logs) == 2 and moved
    for r in logs:
        assert r["srpo/failed_rows"] > 0 and math.isfinite(r["loss/distill"]) and math.isfinite(r["loss/policy"])
        assert 0.0 < r["srpo/weight"] <= 1.0 and r["srpo/teacher_entropy"] > 0.0
        assert r["failed/rows"] == r["srpo/failed_rows"]


def test_rl_plus_trains_rollouts_and_external_rows(fast_overrides):
    trainer, logs, moved = _train([*fast_overrides, "recipe=rl_plus/arith-tiny"])
    assert len(logs) == 2 and moved
    for r in logs:
        assert r["expert/rows"] > 0 and math.isfinite(r["loss/external"]) and math.isfinite(r["loss/policy"])
        # first pass: pi_old = p, so r = p / (p / 2 + 1 / 2) lies in (0, 1]; C = 1 - p in [0, 1)
        assert 0.0 < r["rlplus/ratio"] <= 1.0 + 1e-6 and 0.0 <= r["rlplus/explore"] < 1.0


def test_soup_continues_historical_prefixes_on_policy(fast_overrides, tmp_path):
    """Step 1 stores rollouts; steps 2-3 revisit their prompts and continue prefixes of them, whose
    tokens are trained with a ratio against the log-probs they were sampled with."""
    (tmp_path / "half.py").write_text(REWARD)
    trainer, logs, moved = _train([*fast_overrides, "recipe=soup/arith-tiny", "trainer.max_steps=3", "algo.inject.per_group=2",
                                   f"reward.name={tmp_path / 'half.py'}:half"])
    assert len(logs) == 3 and moved
    assert logs[0].get("soup/prefixed_rows", 0.0) == 0.0  # an empty buffer: nothing historical yet
    later = logs[1:]
    assert any(r.get("soup/prefixed_rows", 0.0) > 0 for r in later)
    assert any(r.get("historical/rows", 0.0) > 0 for r in later)
    for r in later:
        if r.get("historical/rows", 0.0) > 0:
            assert math.isfinite(r["historical/token_prob"]) and math.isfinite(r["loss/policy"])


def test_reference_terms_on_rows_appended_after_scoring_are_refused():
    """A-LoL reads reference log-probs on expert rows: group_replace puts them in the batch TRL
    scores (allowed); append_rows adds them after, where none are computed (one-line refusal)."""
    import pytest

    from mixrl.errors import ConfigError

    assert compose_config(["algo=alol"]).algo.inject.name == "group_replace"
    with pytest.raises(ConfigError, match="needs reference log-probs"):
        compose_config(["algo=alol", "algo.inject.name=append_rows"])


def test_palu_without_a_policy_term_is_refused():
    import pytest

    from mixrl.errors import ConfigError

    with pytest.raises(ConfigError, match="no policy term"):
        compose_config(["algo=opsd", "+algo.controller={name: palu}"])


EXPLAINED = {  # recipe -> what `mixrl explain` must state of its objective
    "alol/arith-tiny": ["L = offline[expert]", "w = clip(pi_theta(y|x) / pi_ref(y|x), 1 - 0.2, 1 + 0.2)", "1[A > 0]"],
    "palu/arith-tiny": ["lambda = lambda_max if P < 0.2 else 0", "quantile_0.8", "sets the rollouts' rewards, before the advantages"],
    "srpo/arith-tiny": ["L = policy[on_policy] + distill[failed]", "exp(-H_T,t / 1)", "R_1(y_i) >= 1 else failed"],
    "rl_plus/arith-tiny": ["L = policy[on_policy] + external[expert]", "r_t = p_t / (0.75 sg(pi_old(e_t)) + (1 - 0.75) 1)", "(1 - sg(p_t))^0.5"],
    "soup/arith-tiny": ["L = policy[on_policy + historical]", "p_t / pi_hist(h_t) on the prefix", "u ~ U[0.2, 0.8]"],
}


def test_explain_states_each_new_objective():
    from typer.testing import CliRunner

    from mixrl.cli.main import app

    runner = CliRunner()
    for recipe, parts in EXPLAINED.items():
        res = runner.invoke(app, ["explain", f"recipe={recipe}"])
        assert res.exit_code == 0, res.output
        text = " ".join(res.output.split())
        for part in parts:
            assert part in text, f"{recipe}: {part!r} not in explain"
