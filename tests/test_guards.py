"""Run-health guards (collapse warnings, interrupts, divergence) and the reward output check."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from mixrl.errors import RewardError, TrainingDiverged
from mixrl.rewards.registry import CheckedReward
from mixrl.trainer.guards import CollapseWatch, DivergenceGuard, InterruptGuard


def _watch():
    seen = []
    return CollapseWatch(warn=seen.append, window=3), seen


def test_reward_collapse_warns_once_after_it_stays_low():
    w, seen = _watch()
    rewards = [0.4, 0.5, 0.6, 0.6, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    for step, r in enumerate(rewards, 1):
        w.observe(step, {"reward_mean": r, "grad_norm": 1.0}, learning_rate=1e-2)
    assert len(seen) == 1 and seen == w.warnings
    assert seen[0].startswith("warning: reward collapsed by step") and "learning rate 0.01" in seen[0]


def test_a_dip_that_recovers_is_not_a_collapse():
    w, seen = _watch()
    for step, r in enumerate([0.5, 0.5, 0.5, 0.1, 0.5, 0.5, 0.1, 0.5, 0.5, 0.5], 1):
        w.observe(step, {"reward_mean": r})
    assert seen == []


def test_heldout_accuracy_collapse_needs_two_low_evaluations():
    w, seen = _watch()
    w.observe(10, {"eval/accuracy": 0.17})
    w.observe(20, {"eval/accuracy": 0.02})
    assert seen == []
    w.observe(30, {"eval/accuracy": 0.0})
    assert len(seen) == 1 and "held-out accuracy collapsed" in seen[0] and "0.170" in seen[0]


def test_accuracy_far_below_its_start_after_training_warns():
    w, seen = _watch()
    w.final_check(0.168, 0.15)
    assert seen == []
    w.final_check(0.168, 0.0, learning_rate=1e-2)
    assert seen == ["warning: held-out accuracy fell from 0.168 before training to 0.000 after (learning rate 0.01 may be too high)"]


def test_vanishing_gradients_warn_after_window_steps():
    w, seen = _watch()
    for step in range(1, 3):
        w.observe(step, {"grad_norm": 0.0})
    assert seen == []
    w.observe(3, {"grad_norm": 0.0})
    assert len(seen) == 1 and "gradients vanished" in seen[0]


def test_nonfinite_gradient_saves_then_raises_one_line():
    model = torch.nn.Linear(2, 1)
    model(torch.ones(1, 2)).sum().backward()
    guard = DivergenceGuard(save=lambda: "ckpt-7")

    class Args:
        learning_rate = 3.0

    class State:
        global_step = 7

    guard.on_pre_optimizer_step(Args, State, None, model=model)  # finite: nothing happens
    model.weight.grad[0, 0] = float("nan")
    with pytest.raises(TrainingDiverged) as e:
        guard.on_pre_optimizer_step(Args, State, None, model=model)
    msg = str(e.value)
    assert "\n" not in msg and "step 8" in msg and "gradient" in msg and "learning rate (3)" in msg and "ckpt-7" in msg
    with pytest.raises(TrainingDiverged, match="the loss is not finite"):
        guard.on_log(Args, State, None, logs={"loss": float("inf")})


def test_first_signal_requests_a_checkpoint_second_quits():
    said = []
    before = signal.getsignal(signal.SIGINT)  # default_int_handler; SIG_IGN when pytest runs in the background
    guard = InterruptGuard(say=said.append).install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert guard.signum == signal.SIGTERM and "saving a checkpoint" in said[0]

        class Control:
            should_save = should_training_stop = False

        guard.on_step_end(None, None, Control)
        assert Control.should_save and Control.should_training_stop
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        guard.restore()
    assert signal.getsignal(signal.SIGINT) is before  # restored as it was


def _reward(fn):
    return CheckedReward(fn, "my_rewards:score")


def test_reward_that_raises_names_the_function_and_row():
    def score(prompts, completions, **kw):
        return [1.0 / len(c) for c in completions]  # ZeroDivisionError on an empty completion

    with pytest.raises(RewardError) as e:
        _reward(score)(prompts=["a", "b", "c"], completions=["x", "", "y"])
    msg = str(e.value)
    assert "'my_rewards:score' raised ZeroDivisionError" in msg and "row 1 (prompt 'b')" in msg and "\n" not in msg


@pytest.mark.parametrize("out, expected", [
    ("1.0", "returned str, not a list"),
    ([1.0], "returned 1 values for 2 completions"),
    ([1.0, "good"], "returned str 'good' on row 1"),
    ([float("nan"), 1.0], "returned nan on row 0"),
    ([1.0, float("inf")], "returned inf on row 1"),
])
def test_reward_output_is_checked(out, expected):
    with pytest.raises(RewardError) as e:
        _reward(lambda prompts, completions, **kw: out)(prompts=["p", "q"], completions=["a", "b"])
    assert expected in str(e.value)


def test_good_rewards_pass_through_unchanged_and_keep_their_name():
    def score(prompts, completions, **kw):
        return [1, None]

    wrapped = _reward(score)
    assert wrapped(["p", "q"], ["a", "b"]) == [1, None]
    assert wrapped.__name__ == "score"


# --------------------------------------------------------------------------- magnitude guard
def _luffy_case_inputs(advantages):
    """A micro-batch of LUFFY's central case: group 0's three rollouts all fail, its expert row
    (row 3) succeeds; group 1 is an ordinary group."""
    from mixrl.core import provenance as prov

    on, ex = prov.code("on_policy"), prov.code("expert")
    return {
        "advantages": advantages,
        "row_source": torch.tensor([on, on, on, ex, on, on, on, ex]),
        "group_id": torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]),
        "completion_ids": torch.zeros(8, 3, dtype=torch.long),
        "completion_mask": torch.ones(8, 3),
    }


def test_magnitude_guard_fires_on_the_old_grpo_split_number_and_passes_luffys():
    from mixrl.core import ADVANTAGES
    from mixrl.trainer.magnitude import MagnitudeExceeded, check_advantages

    rewards = torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    inc = torch.tensor([True, True, True, False, True, True, True, False])
    # before the fix: (1 - 0) / (0 + 1e-6) on the expert row of group 0
    old = ADVANTAGES.get("grpo")(rewards, groups, include=inc).clone()
    old[3] = (1.0 - 0.0) / (0.0 + 1e-6)
    with pytest.raises(MagnitudeExceeded) as e:
        check_advantages(old, _luffy_case_inputs(old), 1000.0, step=4)
    msg = str(e.value)
    assert "\n" not in msg and isinstance(e.value, TrainingDiverged) and e.value.exit_code == 3
    assert msg.startswith("training diverged at step 4: the advantage of 1 row (expert; group 0) is 1e+06 in magnitude")
    assert "trainer.max_abs_advantage=1000" in msg and "raise trainer.max_abs_advantage" in msg
    # after it: LUFFY's number, 1 / (1 + 1e-6), flows
    new = ADVANTAGES.get("grpo")(rewards, groups, include=inc)
    assert new[3].item() == pytest.approx(1 / (1 + 1e-6))
    check_advantages(new, _luffy_case_inputs(new), 1000.0, step=4)
    check_advantages(old, _luffy_case_inputs(old), None, step=4)  # null: no bound on finite values
    # bound 0.5: group 0's expert row (1 / (1 + 1e-6)) and all of group 1 (rollouts [1, 0, 1]: mean 2/3,
    # std sqrt(1/3), |A| 0.577 and 1.155; expert 0.577) are above it
    with pytest.raises(MagnitudeExceeded, match=r"the advantage of 5 rows \(expert x2, on_policy x3; groups 0, 1\) is 1.15 in magnitude"):
        check_advantages(new, _luffy_case_inputs(new), 0.5, step=1)


def test_magnitude_guard_per_token_advantages_and_non_finite():
    from mixrl.trainer.magnitude import MagnitudeExceeded, check_advantages

    adv = torch.zeros(8, 3)
    adv[5, 2] = float("inf")
    adv[6, 1] = 5e3  # off the completion mask below: not looked at
    inputs = _luffy_case_inputs(adv)
    inputs["completion_mask"][6, 1] = 0
    with pytest.raises(MagnitudeExceeded, match=r"the advantage of 1 row \(on_policy; group 1\) is not finite"):
        check_advantages(adv, inputs, None, step=2)


def test_magnitude_guard_names_the_loss_term():
    from mixrl.trainer.magnitude import MagnitudeExceeded, check_losses

    inputs = _luffy_case_inputs(torch.zeros(8))
    check_losses({"loss/policy": 3.0, "loss/total": 1e9, "clip_frac": 1e9}, inputs, 1e4, step=1)  # total and other metrics: not terms
    with pytest.raises(MagnitudeExceeded) as e:
        check_losses({"loss/policy": 3.0, "loss/offpolicy": -2e5}, inputs, 1e4, step=3, learning_rate=1e-2)
    msg = str(e.value)
    assert msg.startswith("training diverged at step 3: loss term 'offpolicy' on a micro-batch of 8 rows (expert x2, on_policy x6; groups 0, 1) is -2e+05")
    assert "trainer.max_abs_loss=10000" in msg and "learning rate (0.01)" in msg
    with pytest.raises(MagnitudeExceeded, match="loss term 'policy' .* is not finite"):
        check_losses({"loss/policy": float("nan")}, inputs, None, step=1)


def test_magnitude_bounds_from_config():
    from omegaconf import OmegaConf

    from mixrl.config.compose import compose_config
    from mixrl.errors import ConfigError
    from mixrl.trainer.magnitude import MagnitudeBounds

    cfg = compose_config([])
    assert MagnitudeBounds.from_config(cfg.trainer) == MagnitudeBounds(1000.0, 1e6)
    cfg = compose_config(["trainer.max_abs_advantage=null", "trainer.max_abs_loss=50"])
    assert MagnitudeBounds.from_config(cfg.trainer) == MagnitudeBounds(None, 50.0)
    with pytest.raises(ConfigError, match=r"trainer.max_abs_advantage=0 is out of range: it must be > 0"):
        compose_config(["trainer.max_abs_advantage=0"])
    assert OmegaConf.select(cfg, "trainer.max_abs_loss") == 50


def test_a_schedulers_signal_twice_keeps_stopping_after_the_step_and_exits_to_requeue():
    """SLURM signals every process of a job and the launcher forwards its own copy: a second SIGTERM /
    SIGUSR1 must not quit in the middle of the checkpoint (only SIGINT does); the stop is a preemption."""
    said = []
    guard = InterruptGuard(say=said.append).install()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGTERM)  # ignored: stopping already
        assert guard.signum == signal.SIGUSR1 and len(said) == 1 and "Ctrl-C to quit now" in said[0]

        class Control:
            should_save = should_training_stop = False

        guard.on_step_end(None, None, Control)  # one process: the agreed signal is its own
        assert Control.should_save and Control.should_training_stop
        assert guard.agreed == signal.SIGUSR1 and guard.preempted and guard.name == "SIGUSR1"
    finally:
        guard.restore()
    ctrl_c = InterruptGuard(say=said.append)
    ctrl_c.signum = signal.SIGINT
    assert not ctrl_c.preempted  # Ctrl-C: exit 130, no requeue
