"""The model cache's one atomic-publish helper (mixrl.models.atomic.publishing): a folder appears whole
or not at all, a race lost to a writer that left a complete folder passes (the winner's copy stays),
one lost to an incomplete folder raises, and no temporary folder is left behind in any case."""

from __future__ import annotations

import stat

import pytest

from mixrl.models.atomic import publishing


def _complete(folder):
    return (folder / "meta.json").is_file()


def _left(parent):
    return sorted(p.name for p in parent.iterdir())


def test_the_folder_appears_whole_with_the_shared_mode(tmp_path):
    final = tmp_path / "cache" / "v1-abc"
    with publishing(final, complete=_complete) as tmp:
        assert tmp.parent == final.parent and not final.exists()
        (tmp / "meta.json").write_text("{}")
    assert (final / "meta.json").read_text() == "{}"
    assert stat.S_IMODE(final.stat().st_mode) == 0o755
    assert _left(final.parent) == ["v1-abc"]


def test_an_error_while_building_publishes_nothing(tmp_path):
    final = tmp_path / "v1-abc"
    with pytest.raises(RuntimeError, match="build failed"):
        with publishing(final, complete=_complete) as tmp:
            (tmp / "half").write_text("x")
            raise RuntimeError("build failed")
    assert _left(tmp_path) == []


def test_a_race_lost_to_a_complete_folder_keeps_the_winner(tmp_path):
    final = tmp_path / "v1-abc"
    with publishing(final, complete=_complete) as tmp:
        (tmp / "meta.json").write_text("mine")
        final.mkdir()  # another process renamed its complete copy in first
        (final / "meta.json").write_text("winner")
    assert (final / "meta.json").read_text() == "winner"
    assert _left(tmp_path) == ["v1-abc"]


def test_a_race_lost_to_an_incomplete_folder_raises(tmp_path):
    final = tmp_path / "v1-abc"
    with pytest.raises(OSError):
        with publishing(final, complete=_complete) as tmp:
            (tmp / "meta.json").write_text("mine")
            final.mkdir()
            (final / "junk").write_text("no meta file")
    assert _left(tmp_path) == ["v1-abc"] and _left(final) == ["junk"]


def test_replace_swaps_out_a_folder_already_there(tmp_path):
    final = tmp_path / "v1-abc"
    final.mkdir()
    (final / "junk").write_text("an interrupted build")
    with publishing(final, complete=_complete, replace=True) as tmp:
        (tmp / "meta.json").write_text("new")
    assert _left(final) == ["meta.json"] and _left(tmp_path) == ["v1-abc"]
