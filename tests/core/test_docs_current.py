"""docs/components.md must match what the registries generate."""

import pathlib
import subprocess
import sys

from mixrl.sources.docs import render_components_markdown

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "components.md"


def test_components_doc_is_current():
    # a fresh process: tests may register components of their own (the pytest session's
    # registries are not what a user's `mixrl docs components` sees)
    cmd = [sys.executable, "-m", "mixrl.cli.main", "docs", "components", "--out", "-"]
    expected = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    current = DOC.read_text() if DOC.exists() else ""
    assert current == expected, "docs/components.md is out of date; regenerate it with: mixrl docs components"


def test_the_old_core_entry_point_refuses_instead_of_writing_a_page_without_the_sources():
    """core cannot import mixrl.sources, so `python -m mixrl.core.docs` would print an incomplete page;
    it exits non-zero, prints nothing on stdout, and names the command that writes the whole page."""
    run = subprocess.run([sys.executable, "-m", "mixrl.core.docs"], capture_output=True, text=True)
    assert run.returncode == 1 and run.stdout == ""
    assert "mixrl docs components" in run.stderr


def test_doc_lists_every_component_with_its_defaults():
    text = render_components_markdown()
    for name in ("ppo_clip", "chord_phi", "seq-mean-token-sum-norm", "grpo", "k3", "cosine", "bapo"):
        assert f"### `{name}`" in text
    assert "| `dual_clip_c` | `float | None` |" not in text  # pipes in types are escaped
