"""The reward a run shows (issue: TOPR's summary said "reward (last step) none" after a second-pass
step; PrefixRL's bar and summary disagreed): the progress bar and the run summary show the same
quantity, :data:`mixrl.trainer.callbacks.SHOWN_REWARD` (the mean reward of the policy's own
rollouts), of the last step that scored any, and a logged step's bar line carries its own numbers."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
from rich.console import Console
from transformers import TrainerControl

from mixrl.trainer.callbacks import SHOWN_REWARD, RichProgressCallback, last_reward, reward_text

#: two steps as TRL logs them with trainer.num_iterations=2: the first generates and scores
#: (TRL's `reward` is over every row, `reward_on_policy` over the policy's own), the second pass does not
LOGS = [{"loss": 0.1, "reward": 0.75, "reward_on_policy": 0.5, "accuracy": 0.5, "mu": 0.25},
        {"loss": 0.2}]


def _bar_lines(logs: list[dict]) -> list[str]:
    console = Console(file=io.StringIO(), force_terminal=False, width=200)
    cb = RichProgressCallback(console, description="topr")
    state = SimpleNamespace(is_world_process_zero=True, max_steps=len(logs), global_step=0)
    cb.on_train_begin(None, state, TrainerControl())
    for step, row in enumerate(logs, start=1):
        state.global_step = step
        control = TrainerControl(should_log=True)  # logging_steps=1: transformers calls on_step_end, then on_log
        cb.on_step_end(None, state, control)
        cb.on_log(None, state, control, logs=row)
    cb.on_train_end(None, state, TrainerControl())
    return console.file.getvalue().splitlines()


def test_each_bar_line_shows_its_own_steps_on_policy_reward_and_keeps_it_over_a_second_pass():
    lines = _bar_lines(LOGS)
    assert [ln.split(",")[0] for ln in lines] == ["topr: 1/2 (50%)", "topr: 2/2 (100%)"]
    # step 1's own numbers on step 1's line (before: the line was drawn before on_log, with none),
    # the on-policy reward 0.500, not TRL's 0.750 over every row
    assert "reward 0.500  acc 0.50  mu 0.25" in lines[0]
    assert "reward 0.500  acc 0.50  mu 0.25" in lines[1]  # the second pass scored nothing: step 1's stay


def test_the_summary_reward_is_the_last_scored_step_the_bar_showed():
    rows = [{"step": i, **row} for i, row in enumerate(LOGS, start=1)]
    last = last_reward(rows)
    assert SHOWN_REWARD == "reward_on_policy"
    assert last == {"metric": "reward_on_policy", "step": 1, "value": 0.5}  # before: the last row's reward_mean, absent
    assert reward_text({"steps": 2, "last_reward": last}) == "0.500 (step 1, the last that generated)"
    assert reward_text({"steps": 1, "last_reward": last}) == "0.500"
    shown = _bar_lines(LOGS)[-1]
    assert f"reward {last['value']:.3f}" in shown


def test_no_scored_step_says_none():
    rows = [{"step": 1, "loss": 0.1, "reward_on_policy": None}, {"step": 2}]  # e.g. an SFT-only method: no row of the policy's own
    assert last_reward(rows) is None
    assert reward_text({"last_reward": None}) == "none (no rollout of the policy's own was scored)"
    assert "reward" not in _bar_lines([{"loss": 0.1, "reward_on_policy": None}])[-1]


def test_the_summary_table_caption_reads_the_shown_reward():
    from mixrl.cli.main import _summary_table

    rows = [{"step": i, **row} for i, row in enumerate(LOGS, start=1)]
    summary = {"algo": "topr", "seed": 0, "steps": 2, "rollouts": 128, "wall_seconds": 1.0, "setup_seconds": 0.5,
               "train_seconds": 0.5, "eval_before": {}, "eval_after": {"n": 8}, "final_metrics": rows[-1],
               "last_reward": last_reward(rows)}
    assert "reward (last step) 0.500 (step 1, the last that generated);" in _summary_table(summary).caption
