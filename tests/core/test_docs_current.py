"""docs/components.md must match what the registries generate."""

import pathlib

from mixrl.core.docs import render_components_markdown

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "components.md"


def test_components_doc_is_current():
    expected = render_components_markdown()
    current = DOC.read_text() if DOC.exists() else ""
    assert current == expected, (
        "docs/components.md is out of date; regenerate it with: "
        "python -m mixrl.core.docs > docs/components.md"
    )


def test_doc_lists_every_component_with_its_defaults():
    text = render_components_markdown()
    for name in ("ppo_clip", "chord_phi", "seq-mean-token-sum-norm", "grpo", "k3", "cosine", "bapo"):
        assert f"### `{name}`" in text
    assert "| `dual_clip_c` | `float | None` |" not in text  # pipes in types are escaped
