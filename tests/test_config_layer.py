"""The config layer's house rules: one validation that every command goes through, once, and
an import graph with no cycle and no upward import through config, launch, plan or the CLI
(the rule on function-level imports, for the whole package, is in tests/test_import_graph.py).

The commands run through Typer's test runner with the one validation
(:func:`mixrl.config.validate.validate_config`) replaced: by one that refuses (each command
must exit 2 with its line and create nothing) or by one that counts its calls.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from typer.testing import CliRunner

import mixrl.config.validate as validation
from mixrl.config import components
from mixrl.cli.main import app
from mixrl.config.compose import compose_config
from mixrl.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import import_graph  # noqa: E402

runner = CliRunner()
REFUSAL = "refused by the one validation (test)"


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def _saved_run(tmp_path: Path) -> Path:
    """A run directory with the config.yaml `mixrl train` writes (no checkpoint needed: the
    config is validated before the checkpoint is looked for)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    OmegaConf.save(compose_config(["trainer.max_steps=2"]), run_dir / "config.yaml")
    return run_dir


def _commands(tmp_path: Path, run_dir: Path) -> dict[str, list[str]]:
    return {
        "train": ["train", "trainer.max_steps=2", f"run_dir={tmp_path / 'new-run'}"],
        "explain": ["explain", "algo=chord"],
        "plan": ["plan", "algo=chord"],
        "eval": ["eval", str(tmp_path / "no-such-model")],
        "resume": ["train", f"resume={run_dir}"],
    }


@pytest.mark.parametrize("command", ["train", "explain", "plan", "eval", "resume"])
def test_each_command_goes_through_the_one_validation(command, tmp_path, monkeypatch):
    run_dir = _saved_run(tmp_path)
    args = _commands(tmp_path, run_dir)[command]
    monkeypatch.chdir(tmp_path)
    before = {p: p.read_bytes() for p in _files(tmp_path)}
    seen = []

    def refuse(raw):
        seen.append(raw)
        raise ConfigError(REFUSAL)

    monkeypatch.setattr(validation, "validate_config", refuse)
    res = runner.invoke(app, args)
    assert res.exit_code == 2, f"exit {res.exit_code} ({res.exception!r}): {res.output}"
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and REFUSAL in lines[0], lines
    assert len(seen) == 1  # refused at the first call: nothing ran after it
    assert {p: p.read_bytes() for p in _files(tmp_path)} == before  # nothing created or touched


@pytest.mark.parametrize("args", [["config", "show", "algo=chord"], ["explain", "algo=luffy"], ["plan", "algo=chord"]])
def test_a_composed_config_is_validated_once(args, monkeypatch):
    real, calls = validation.validate_config, []

    def counting(raw):
        calls.append(raw)
        return real(raw)

    monkeypatch.setattr(validation, "validate_config", counting)
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert len(calls) == 1


def test_a_refusal_of_the_real_validation_names_the_key_for_every_command(tmp_path, monkeypatch):
    """Not only a stand-in: a value the real validation refuses (a term's declared range,
    ``gamma > 0``) gives the same line from explain, plan and train."""
    monkeypatch.chdir(tmp_path)
    for args in (["explain"], ["plan"], ["train", f"run_dir={tmp_path / 'r'}"]):
        res = runner.invoke(app, [*args, "algo=luffy", "algo.gamma=-1"])
        assert res.exit_code == 2, res.output
        assert "algo.terms.offpolicy.gamma=-1 is out of range" in res.stderr and "gamma > 0" in res.stderr
    assert _files(tmp_path) == []


# --------------------------------------------------------------------------- the import graph
MINE = ("mixrl.config", "mixrl.launch", "mixrl.plan", "mixrl.planning", "mixrl.cli")


def _mine(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in MINE)


def test_no_cycle_and_no_upward_import_through_config_launch_plan_cli():
    r = import_graph.analyse(REPO / "mixrl")
    assert [c for c in r["cycles"] if any(_mine(m) for m in c)] == []
    assert [u for u in r["upward_imports"] if _mine(u["from"])] == []


# --------------------------------------------------------------------------- declared ranges
def _outside(bound, annotation) -> float:
    """A value just outside ``bound`` (an int for an int parameter)."""
    integer = "int" in str(annotation) and "float" not in str(annotation)
    if bound.lo is not None:
        v = bound.lo if bound.lo_open else bound.lo - (1 if integer else 0.5)
        return math.floor(v) if integer else v
    v = bound.hi if bound.hi_open else bound.hi + (1 if integer else 0.5)
    return math.ceil(v) if integer else v


def test_every_declared_bound_is_enforced_by_the_section_validation():
    """For every component section (loss, term, token weight, aggregation, advantage,
    schedule, controller, injection, source) and every parameter a registration bounds, a
    value just outside is refused by the validation of that section, naming the key."""
    checked = set()
    for pattern in components._SECTION_REGISTRY:
        section = pattern.replace("*", "x")
        reg = components.registry_for(section)
        for name in reg.names():
            params = components._params(section, name)
            for key, bound in reg.bounds(name).items():
                value = _outside(bound, params[key].annotation)
                assert not bound.contains(value), (name, key, value)
                cfg = OmegaConf.create({})
                OmegaConf.update(cfg, section, {"name": name, key: value}, force_add=True)
                with pytest.raises(ConfigError) as e:
                    components._validate_section(cfg, section)
                assert f"{section}.{key}=" in str(e.value) and str(bound) in str(e.value), str(e.value)
                checked.add((reg.kind, name, key))
    assert len(checked) >= 50  # 56 bounded parameters today


@pytest.mark.parametrize("overrides, line", [
    (["algo=bapo", "algo.controller.rho0=2"], "algo.controller.rho0=2 is out of range: controller 'bapo' needs rho0 in [0, 1]"),
    (["algo=chord", "algo.token_weight.cutoff=2"], "algo.terms.sft.token_weight.cutoff=2 is out of range"),
    (["algo=repo_replay", "offpolicy.source.capacity=0"], "offpolicy.source.capacity=0 is out of range"),
    (["algo=chord", "algo.entropy_coef={name: linear, start: 0, end: 0, steps: -1}"], "algo.entropy_coef.steps=-1 is out of range"),
])
def test_a_composed_config_reads_the_declared_ranges(overrides, line):
    with pytest.raises(ConfigError) as e:
        compose_config(overrides)
    assert line in str(e.value)
