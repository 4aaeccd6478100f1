"""The ``mixrl`` command line: help of every command, config show, recipes, override errors.

No test here trains: ``mixrl.trainer.run.train`` and every model loader are replaced by
functions that fail the test, so a user error must be reported before any model is loaded
(the real training runs are in ``test_train_smoke.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import typer.main
import yaml
from typer.testing import CliRunner

from mixrl.cli.main import app
from mixrl.config.compose import list_recipe_names

runner = CliRunner()


def _command_paths(cmd, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [path]
    if getattr(cmd, "commands", None):  # a group (typer vendors click: no isinstance)
        for name, sub in sorted(cmd.commands.items()):
            paths += _command_paths(sub, (*path, name))
    return paths


COMMANDS = _command_paths(typer.main.get_command(app))


class ModelLoaded(AssertionError):
    pass


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if anything starts a run or loads a model."""
    import transformers

    import mixrl.models.tiny as tiny
    import mixrl.trainer.build as build
    import mixrl.trainer.run as run

    def boom(*args, **kwargs):
        raise ModelLoaded("a run was started / a model was loaded before the error was reported")

    monkeypatch.setattr(run, "train", boom)
    if hasattr(run, "train_stages"):
        monkeypatch.setattr(run, "train_stages", boom)
    monkeypatch.setattr(build, "resolve_model_path", boom)
    monkeypatch.setattr(tiny, "warm_start", boom)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", boom)


def _invoke(args: list[str]):
    return runner.invoke(app, args)


def _one_line_error(res) -> str:
    """Exit 2, nothing on stdout, one line on stderr, no traceback; returns that line."""
    assert not isinstance(res.exception, ModelLoaded), str(res.exception)
    assert res.exit_code == 2, f"exit {res.exit_code} ({res.exception!r}); output: {res.output}"
    assert "Traceback" not in res.output
    assert res.stdout.strip() == ""
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {lines}"
    assert lines[0].startswith("error:"), lines[0]
    return lines[0]


# --------------------------------------------------------------------------- help
def test_command_tree_is_complete():
    names = {" ".join(p) for p in COMMANDS}
    for expected in ("train", "config show", "config groups", "recipes list", "recipes show"):
        assert expected in names, f"`mixrl {expected}` is missing"


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "mixrl")
def test_help(path):
    res = _invoke([*path, "--help"])
    assert res.exit_code == 0, res.output
    assert "Usage" in res.stdout
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]
    if getattr(cmd, "commands", None):
        for sub in cmd.commands:  # a group's help lists its sub-commands
            assert sub in res.stdout
    assert cmd.help or cmd.short_help or path == (), f"`mixrl {' '.join(path)}` has no help text"


# --------------------------------------------------------------------------- config show
ISSUE_EXAMPLE = ["algo=grpo", "trainer.max_steps=20", "algo.loss.clip_high=0.28", "seed=3"]


def test_config_show_prints_resolved_yaml(no_model):
    res = _invoke(["config", "show", *ISSUE_EXAMPLE, "run_dir=/tmp/mixrl-x/${algo.name}-${seed}"])
    assert res.exit_code == 0, res.output
    data = yaml.safe_load(res.stdout)
    assert data["algo"]["name"] == "grpo"
    assert data["trainer"]["max_steps"] == 20
    assert data["algo"]["loss"]["clip_high"] == pytest.approx(0.28)
    assert data["seed"] == 3
    assert data["run_dir"] == "/tmp/mixrl-x/grpo-3"  # interpolations resolved
    assert "dual_clip_c" in data["algo"]["loss"]  # component defaults listed
    for section in ("algo", "data", "offpolicy", "model", "reward", "hardware", "logger", "trainer", "recipe_info"):
        assert section in data


def test_config_show_with_recipe(no_model):
    res = _invoke(["config", "show", "recipe=grpo/qwen2.5-math-1.5b-gsm8k", "trainer.max_steps=9"])
    assert res.exit_code == 0, res.output
    data = yaml.safe_load(res.stdout)
    assert data["recipe_info"]["name"] == "grpo/qwen2.5-math-1.5b-gsm8k"
    assert data["data"]["name"] == "gsm8k"
    assert data["trainer"]["max_steps"] == 9


def test_config_groups_lists_options(no_model):
    res = _invoke(["config", "groups"])
    assert res.exit_code == 0, res.output
    for word in ("algo", "grpo", "data", "arith", "gsm8k", "hardware", "cpu"):
        assert word in res.stdout


# --------------------------------------------------------------------------- recipes
def test_recipes_list(no_model, monkeypatch):
    from mixrl.cli import main as cli_main

    monkeypatch.setattr(cli_main.out, "width", 240)  # a wide terminal: whole hub ids (a narrow one folds them)
    res = _invoke(["recipes", "list"])
    assert res.exit_code == 0, res.output
    for col in ("name", "paper", "model", "data", "hardware"):
        assert col in res.stdout
    for name in list_recipe_names():
        assert name in res.stdout, f"recipe {name} missing from `mixrl recipes list`"
    assert "GRPO (DeepSeekMath)" in res.stdout
    assert "Qwen/Qwen2.5-Math-1.5B" in res.stdout and "openai/gsm8k" in res.stdout
    assert "1 x 80GB GPU" in res.stdout


@pytest.mark.parametrize("name", list_recipe_names())
def test_recipes_show(name, no_model):
    from mixrl.config.compose import compose_config

    cfg = compose_config([f"recipe={name}"])
    res = _invoke(["recipes", "show", name])
    assert res.exit_code == 0, res.output
    for text in (name, cfg.recipe_info.paper, cfg.model.path, cfg.data.source, cfg.recipe_info.hardware):
        assert str(text) in res.stdout, f"`mixrl recipes show {name}` does not print {text!r}"


def test_recipes_show_unknown(no_model):
    line = _one_line_error(_invoke(["recipes", "show", "grpo/arith-tinyy"]))
    assert "grpo/arith-tinyy" in line and "did you mean: grpo/arith-tiny" in line


# --------------------------------------------------------------------------- override errors
BAD_OVERRIDES = [
    # (overrides, texts the one-line error must contain)
    pytest.param(["algo=grpoo"], ["grpoo", "did you mean: grpo"], id="unknown-group-option"),
    pytest.param(["data=gsm8kk"], ["gsm8kk", "gsm8k"], id="unknown-data-option"),
    pytest.param(["trainer.max_stepz=3"], ["trainer.max_stepz", "did you mean: trainer.max_steps"], id="unknown-key"),
    pytest.param(["sead=1"], ["sead", "did you mean: seed"], id="unknown-top-level-key"),
    pytest.param(["trainer.max_steps=abc"], ["trainer.max_steps", "abc"], id="wrong-type"),
    pytest.param(["trainer.learning_rate=fast"], ["trainer.learning_rate", "fast"], id="wrong-type-float"),
    pytest.param(["algo.loss.clip_high=abc"], ["algo.loss.clip_high", "float"], id="wrong-type-component-param"),
    pytest.param(["algo.loss.name=ppo_clp"], ["algo.loss.name", "ppo_clp", "did you mean: ppo_clip"], id="unknown-component"),
    pytest.param(["algo.loss.clip_hihg=0.3"], ["algo.loss.clip_hihg", "clip_high"], id="unknown-component-param"),
    pytest.param(["algo.loss.clip_high=0.3", "algo.loss.name=m2po"], ["algo.loss.clip_high", "m2_budget"],
                 id="param-of-previous-component"),
    pytest.param(["algo.kl.estimator=k4"], ["algo.kl.estimator", "k4", "k3"], id="unknown-kl-estimator"),
    pytest.param(["seed=1,2"], ["seed=1,2", "-m"], id="sweep-without-m"),
    pytest.param(["trainer.max_steps=[1,2"], ["trainer.max_steps=[1,2"], id="unparsable"),
    pytest.param(["recipe=grpo/arith-tinyy"], ["grpo/arith-tinyy", "did you mean: grpo/arith-tiny"], id="unknown-recipe"),
    pytest.param(
        ["trainer=x"], ["'trainer'"], id="group-section-set-to-scalar",
    ),
    pytest.param(
        ["trainer.max_steps=${nope}"], ["trainer.max_steps", "nope"], id="bad-interpolation",
    ),
    pytest.param(
        ["algo=[grpo,chord]"], ["[grpo,chord]"], id="value-with-brackets-is-printed",
    ),
    pytest.param(["algo=guide", "algo.inject.template={prompt}{hint}"],
                 ["could not parse", "must be quoted", "\"algo.inject.template='{prompt}{hint}'\""], id="unquoted-braces"),
    pytest.param(["data.system_prompt=a=b"], ["must be quoted", "\"data.system_prompt='a=b'\""], id="unquoted-equals"),
    pytest.param(["algo=sft_then_rl", "algo.stages.1.overrides=[trainer.max_steps=5]"],
                 ["quote each element", "\"algo.stages.1.overrides=['trainer.max_steps=5']\""], id="unquoted-list-of-overrides"),
    pytest.param(["algo=sft_then_rl", "algo.stages.2.max_steps=7"],
                 ["unknown key 'algo.stages.2.max_steps'", "algo.stages is a list of 2 entries, indexed 0..1"], id="list-index-out-of-range"),
]


@pytest.mark.parametrize("overrides,must_contain", BAD_OVERRIDES)
def test_bad_override_one_line_exit_2(overrides, must_contain, no_model):
    line = _one_line_error(_invoke(["train", *overrides]))
    for text in must_contain:
        assert text in line, f"{text!r} not in {line!r}"


def test_list_elements_are_keys_by_index_and_the_quoted_forms_the_errors_suggest_work(no_model):
    """Hydra and OmegaConf set a list element by its index (``algo.stages.1.overrides``), as the
    whole list can be set; the quoted forms that parse errors suggest compose."""
    from mixrl.config.compose import compose_config

    cfg = compose_config(["algo=sft_then_rl", "algo.stages.1.overrides=['trainer.max_steps=5']", "algo.stages.0.max_steps=7"])
    assert list(cfg.algo.stages[1].overrides) == ["trainer.max_steps=5"] and cfg.algo.stages[0].max_steps == 7
    assert cfg.algo.stages[1].algo == "grpo"  # the rest of the entry is kept
    assert compose_config(["algo=guide", "algo.inject.template='{prompt}{hint}'"]).algo.inject.template == "{prompt}{hint}"
    assert compose_config(["data.system_prompt='a=b'"]).data.system_prompt == "a=b"
    line = _one_line_error(_invoke(["config", "show", "algo=sft_then_rl", "algo.stages.1.nosuch=1"]))
    assert "unknown key 'algo.stages.1.nosuch'" in line and "algo.stages.1.name" in line


@pytest.mark.parametrize(
    "overrides", [["algo=grpoo"], ["trainer.max_stepz=3"], ["algo.loss.name=ppo_clp"], ["seed=1,2"], ["recipe=nope/x"]]
)
def test_config_show_bad_override_one_line_exit_2(overrides, no_model):
    _one_line_error(_invoke(["config", "show", *overrides]))


CROSS_FIELD = [
    pytest.param(["trainer.prompts_per_step=8", "algo.num_generations=8", "trainer.micro_batch_size=5"],
                 ["trainer.micro_batch_size=5", "choose one of"], id="micro-batch-does-not-divide"),
    pytest.param(["trainer.prompts_per_step=8", "algo.num_generations=8", "hardware.num_processes=3"],
                 ["hardware.num_processes=3"], id="rollouts-do-not-split-over-processes"),
    pytest.param(["algo=chord", "offpolicy=none"], ["algo.inject", "offpolicy"], id="mix-without-offpolicy"),
    pytest.param(["algo.num_generations=1", "trainer.micro_batch_size=8"], ["algo.num_generations"], id="group-of-one"),
    # the objective's contradictions: `mixrl train` runs the same validation as `mixrl explain`
    pytest.param(["algo=chord", "algo.mu=1.5"], ["algo.coefs.mu = 1.5 at step 0", "[0, 1]"], id="mu-above-one"),
    pytest.param(["algo=chord", "algo.mu.peak=0.9", "algo.mu.valley=-0.2", "algo.mu.decay=10"],
                 ["algo.coefs.mu = -0.09", "at step 8"], id="mu-schedule-goes-negative"),
    pytest.param(["algo.entropy_coef=-0.01"], ["algo.entropy_coef = -0.01", ">= 0"], id="negative-entropy-coef"),
    pytest.param(["algo=bapo", "algo.loss.name=cispo"], ["algo.controller=bapo", "cispo", "ppo_clip"], id="bapo-with-cispo"),
    pytest.param(["offpolicy=expert"], ["offpolicy=expert", "algo.inject is 'none'"], id="offpolicy-without-injection"),
    pytest.param(["algo=sft", "algo.kl.coef=0.1"], ["kl term", "set algo.kl.coef=0"], id="sft-with-kl"),
    pytest.param(["algo=chord", "algo.terms.policy.tokens=[on_policy,expert]"], ["no behaviour probability"],
                 id="ratio-on-expert-tokens"),
    pytest.param(["algo=luffy", "algo.inject.per_group=8"], ["algo.inject.per_group=8", "num_generations-1=7"],
                 id="luffy-replaces-whole-group"),
]


@pytest.mark.parametrize("overrides,must_contain", CROSS_FIELD)
def test_cross_field_error_one_line_exit_2(overrides, must_contain, no_model):
    line = _one_line_error(_invoke(["train", *overrides]))
    for text in must_contain:
        assert text in line, f"{text!r} not in {line!r}"


def test_multirun_validates_every_job_before_training(no_model):
    # the first job is fine; the second does not divide: nothing may start
    line = _one_line_error(_invoke([
        "train", "-m", "trainer.prompts_per_step=8", "algo.num_generations=8", "trainer.micro_batch_size=8,5",
    ]))
    assert "trainer.micro_batch_size=5" in line


def test_multirun_bad_key(no_model):
    line = _one_line_error(_invoke(["train", "-m", "seed=1,2", "trainer.max_stepz=1"]))
    assert "trainer.max_stepz" in line


# --------------------------------------------------------------------------- train wiring (no model)
def _fake_result(cfg):
    from mixrl.trainer.run import RunResult

    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    ev = {"accuracy": 0.5, "n": 8.0}
    summary = {
        "run_dir": str(run_dir), "algo": cfg.algo.name, "recipe": cfg.recipe_info.name, "seed": int(cfg.seed),
        "steps": int(cfg.trainer.max_steps), "rollouts": 0, "accuracy_before": 0.5, "accuracy_after": 0.5,
        "eval_before": ev, "eval_after": ev, "final_metrics": {"reward_mean": 0.5},
        "setup_seconds": 0.0, "train_seconds": 0.0, "wall_seconds": 0.0, "model_dir": str(run_dir / "model"),
    }
    return RunResult(run_dir, summary)


@pytest.fixture
def fake_train(monkeypatch, tmp_path):
    import mixrl.trainer.run as run

    calls = []

    def fake(cfg, console=None, **kwargs):
        calls.append(cfg)
        return _fake_result(cfg)

    monkeypatch.setattr(run, "train", fake)
    monkeypatch.chdir(tmp_path)
    return calls


def test_train_passes_overrides_to_the_run(fake_train, tmp_path):
    res = _invoke(["train", *ISSUE_EXAMPLE, f"run_dir={tmp_path / 'r'}"])
    assert res.exit_code == 0, res.output
    assert len(fake_train) == 1
    cfg = fake_train[0]
    assert (cfg.algo.name, cfg.trainer.max_steps, cfg.algo.loss.clip_high, cfg.seed) == ("grpo", 20, 0.28, 3)
    assert f"run directory: {tmp_path / 'r'}" in res.stdout


def test_multirun_expands_seeds(fake_train, tmp_path):
    res = _invoke(["train", "-m", "seed=1,2,3", "trainer.max_steps=4", f"run_dir={tmp_path / 'sweep'}"])
    assert res.exit_code == 0, res.output
    assert [c.seed for c in fake_train] == [1, 2, 3]
    assert all(c.trainer.max_steps == 4 for c in fake_train)
    dirs = [c.run_dir for c in fake_train]
    assert len(set(dirs)) == 3 and all(d.startswith(str(tmp_path / "sweep")) for d in dirs)
    for d in dirs:
        assert d in res.stdout


def test_multirun_default_run_dirs_are_distinct(fake_train, tmp_path):
    res = _invoke(["train", "-m", "seed=1,2"])
    assert res.exit_code == 0, res.output
    dirs = [Path(c.run_dir) for c in fake_train]
    assert len(set(dirs)) == 2
    for d in dirs:  # under the working directory, one folder per job
        assert (tmp_path / d if not d.is_absolute() else d).resolve().is_relative_to(tmp_path.resolve())
        assert str(d) in res.stdout
