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
