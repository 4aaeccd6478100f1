"""A run directory someone else made: ``mixrl eval RUN_DIR`` and ``mixrl train resume=RUN_DIR``
run the code its ``config.yaml`` names (plugins, a reward file or module, remote model code)
only with ``--trust-run-code``. Without the flag: exit 2, one line naming the flag, nothing
executed (each piece of code writes a marker file when imported: the marker must not exist),
nothing of the run directory changed."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from mixrl.cli.main import app

runner = CliRunner()


@pytest.fixture(scope="module")
def finished_run(tiny_model_path, tmp_path_factory) -> Path:
    """One finished 2-step GRPO run (with its checkpoint), copied by each test."""
    from tests.conftest import FAST

    run = tmp_path_factory.mktemp("someone") / "run"
    res = runner.invoke(app, ["train", *FAST, f"model.path={tiny_model_path}", f"run_dir={run}"])
    assert res.exit_code == 0, res.output[-2000:]
    return run


@pytest.fixture
def run(finished_run, tmp_path) -> Path:
    dst = tmp_path / "theirs"
    shutil.copytree(finished_run, dst)
    return dst


def _edit(run: Path, edit) -> None:
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    edit(cfg)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))


def _made_with(run: Path, edit) -> None:
    """The run as if it had been made (elsewhere) under the edited config: config.yaml and the config
    each checkpoint records as trained under (an edit of config.yaml alone is refused on resume)."""
    _edit(run, edit)
    for state in run.glob("trainer/checkpoint-*/mixrl_run_state.json"):
        data = json.loads(state.read_text())
        if "config" in data:
            edit(data["config"])
            state.write_text(json.dumps(data))


def _listing(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _marker_code(marker: Path, body: str = "") -> str:
    return f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n{body}"


REWARD_BODY = "def fn(prompts, completions, **kw):\n    return [0.0 for _ in completions]\n"


def _refused(res, flag_hint: str = "--trust-run-code") -> str:
    assert res.exit_code == 2, res.output[-2000:]
    assert "Traceback" not in res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), lines
    assert flag_hint in lines[0]
    return lines[0]


def test_eval_refuses_a_reward_file_the_run_names(run, tmp_path):
    marker = tmp_path / "MARKER"
    reward = run / "evil_reward.py"
    reward.write_text(_marker_code(marker, REWARD_BODY))
    _edit(run, lambda c: c["reward"].update(name=f"{reward}:fn", params={}))
    before, tmp_before = _listing(run), sorted(p.name for p in tmp_path.iterdir())
    line = _refused(runner.invoke(app, ["eval", str(run), "logger.progress=false"]))
    assert f"reward.name={reward}:fn (executes that file)" in line and "reward=exact" in line
    assert not marker.exists()
    assert _listing(run) == before and sorted(p.name for p in tmp_path.iterdir()) == tmp_before


def test_eval_with_the_flag_runs_the_runs_reward(run, tmp_path):
    marker = tmp_path / "MARKER"
    reward = run / "trusted_reward.py"
    reward.write_text(_marker_code(marker, REWARD_BODY))
    _edit(run, lambda c: c["reward"].update(name=f"{reward}:fn", params={}))
    res = runner.invoke(app, ["eval", str(run), "--trust-run-code", "logger.progress=false"])
    assert res.exit_code == 0, res.output[-2000:]
    assert marker.read_text() == "ran"


def test_eval_with_the_users_own_reward_needs_no_flag(run, tmp_path):
    """The command line replaces the run's reward: nothing of the run's runs, no flag needed."""
    marker = tmp_path / "MARKER"
    reward = run / "unused_reward.py"
    reward.write_text(_marker_code(marker, REWARD_BODY))
    _edit(run, lambda c: c["reward"].update(name=f"{reward}:fn", params={}))
    res = runner.invoke(app, ["eval", str(run), "reward=exact", "logger.progress=false"])
    assert res.exit_code == 0, res.output[-2000:]
    assert not marker.exists()


def test_eval_refuses_a_dotted_reward_module_from_the_working_directory(run, tmp_path, monkeypatch):
    """``reward.name: evil_cwd_mod:fn`` would be imported from wherever the command runs."""
    marker = tmp_path / "MARKER"
    (tmp_path / "evil_cwd_mod.py").write_text(_marker_code(marker, REWARD_BODY))
    monkeypatch.chdir(tmp_path)
    _edit(run, lambda c: c["reward"].update(name="evil_cwd_mod:fn", params={}))
    line = _refused(runner.invoke(app, ["eval", str(run), "logger.progress=false"]))
    assert "imports module 'evil_cwd_mod'" in line
    assert not marker.exists() and "evil_cwd_mod" not in sys.modules


def test_eval_refuses_remote_model_code(run, tmp_path):
    """``model.trust_remote_code: true`` + an ``auto_map`` in the run's model/: transformers would run it."""
    marker = tmp_path / "MARKER"
    (run / "model" / "evil_config.py").write_text(_marker_code(marker))
    conf = json.loads((run / "model" / "config.json").read_text())
    conf["auto_map"] = {"AutoConfig": "evil_config.EvilConfig"}
    (run / "model" / "config.json").write_text(json.dumps(conf))
    _edit(run, lambda c: c["model"].update(trust_remote_code=True))
    before = _listing(run)
    line = _refused(runner.invoke(app, ["eval", str(run), "logger.progress=false"]))
    assert "model.trust_remote_code=true" in line and str(run / "model" / "evil_config.py") in line
    assert not marker.exists() and _listing(run) == before


def test_resume_refuses_the_runs_plugins(run, tmp_path, monkeypatch):
    marker = tmp_path / "MARKER"
    (tmp_path / "evil_resume_plugin.py").write_text(_marker_code(marker))
    monkeypatch.syspath_prepend(str(tmp_path))
    _edit(run, lambda c: c.update(plugins=["evil_resume_plugin"]))
    before, tmp_before = _listing(run), sorted(p.name for p in tmp_path.iterdir())
    line = _refused(runner.invoke(app, ["train", f"resume={run}", "trainer.max_steps=3"]))
    assert "plugins=['evil_resume_plugin']" in line and f"resume={run}" in line
    assert not marker.exists() and "evil_resume_plugin" not in sys.modules
    assert _listing(run) == before and sorted(p.name for p in tmp_path.iterdir()) == tmp_before


def test_resume_runs_the_runs_reward_only_with_the_flag(run, tmp_path):
    marker = tmp_path / "MARKER"
    reward = run / "resume_reward.py"
    reward.write_text(_marker_code(marker, REWARD_BODY))
    _made_with(run, lambda c: c["reward"].update(name=f"{reward}:fn", params={}))
    before = _listing(run)
    _refused(runner.invoke(app, ["train", f"resume={run}", "trainer.max_steps=3"]))
    assert not marker.exists() and _listing(run) == before

    res = runner.invoke(app, ["train", f"resume={run}", "trainer.max_steps=3", "--trust-run-code"])
    assert res.exit_code == 0, res.output[-2000:]
    assert marker.read_text() == "ran"
    assert json.loads((run / "summary.json").read_text())["steps"] == 3


def test_a_plain_run_names_no_code():
    """The default config (built-in reward, no plugins, no remote code): nothing to trust."""
    from mixrl.config.compose import compose_config
    from mixrl.config.trust import run_code

    assert run_code(compose_config([]), "unused") == []
    assert run_code(compose_config(["reward=math"]), "unused") == []
    assert run_code(compose_config(["reward=math", "plugins=[json]"]), "unused") == ["plugins=['json'] (imported)"]


def test_a_launched_resume_passes_the_flag_to_its_processes(run, tmp_path, monkeypatch):
    """Multi-process resumes re-run `mixrl train` under a launcher; each process loads the run's
    config again, so the user's --trust-run-code goes on their command line (and only then)."""
    import mixrl.config.hardware
    import mixrl.launch

    reward = run / "launch_reward.py"
    reward.write_text(REWARD_BODY)
    _made_with(run, lambda c: c["reward"].update(name=f"{reward}:fn", params={}))
    seen: list[list[str]] = []
    monkeypatch.setattr(mixrl.config.hardware, "needs_launch", lambda cfg, environ=None: True)
    monkeypatch.setattr(mixrl.launch, "launch", lambda cfg, overrides, say=print: seen.append(list(overrides)) or 0)
    res = runner.invoke(app, ["train", f"resume={run}", "trainer.max_steps=3", "--trust-run-code"])
    assert res.exit_code == 0, res.output[-2000:]
    assert seen == [[f"resume={run}", "trainer.max_steps=3", "--trust-run-code"]]


def test_run_code_reads_the_values_as_validation_would(tmp_path):
    """A yaml string 'yes' is a true bool to OmegaConf; a user override of the section clears it;
    an interpolation that does not resolve is left to validation (no traceback here)."""
    from omegaconf import OmegaConf

    from mixrl.config.trust import run_code

    assert run_code(OmegaConf.create({"model": {"trust_remote_code": "yes"}}), tmp_path)
    assert run_code(OmegaConf.create({"model": {"trust_remote_code": True}}), tmp_path, ["model"]) == []
    assert run_code(OmegaConf.create({"model": {"trust_remote_code": False}}), tmp_path) == []
    assert run_code(OmegaConf.create({"reward": {"name": "${oc.env:MIXRL_TEST_UNSET_VARIABLE}"}}), tmp_path) == []
    assert run_code(OmegaConf.create({"reward": {"name": "exact", "extra": [{"name": "x/r.py:fn"}]}}), tmp_path) == [
        f"reward.extra[0].name=x/r.py:fn (executes {Path.cwd() / 'x/r.py'}: relative to the working directory)"]
