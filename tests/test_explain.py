"""``mixrl explain``: the objective as text, schedule tables, the plot, contradictions."""

from __future__ import annotations

import math
import sys

import pytest
from typer.testing import CliRunner

from mixrl.cli.main import app
from mixrl.config.compose import compose_config
from mixrl.errors import ConfigError
from mixrl.explain import (
    check_objective,
    explain_text,
    objective_equation,
    schedule_rows,
    table_steps,
)

runner = CliRunner()

CHORD_LIKE = [
    "offpolicy=expert",
    "algo.mix.mode=aux_loss",
    "+algo.mix.mu={name: cosine, warmup: 10, peak: 0.5, decay: 30, valley: 0.02}",
    "+algo.mix.token_weight={name: chord_phi}",
    "algo.loss.dual_clip_c=3.0",
    "algo.loss.clip_high=0.28",
]
LUFFY_LIKE = [
    "offpolicy=expert",
    "algo.mix.mode=group_inject",
    "+algo.mix.shaping_gamma=0.1",
    "+algo.mix.experts_per_group=1",
    "algo.advantage.name=dr_grpo",
    "algo.entropy_coef=0.001",
]


def _cosine(step, warmup, peak, decay, valley):
    """CHORD's mu, by hand: linear warmup, cosine decay, then valley."""
    if step < warmup:
        return peak * step / warmup
    if step >= warmup + decay:
        return valley
    return valley + (peak - valley) * (1 + math.cos(math.pi * (step - warmup) / decay)) / 2


# --------------------------------------------------------------------------- text
def test_grpo_text():
    cfg = compose_config([])
    text = explain_text(cfg)
    assert objective_equation(cfg) == "L = PPOclip[eps_low=0.2, eps_high=0.2](rollouts)"
    assert "objective of algo=grpo (mix mode none)" in text
    assert "ppo_clip: l_t = max(-A r_t, -A clip(r_t, 0.8, 1.2))" in text
    assert "token-mean: sum of l_t over all rollout tokens" in text
    assert "grpo: A = (R - mean_g R) / (std_g R + 1e-06), std with n-1; group = the 8 completions of a prompt" in text
    assert "KL           none (algo.kl.coef = 0)" in text
    assert "entropy      none (algo.entropy_coef = 0)" in text
    assert "controller   none" in text
    assert "16 prompts x 8 generations = 128 rollouts/step" in text  # geometry(cfg).describe()
    assert "r_t = 1" in text  # note: num_iterations=1 makes the clip inactive


def test_chord_like_text():
    cfg = compose_config(CHORD_LIKE)
    assert objective_equation(cfg) == (
        "L = (1 - mu_t) * PPOclip[eps_low=0.2, eps_high=0.28, dual_c=3](rollouts)"
        " + mu_t * NLL * phi(p)=p(1-p) (expert rows)"
    )
    text = explain_text(cfg)
    assert "mu_t = cosine(warmup=10, peak=0.5, decay=30, valley=0.02)" in text
    assert "linear 0 -> 0.5 over steps 0..10, cosine 0.5 -> 0.02 over steps 10..40" in text
    assert "w = sg(p (1 - p))" in text
    assert "expert rows get no advantage" in text
    assert "dual clip for A < 0: l_t = min(l_t, -3 A)" in text
    assert "128 rollouts + 32 expert rows" in text  # expert_ratio 0.2 of all rows (rules.geometry)


def test_luffy_like_text():
    cfg = compose_config(LUFFY_LIKE)
    assert objective_equation(cfg) == (
        "L = token-mean[ PPOclip[eps_low=0.2, eps_high=0.2](rollout tokens) ; "
        "-A * f(p), f(p)=p/(p+0.1), no clip (expert tokens) ] - 0.001 * H(rollouts)"
    )
    text = explain_text(cfg)
    assert "dr_grpo: A = R - mean_g R (no std division)" in text
    assert "group of 8 = 7 rollouts + 1 expert trace(s)" in text
    assert "expert rows counted in the statistics: yes" in text
    assert "gradient weight 0.1 p / (p + 0.1)^2 peaks at p = 0.1" in text
    assert "16 groups x (7 rollouts + 1 expert) = 112 rollouts + 16 expert rows" in text
    assert "over all rollout + expert tokens" in text
    excluded = compose_config([*LUFFY_LIKE, "algo.advantage_include_offpolicy=false"])
    assert "counted in the statistics: no" in explain_text(excluded)


def test_controller_presets_text():
    bapo = compose_config(["algo=bapo"])
    assert objective_equation(bapo) == "L = PPOclip[eps_low, eps_high <- BAPO](rollouts)"
    text = explain_text(bapo)
    assert "BAPO adaptive clipping" in text and "[c_low, c_high] = [0.6, 1.2]" in text
    assert ">= 0.5 of the clipped contribution" in text
    ent = compose_config(["+algo.controller.name=entropic", "+algo.controller.target=0.3"])
    assert objective_equation(ent).endswith(" - c_ent(t) * H(rollouts)")
    assert "EntroPIC PI controller: after each step e = 0.3 - H" in explain_text(ent)
    columns, _ = schedule_rows(ent)
    assert "entropy_coef" not in columns  # set by the controller, not a schedule


@pytest.mark.parametrize(
    "name, equation",
    [
        ("dr_grpo", "L = PPOclip[eps_low=0.2, eps_high=0.2](rollouts)"),
        ("gspo", "L = GSPOclip[eps_low=0.0003, eps_high=0.0004](rollouts)"),
        ("cispo", "L = CISPO[eps_low=1, eps_high=0.28](rollouts)"),
        ("topr", "L = TOPR(rollouts)"),
        ("sapo", "L = SAPOgate[tau_pos=1, tau_neg=1.05](rollouts)"),
        ("m2po", "L = M2PO[budget=0.04](rollouts)"),
    ],
)
def test_preset_equations(name, equation):
    cfg = compose_config([f"algo={name}"])
    assert objective_equation(cfg) == equation
    explain_text(cfg)  # no contradiction in any shipped preset


def test_dr_grpo_max_len_follows_max_completion_length():
    text = explain_text(compose_config(["algo=dr_grpo", "trainer.max_completion_length=40"]))
    assert "sum of l_t / max_len=40 (= trainer.max_completion_length)" in text
    assert "A = R - mean_g R" in text
    text = explain_text(compose_config(["algo=dr_grpo", "algo.aggregation.max_len=64"]))
    assert "sum of l_t / max_len=64)" in text


def test_kl_and_scheduled_entropy_terms():
    cfg = compose_config(["algo.kl.coef=0.04", "algo.entropy_coef={name: linear, start: 0.01, end: 0.0, steps: 40}"])
    eq = objective_equation(cfg)
    assert eq.endswith(" + 0.04 * KL_k3(pi_theta || pi_ref)(rollouts) - c_ent(t) * H(rollouts)")
    assert "0.01 -> 0 over steps 0..40" in explain_text(cfg)


def test_sum_norm_without_max_len_is_a_note():
    cfg = compose_config(["algo.aggregation.name=seq-mean-token-sum-norm"])
    notes = check_objective(cfg)
    assert any("padded width" in n for n in notes)
    assert "the padded width T of each micro-batch" in explain_text(cfg)


# --------------------------------------------------------------------------- schedules
def test_table_steps():
    assert table_steps(60, 5) == [0, 15, 30, 45, 60]
    assert table_steps(60, 3, knots=[10, 40, 99]) == [0, 10, 30, 40, 60]
    with pytest.raises(ConfigError):
        table_steps(60, 1)


def test_schedule_table_matches_hand_computation():
    cfg = compose_config([*CHORD_LIKE, "algo.entropy_coef={name: linear, start: 0.01, end: 0.0, steps: 40}"])
    columns, rows = schedule_rows(cfg, 5)
    assert columns == ["step", "mu", "entropy_coef", "lr"]
    by_step = {int(r[0]): dict(zip(columns[1:], r[1:])) for r in rows}
    assert sorted(by_step) == [0, 10, 15, 30, 40, 45, 60]  # 5 even steps + the warmup / decay knots
    # by hand: warmup ramp ends at peak, cos(pi/6) at step 15, cos(2pi/3) = -1/2 at step 30
    assert by_step[0]["mu"] == 0.0
    assert by_step[10]["mu"] == pytest.approx(0.5)
    assert by_step[15]["mu"] == pytest.approx(0.02 + 0.48 * (1 + math.sqrt(3) / 2) / 2)
    assert by_step[30]["mu"] == pytest.approx(0.14)
    assert by_step[40]["mu"] == pytest.approx(0.02) and by_step[60]["mu"] == pytest.approx(0.02)
    for step, row in by_step.items():
        assert row["mu"] == pytest.approx(_cosine(step, 10, 0.5, 30, 0.02))
        assert row["entropy_coef"] == pytest.approx(0.01 * max(0.0, 1 - step / 40))
        assert row["lr"] == pytest.approx(5e-5)  # the default trainer.learning_rate, constant


def test_lr_schedule_with_warmup_and_cosine():
    cfg = compose_config(["trainer.lr_scheduler_type=cosine", "trainer.warmup_steps=10", "trainer.max_steps=50", "trainer.learning_rate=1e-3"])
    _, rows = schedule_rows(cfg, 3)
    lr = {int(r[0]): r[-1] for r in rows}
    assert sorted(lr) == [0, 10, 25, 50]
    assert lr[0] == 0.0 and lr[10] == pytest.approx(1e-3) and lr[50] == pytest.approx(0.0, abs=1e-12)
    assert lr[25] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 15 / 40)))


# --------------------------------------------------------------------------- contradictions
def _edited(overrides, **algo):
    cfg = compose_config(overrides)
    for key, value in algo.items():
        cfg.algo[key] = value
    return cfg


@pytest.mark.parametrize(
    "overrides, edits, message",
    [
        ([], {"loss": {"name": "sft"}, "kl": {"coef": 0.1, "estimator": "k3"}}, "has no reference policy"),
        (["+algo.controller.name=bapo"], {"loss": {"name": "sapo", "tau_pos": 1.0, "tau_neg": 1.05}}, "has no PPO clip"),
        (["offpolicy=expert", "algo.mix.mode=aux_loss", "+algo.mix.mu={name: cosine, warmup: 5, peak: 1.5, decay: 10, valley: 0.1}"], {},
         "algo.mix.mu = 1.2 at step 4"),
        (["algo.entropy_coef={name: linear, start: 0.01, end: -0.01, steps: 20}"], {}, "algo.entropy_coef = -0.001 at step 11"),
        (["+algo.mix.token_weight={name: chord_phi}"], {}, "algo.mix.token_weight acts on expert rows"),
        (["+algo.controller.name=entropic", "algo.entropy_coef=0.01"], {}, "would overwrite algo.entropy_coef"),
        (["+algo.controller.name=bapo", "+algo.controller.low_min=0.95"], {}, "algo.controller (bapo)"),
        (["algo.loss.clip_high=-0.1"], {}, "algo.loss.clip_high must be >= 0"),
    ],
)
def test_contradictions_raise_one_line(overrides, edits, message):
    cfg = _edited(overrides, **edits)
    with pytest.raises(ConfigError) as e:
        explain_text(cfg)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_offpolicy_without_mixing_is_rejected():
    cfg = compose_config([])
    cfg.offpolicy.source = "expert"
    with pytest.raises(ConfigError, match="never trains on them"):
        check_objective(cfg)


# --------------------------------------------------------------------------- CLI
def test_cli_prints_objective_and_table():
    result = runner.invoke(app, ["explain", *CHORD_LIKE, "--steps", "3"])
    assert result.exit_code == 0, result.output
    assert "L = (1 - mu_t) * PPOclip[eps_low=0.2, eps_high=0.28, dual_c=3](rollouts)" in result.stdout
    assert "mu_t = cosine(" in result.stdout
    assert "0.14" in result.stdout  # mu at step 30


def test_cli_plot_writes_png(tmp_path):
    out = tmp_path / "schedules.png"
    result = runner.invoke(app, ["explain", *CHORD_LIKE, "--plot", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"schedules plotted to {out}" in result.stdout


def test_cli_plot_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    result = runner.invoke(app, ["explain", "--plot", str(tmp_path / "x.png")])
    assert result.exit_code == 2
    assert "pip install 'mixrl[plot]'" in result.stderr
    assert result.stdout == ""  # checked before anything is printed


@pytest.mark.parametrize(
    "args, message",
    [
        (["offpolicy=expert"], "never trains on them"),
        (["algo.mix.mode=aux_loss"], "add offpolicy=expert"),
        (["algo.entropy_coef=-0.01"], "negative coefficient"),
        (["offpolicy=expert", "algo.mix.mode=aux_loss", "+algo.mix.mu=1.5"], "must stay in [0, 1]"),
        (["--steps", "1"], "--steps must be >= 2"),
    ],
)
def test_cli_contradictions_exit_2_with_one_line(args, message):
    result = runner.invoke(app, ["explain", *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert result.stdout == ""  # nothing printed before the error


def test_cli_staged_algo_explains_each_stage(tmp_path):
    result = runner.invoke(app, ["explain", "algo=sft_then_rl", "--plot", str(tmp_path / "s.png")])
    assert result.exit_code == 0, result.output
    assert "stage 1/2 'sft'" in result.stdout and "stage 2/2 'rl'" in result.stdout
    assert "L = NLL (expert rows)" in result.stdout
    assert "L = PPOclip[eps_low=0.2, eps_high=0.2](rollouts)" in result.stdout
    assert (tmp_path / "s.png").exists()
