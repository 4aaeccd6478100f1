"""The ``sampler`` config group: composition, one-line refusals (exit 2, nothing created), and
``mixrl explain`` / ``mixrl config show`` with and without a sampler."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from mixrl.cli.main import app
from mixrl.config.compose import compose_config, group_options, to_yaml
from mixrl.errors import ConfigError

runner = CliRunner()


def test_group_options_and_defaults():
    assert {"none", "dynamic", "balanced", "thompson", "curriculum"} <= set(group_options("sampler"))
    cfg = compose_config(["sampler=dynamic"])
    assert cfg.sampler.keep.name == "nonzero_variance" and cfg.sampler.keep.eps == 1e-6  # defaults filled in
    assert cfg.sampler.max_rounds == 3
    assert "sampler:" in to_yaml(cfg) and "sampler:" in to_yaml(compose_config([]))  # the run's config.yaml has it
    shown = runner.invoke(app, ["config", "show"])
    assert shown.exit_code == 0 and "\nsampler:" not in shown.output and "\nalgo:" in shown.output  # config show leaves none out
    shown = runner.invoke(app, ["config", "show", "sampler=dynamic"])
    assert "\nsampler:\n  name: dynamic\n" in shown.output


@pytest.mark.parametrize("overrides, words", [
    (["sampler=dynamic", "sampler.max_rounds=0"], "sampler.max_rounds=0 is out of range"),
    (["sampler=thompson", "sampler.decay=1.5"], "sampler.decay=1.5 is out of range"),
    (["sampler=thompson", "sampler.pick.target=0"], "sampler.pick.target=0 is out of range"),
    (["sampler=balanced", "sampler.keep.lo=0.9", "sampler.keep.hi=0.2"], "sampler.keep.lo=0.9 is above sampler.keep.hi=0.2"),
    (["sampler=curriculum", "sampler.pick.temperature=0"], "sampler.pick.temperature=0 is out of range"),
    (["sampler.max_rounds=3"], "sampler.keep.name=all keeps every group"),
    (["sampler=dynamic", "sampler.arms_column=level"], "sampler.arms_column=level names the bandit's arms"),
    (["sampler=dynamic", "hardware=cpu-2proc"], "runs on one training process"),
    (["sampler.pick.name=thompsn"], "unknown prompt picker 'thompsn' for sampler.pick.name (did you mean: thompson?)"),
    (["sampler=dynamc"], "unknown sampler option 'dynamc'"),
    (["sampler=dynamic", "+sampler.rows.pf={name: reward_extremes, k: 0}"], "sampler.rows.pf.k=0 is out of range"),
    # a length schedule is the generation's length at each step; TRL caps it at trainer.max_completion_length
    (["sampler=curriculum", "sampler.length={name: linear, start: 16, end: 64, steps: 100}"],
     "sampler.length={name: linear, start: 16, end: 64, steps: 100} reaches 45 tokens (step 60), above "
     "trainer.max_completion_length=32, which caps every completion; keep the schedule at or below 32, or set "
     "trainer.max_completion_length=45"),
    (["sampler=curriculum", "sampler.length=40"], "sampler.length=40 reaches 40 tokens (step 0)"),
    (["sampler=curriculum", "sampler.length={name: linear, start: 0, end: 32, steps: 10}"],
     "gives 0 tokens at step 0; a completion needs at least 1 token"),
])
def test_bad_sampler_settings_are_one_line(overrides, words):
    with pytest.raises(ConfigError) as e:
        compose_config(overrides)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_length_schedule_within_the_cap_composes():
    cfg = compose_config(["sampler=curriculum", "sampler.length={name: linear, start: 8, end: 32, steps: 50}"])  # the example in docs/concepts/samplers.md
    assert cfg.sampler.length.end == 32
    compose_config(["sampler=curriculum", "sampler.length={name: linear, start: 16, end: 64, steps: 100}",
                    "trainer.max_completion_length=45"])


def test_train_refuses_before_creating_anything(tmp_path):
    run_dir = tmp_path / "run"
    res = runner.invoke(app, ["train", "sampler=dynamic", "sampler.max_rounds=0", f"run_dir={run_dir}"])
    assert res.exit_code == 2 and "sampler.max_rounds=0" in res.output
    assert len(res.output.strip().splitlines()) == 1 and not run_dir.exists()


def test_explain_shows_the_sampler():
    """(Without a sampler, explain prints what it printed before: tests/pins/snapshots/explain.)"""
    res = runner.invoke(app, ["explain", "sampler=dynamic"])
    assert res.exit_code == 0
    assert "  sampler     dynamic: prompts: data:" in res.output
    assert "groups kept: nonzero_variance: keep(x) = max_i r_i - min_i r_i > 1e-06; up to 3 generation rounds" in res.output
    res = runner.invoke(app, ["explain", "sampler=thompson", "+sampler.rows.alol={name: nonnegative_advantage}"])
    assert "prompts: thompson: theta_i ~ Beta(a0 + s_i, b0 + f_i); pick the n smallest |theta_i - 0.5|" in res.output
    assert "counts decayed by 0.9" in res.output
    assert "rows (alol): nonnegative_advantage: keep(y_i) = A_i >= 0" in res.output
