"""The run directory's layout (:mod:`mixrl.trainer.state.rundir`) as documented is the layout its
bookkeeping knows: every entry the module's docstring lists is one that a failed run's
replacement may remove (:func:`~mixrl.trainer.state.rundir.written_by_mixrl`), and nothing else is."""

from __future__ import annotations

import re

import pytest

from mixrl.trainer.state import rundir


def _documented_entries() -> list[str]:
    doc = rundir.__doc__
    block = doc[doc.index("Run directory layout::"):].split("\n\n")[1]
    return [line.split()[0].rstrip("/") for line in block.splitlines() if re.match(r"^    \S", line)]


def test_the_documented_layout_is_what_mixrl_knows_it_writes(tmp_path):
    documented = _documented_entries()
    assert "config.yaml" in documented and "stage<i>-<name>" in documented and len(documented) == 13
    plain = {name for name in documented if "<" not in name}
    assert plain == set(rundir.MIXRL_ENTRIES)
    stage = tmp_path / "stage1-sft"
    stage.mkdir()
    assert rundir.written_by_mixrl(stage)
    (tmp_path / "notes.txt").write_text("mine")
    assert not rundir.written_by_mixrl(tmp_path / "notes.txt")


def test_a_new_run_dir_holds_the_config_and_the_lock_and_is_then_refused(tmp_path):
    from omegaconf import OmegaConf

    from mixrl.config.compose import compose_config
    from mixrl.errors import ConfigError

    run_dir = tmp_path / "run"
    cfg = compose_config([f"run_dir={run_dir}"])
    lock = rundir.RunDirLock()
    try:
        assert rundir.prepare_run_dir(cfg, say=lambda _: None, lock=lock) == run_dir
        assert sorted(p.name for p in run_dir.iterdir()) == [rundir.LOCK_FILE, rundir.CONFIG_FILE]
        assert (run_dir / rundir.CONFIG_FILE).read_text() == rundir.config_text(cfg)
        assert OmegaConf.create((run_dir / rundir.CONFIG_FILE).read_text()).run_dir == str(run_dir)
        with pytest.raises(ConfigError, match="already exists and is not empty; choose another run_dir"):
            rundir.check_new_run_dir(run_dir)
    finally:
        lock.release()
