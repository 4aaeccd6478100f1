"""``mixrl explain``: the objective as text, schedule tables, the plot, contradictions."""

from __future__ import annotations

import math
import re
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
    schedule_knots,
    schedule_rows,
    table_steps,
)

runner = CliRunner()

MU_COSINE = "{name: cosine, warmup: 10, peak: 0.5, decay: 30, valley: 0.02}"
CHORD_LIKE = [
    "algo=chord",
    f"algo.mu={MU_COSINE}",
    "algo.loss.clip_high=0.28",
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
    assert objective_equation(cfg) == "L = policy[on_policy]"
    assert text.startswith("objective of algo=grpo\n")
    assert "policy term on on_policy tokens, weight 1; token-mean over on_policy tokens" in text
    assert "policy: l_t = ppo_clip(r_t, A)" in text  # the term's formula, its loss filled in
    assert "ppo_clip: l_t = max(-A r_t, -A clip(r_t, 1 - 0.2, 1 + 0.2))" in text  # the loss's formula
    assert "token-mean: L = sum over tokens of l_t / N" in text
    assert "grpo: A_i = (R_i - mean_g R) / (std_g R + 1e-06)" in text
    assert "controller  none" in text
    assert "source      none" in text
    assert "16 prompts x 8 generations = 128 rollouts/step" in text  # geometry(cfg).describe()
    assert "on_policy [behaviour policy]" in text
    assert "r_t = 1" in text  # note from check_objective: num_iterations=1 makes the clip inactive
    assert "kl[" not in text and "entropy_bonus" not in text  # coefficient 0: no term


def test_chord_text():
    cfg = compose_config(["algo=chord"])
    assert objective_equation(cfg) == "L = (1 - mu) * policy[on_policy] + mu * sft[expert]"
    text = explain_text(cfg)
    assert "weight 1 - mu (coefficient mu, below)" in text
    assert "nll: l_t = -sg(w(p_t)) log p_t, w the token weight (chord_phi)" in text
    assert "chord_phi: w(p) = sg(p (1 - p))" in text  # the nested token weight's own formula
    assert "dual clip c = 3" in text
    assert "mu = 0.1 (constant over the run: cosine(warmup=0, peak=0.1, decay=0, valley=0.1))" in text
    assert "off-policy rows counted in the statistics: no (algo.advantage_include_offpolicy=false)" in text
    assert "append_rows: batch = {rollouts} + {E expert rows}" in text and "[ratio=0.2, rows=unset]" in text
    assert "128 rows in groups + 32 appended rows" in text  # ratio 0.2 of all rows (rules.geometry)
    assert "expert [behaviour unknown]" in text


def test_chord_scheduled_mu_text():
    cfg = compose_config(CHORD_LIKE)
    assert objective_equation(cfg) == "L = (1 - mu_t) * policy[on_policy] + mu_t * sft[expert]"
    text = explain_text(cfg)
    assert "mu_t = cosine(warmup=10, peak=0.5, decay=30, valley=0.02)" in text
    # the schedule's declared formula, filled in with the config's values
    assert "f(t) = 0.5 t / 10 for t < 10; 0.02 + (0.5 - 0.02) (1 + cos(pi (t - 10) / 30)) / 2" in text
    assert "clip(r_t, 1 - 0.2, 1 + 0.28)" in text


def test_luffy_text():
    cfg = compose_config(["algo=luffy"])
    assert objective_equation(cfg) == (
        "L = policy[on_policy] + offpolicy[expert] (both normalised over on_policy + expert tokens)"
        " - entropy_coef * entropy_bonus[on_policy]"
    )
    text = explain_text(cfg)
    assert "shaped: l_t = -A f(p_t), f(p) = p / (p + 0.1)" in text
    assert "token-mean over on_policy + expert tokens" in text
    assert "dr_grpo: A_i = R_i - mean_g R" in text
    assert "off-policy rows counted in the statistics: yes" in text
    assert "group_replace: group(x) = {y_1..y_(G-k) ~ pi_old(.|x)} + {k expert completions of x}, k = 1" in text
    assert "entropy_coef = 0.001 (constant over the run)" in text
    excluded = compose_config(["algo=luffy", "algo.advantage_include_offpolicy=false"])
    assert "counted in the statistics: no" in explain_text(excluded)
    gamma = compose_config(["algo=luffy", "algo.gamma=0.3"])
    assert "f(p) = p / (p + 0.3)" in explain_text(gamma)


def test_sft_text():
    cfg = compose_config(["algo=sft"])
    assert objective_equation(cfg) == "L = sft[expert]"
    text = explain_text(cfg)
    assert "one: w(p) = 1" in text
    assert "nothing generated" in text  # declared by the injection (skips_generation)


def test_controller_presets_text():
    bapo = compose_config(["algo=bapo"])
    assert objective_equation(bapo) == "L = policy[on_policy]"
    text = explain_text(bapo)
    assert "clip(r_t, 1 - clip_low(t), 1 + clip_high(t))" in text  # knobs the controller sets
    assert "set every step by the controller bapo" in text
    assert "bapo: [c_low, c_high] start at [0.6, 1.2] (sequential search, every micro_batch)" in text and ">= 0.5" in text
    assert "sets algo.loss.clip_low, algo.loss.clip_high" in text
    ent = compose_config(["+algo.controller.name=entropic", "+algo.controller.target=0.3"])
    assert objective_equation(ent).endswith(" - entropy_coef_t * entropy_bonus[on_policy]")
    text = explain_text(ent)
    assert "entropic: after each step e = 0.3 - H" in text
    assert "entropy_coef_t set after every step by the controller entropic" in text
    assert "sets coefficient entropy_coef" in text
    columns, _ = schedule_rows(ent)
    assert "entropy_coef" not in columns  # set by the controller, not a schedule


@pytest.mark.parametrize(
    "overrides, labels",
    [
        (["algo=chord"], ["policy", "sft"]),
        (["algo=luffy"], ["policy", "offpolicy", "entropy_bonus"]),
        (["algo=sft"], ["sft"]),
        (["algo=grpo"], ["policy"]),
        (["algo=bapo"], ["policy"]),
        (["+algo.controller.name=entropic"], ["policy", "entropy_bonus"]),
        (["algo=mix"], ["policy", "sft"]),
    ],
)
def test_presets_render_and_name_their_terms(overrides, labels):
    cfg = compose_config(overrides)
    text = explain_text(cfg)
    equation = objective_equation(cfg)
    for label in labels:
        assert f"{label}[" in equation
        assert re.search(rf"^  {label}\s+\S+ term on ", text, re.M), label


@pytest.mark.parametrize(
    "name, formula",
    [
        ("dr_grpo", "ppo_clip: l_t = max(-A r_t, -A clip(r_t, 1 - 0.2, 1 + 0.2))"),
        ("gspo", "gspo: l_t = max(-A s_t, -A clip(s_t, 1 - 0.0003, 1 + 0.0004))"),
        ("cispo", "cispo: l_t = -sg(clip(r_t, 1 - 1, 1 + 0.28)) A log p_t"),
        ("topr", "topr: l_t = -A log p_t if A >= 0"),
        ("sapo", "sapo: l_t = -(4 / tau) sigmoid(tau (r_t - 1)) A, tau = 1 if A > 0 else 1.05"),
        ("m2po", "(log r_t)^2 <= 0.04"),
    ],
)
def test_preset_losses(name, formula):
    cfg = compose_config([f"algo={name}"])
    assert objective_equation(cfg) == "L = policy[on_policy]"
    assert formula in explain_text(cfg)  # and no contradiction in any shipped preset


def test_dr_grpo_max_len_follows_max_completion_length():
    text = explain_text(compose_config(["algo=dr_grpo", "trainer.max_completion_length=40"]))
    assert "seq-mean-token-sum-norm over on_policy rows" in text
    assert "sum_b sum_t l_t / 40" in text
    assert "A_i = R_i - mean_g R" in text
    text = explain_text(compose_config(["algo=dr_grpo", "algo.aggregation.max_len=64"]))
    assert "sum_b sum_t l_t / 64" in text


def test_kl_and_scheduled_entropy_terms():
    cfg = compose_config(["algo.kl.coef=0.04", "algo.entropy_coef={name: linear, start: 0.01, end: 0.0, steps: 40}"])
    eq = objective_equation(cfg)
    assert eq == "L = policy[on_policy] + 0.04 * kl[on_policy] - entropy_coef_t * entropy_bonus[on_policy]"
    text = explain_text(cfg)
    assert "kl: l_t = KL_k3(pi_theta || pi_ref) per token" in text
    assert "entropy_coef_t = linear(start=0.01, end=0, steps=40): f(t) = 0.01 + (0 - 0.01) min(t / 40, 1)" in text


def test_scheduled_term_weight_is_a_schedule():
    cfg = compose_config(["algo.terms.policy.weight={name: linear, start: 1.0, end: 0.5, steps: 20}"])
    assert objective_equation(cfg) == "L = w_policy(t) * policy[on_policy]"
    assert "w_policy(t) = linear(start=1, end=0.5, steps=20)" in explain_text(cfg)
    columns, rows = schedule_rows(cfg, 3)
    assert columns == ["step", "terms.policy.weight", "lr"]
    assert {int(r[0]): r[1] for r in rows}[20] == pytest.approx(0.5)


def test_sum_norm_without_max_len_divides_by_the_max_completion_length():
    cfg = compose_config(["algo.aggregation.name=seq-mean-token-sum-norm", "trainer.max_completion_length=24"])
    notes = check_objective(cfg)
    assert not any("seq-mean-token-sum-norm" in n for n in notes)
    text = explain_text(cfg)
    assert "sum_t l_t / 24, N = the population's rows" in text


def test_staged_top_level_config_is_explained_by_stage():
    with pytest.raises(ConfigError, match="explain each stage"):
        explain_text(compose_config(["algo=sft_then_rl"]))


# --------------------------------------------------------------------------- a new component
DUMMY = "dummy_term_for_test"


@pytest.fixture
def dummy_term():
    """A term registered by the test only: explain and the docs must show it unedited."""
    from mixrl.core import TERMS
    from mixrl.core.terms import TermOutput

    def dummy(x, *, scale: float = 2.0):
        """A term that only this test registers.

        Formula: l_t = {scale} * log p_t (dummy)
        Paper: none, a test.

        Parameters:
            scale (2.0): its factor.
        """
        return TermOutput(scale * x.logp)

    TERMS.register(DUMMY)(dummy)
    try:
        yield dummy
    finally:
        TERMS._items.pop(DUMMY, None)


def test_new_term_shows_up_in_explain_and_docs(dummy_term):
    from mixrl.sources.docs import render_components_markdown

    cfg = compose_config([f"+algo.terms.extra={{name: {DUMMY}, tokens: [on_policy], scale: 3.0}}"])
    assert objective_equation(cfg) == "L = policy[on_policy] + extra[on_policy]"
    text = explain_text(cfg)
    assert f"{DUMMY} term on on_policy tokens" in text
    assert f"{DUMMY}: l_t = 3 * log p_t (dummy)" in text
    doc = render_components_markdown()
    assert f"### `{DUMMY}`" in doc
    assert "Formula: `l_t = {scale} * log p_t (dummy)`" in doc and "Paper: none, a test." in doc


def test_render_names_no_component():
    """The renderer is generic: no registered component's name appears in its source."""
    import pathlib

    import mixrl.core as core
    import mixrl.explain.render as render
    from mixrl.sources import INJECTIONS, SOURCES

    source = pathlib.Path(render.__file__).read_text()
    names = {n for reg in (*core.REGISTRIES.values(), SOURCES, INJECTIONS) for n in reg.names()}
    names -= {"none", "p", "one", "step", "policy"}  # common words (and the word "policy loss" in prose)
    found = sorted(n for n in names if re.search(rf"[\"']{re.escape(n)}[\"']", source))
    assert found == [], f"render.py names components: {found}"


# --------------------------------------------------------------------------- schedules
def test_table_steps():
    assert table_steps(60, 5) == [0, 15, 30, 45, 60]
    assert table_steps(60, 3, knots=[10, 40, 99]) == [0, 10, 30, 40, 60]
    with pytest.raises(ConfigError):
        table_steps(60, 1)


def test_schedule_table_matches_hand_computation():
    cfg = compose_config([*CHORD_LIKE, "algo.entropy_coef={name: linear, start: 0.01, end: 0.0, steps: 40}"])
    assert schedule_knots(cfg) == [10, 40]  # declared by the cosine (warmup, warmup + decay) and the linear (steps)
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


def test_constant_schedules_add_no_knots():
    assert schedule_knots(compose_config(["algo=chord"])) == []  # flat cosine: constant mu
    assert schedule_rows(compose_config(["algo=chord"]), 3)[0] == ["step", "mu", "lr"]


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
        (["algo=chord", "algo.mu={name: cosine, warmup: 5, peak: 1.5, decay: 10, valley: 0.1}"], {},
         "algo.coefs.mu = 1.2 at step 4"),
        (["algo.entropy_coef={name: linear, start: 0.01, end: -0.01, steps: 20}"], {}, "algo.entropy_coef = -0.001 at step 11"),
        (["+algo.terms.sft={name: nll, tokens: [expert]}"], {}, "trains on 'expert' tokens, but nothing puts them in the batch"),
        (["+algo.controller.name=entropic", "algo.entropy_coef=0.01"], {}, "would overwrite algo.entropy_coef"),
        (["+algo.controller.name=bapo", "+algo.controller.low_min=0.95"], {}, "algo.controller (bapo)"),
        (["algo.loss.clip_high=-0.1"], {}, "algo.loss.clip_high=-0.1 is out of range: policy loss 'ppo_clip' needs clip_high >= 0"),
    ],
)
def test_contradictions_raise_one_line(overrides, edits, message):
    with pytest.raises(ConfigError) as e:  # at compose time (the one validation pass) or in explain
        explain_text(_edited(overrides, **edits))
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_offpolicy_without_injection_is_rejected():
    cfg = compose_config([])
    cfg.offpolicy.source = {"name": "expert", "dataset": None, "column": None, "missing": "on_policy"}
    cfg.offpolicy.name = "expert"
    with pytest.raises(ConfigError, match="never enter a batch"):
        check_objective(cfg)


# --------------------------------------------------------------------------- CLI
def test_cli_prints_objective_and_table():
    result = runner.invoke(app, ["explain", *CHORD_LIKE, "--steps", "3"])
    assert result.exit_code == 0, result.output
    assert "L = (1 - mu_t) * policy[on_policy] + mu_t * sft[expert]" in result.stdout
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
        (["offpolicy=expert"], "never enter a batch"),
        (["algo.inject={name: append_rows}"], "add offpolicy=expert"),
        (["algo.entropy_coef=-0.01"], "negative coefficient"),
        (["algo=chord", "algo.mu=1.5"], "it must stay in [0, 1]"),
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
    assert "L = sft[expert]" in result.stdout
    assert "L = policy[on_policy]" in result.stdout
    assert (tmp_path / "s.png").exists()


def test_exopd_explain_says_what_gopd_reward_computes():
    """`mixrl explain algo=exopd` names G-OPD's advantage against the fixed reference with the yaml's
    lam and the reinforce loss -w_t A log p_t (w_t = 1 without tis_cap): the same words as the
    docstring and docs/components.md, never -A r."""
    text = explain_text(compose_config(["algo=exopd"]))
    assert ("A_t = 1.25 (log pi_T(y_t) - log pi_ref(y_t)) - (log pi_old(y_t) - log pi_ref(y_t)), "
            "pi_ref the frozen starting student, used in place of the row's advantage") in text
    assert "reinforce: l_t = -w_t A log p_t" in text
    assert "-A r" not in text
