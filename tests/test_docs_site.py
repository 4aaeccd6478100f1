"""The documentation site (mkdocs.yml, scripts/mkdocs_hooks.py, scripts/check_docs_site.py) and the README.

Cheap checks only: the full build (`mkdocs build --strict`) and the check that every generated page
(recipes included: every recipe composed, a minute or more) is current run in `make docs-check`,
which CI calls (.ci/run)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


hooks = _load(ROOT / "scripts" / "mkdocs_hooks.py", "mkdocs_hooks")
check_site = _load(ROOT / "scripts" / "check_docs_site.py", "check_docs_site")


def _nav_files(nav) -> list[str]:
    out = []
    for entry in nav:
        for v in (entry.values() if isinstance(entry, dict) else [entry]):
            out.extend(_nav_files(v) if isinstance(v, list) else [v])
    return out


def _mkdocs_config() -> dict:
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)  # mkdocs' !ENV and python tags
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)


def test_every_page_the_nav_names_exists_and_the_theme_loads_no_fonts():
    cfg = _mkdocs_config()
    missing = [p for p in _nav_files(cfg["nav"]) if not (DOCS / p).is_file()]
    assert not missing, missing
    assert cfg["theme"]["font"] is False and cfg["strict"] is True


def test_a_page_dropped_into_docs_guides_joins_the_how_to_guides(tmp_path):
    docs = tmp_path / "docs"
    (docs / "guides").mkdir(parents=True)
    (docs / "results" / "toy").mkdir(parents=True)
    (docs / "guides" / "my-topic.md").write_text("# Training with my topic\n\ntext\n")
    (docs / "guides" / "already.md").write_text("# Listed by hand\n")
    (docs / "results" / "toy" / "README.md").write_text("# Toy table\n")
    (docs / "results" / "toy" / "compare.md").write_text("# compare\n")
    nav = [{"Home": "index.md"}, {"How-to guides": [{"Listed": "guides/already.md"}]}, {"Results": [{"R": "results/index.md"}]}]
    out = hooks.on_config({"docs_dir": str(docs), "nav": nav})
    assert out["nav"][1]["How-to guides"] == [{"Listed": "guides/already.md"}, {"Training with my topic": "guides/my-topic.md"}]
    assert out["nav"][2]["Results"][1] == {"Suite: toy": [{"Toy table": "results/toy/README.md"},
                                                         {"compare (table)": "results/toy/compare.md"}]}


def test_links_that_leave_docs_become_repository_paths_and_links_inside_stay(tmp_path):
    docs = tmp_path / "docs"
    (docs / "how-to").mkdir(parents=True)
    (tmp_path / "mixrl" / "core").mkdir(parents=True)
    page = type("Page", (), {"file": type("File", (), {"src_uri": "how-to/x.md"})()})()
    md = ("see [the losses](../../mixrl/core/losses.py#L3), [peers](../peers.md), [web](https://example.org/a) "
          "and ![plot](../results/a.png)")
    out = hooks.on_page_markdown(md, page, {"docs_dir": str(docs)}, None)
    assert out == ("see the losses (`mixrl/core/losses.py`), [peers](../peers.md), [web](https://example.org/a) "
                   "and ![plot](../results/a.png)")


def test_the_offline_check_flags_network_assets_and_passes_plain_links(tmp_path):
    (tmp_path / "index.html").write_text('<a href="https://squidfunk.github.io/mkdocs-material/">Material</a>'
                                         '<link rel="stylesheet" href="assets/main.css">')
    assert check_site.network_assets(tmp_path) == []
    (tmp_path / "bad.html").write_text('<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto">'
                                       '<script src="https://cdn.example.org/x.js"></script>')
    (tmp_path / "x.css").write_text("@import url(https://fonts.googleapis.com/x);")
    found = check_site.network_assets(tmp_path)
    assert [f for f, _ in found] == ["bad.html", "bad.html", "x.css"]
    assert check_site.main(["x", str(tmp_path)]) == 1


README = (ROOT / "README.md").read_text()


def test_the_readme_is_a_front_door_and_every_link_in_it_resolves():
    assert len(README.splitlines()) <= 150
    links = re.findall(r"\]\(([^)\s]+)\)", README)
    assert len(links) >= 10
    broken = [t for t in links if not t.startswith(("http://", "https://", "#"))
              and not (ROOT / t.split("#", 1)[0]).exists()]
    assert not broken, broken
    for needed in ("make demo", "make test", "make docs-serve", "mixrl train recipe="):
        assert needed in README


def test_every_readme_section_moved_to_a_page():
    """What the README held before it became the front door lives on in these pages (nothing lost)."""
    moved = {"get-started.md": "make demo", "reference/commands.md": "Exit codes of `mixrl train`",
             "concepts/config.md": "| group | options | default |", "how-to/gpus.md": "### On a SLURM cluster",
             "how-to/vllm.md": "vLLM on CPU", "how-to/data.md": "The BPE chat model",
             "how-to/your-own-task.md": "examples/caesar", "concepts/sources.md": "### Preference pairs",
             "concepts/teachers.md": "Teachers", "concepts/critic.md": "GAE", "concepts/samplers.md": "sampler=",
             "concepts/run-directory.md": "samples.jsonl", "how-to/resume.md": "--trust-run-code",
             "concepts/layout.md": "mixrl/core/", "how-to/compare.md": "pass@k", "how-to/evaluate.md": "benchmarks=",
             "results/index.md": "hard", "results/speed.md": "bench", "how-to/rehearse.md": "--rehearse",
             "how-to/gpu-check.md": "gpu-check", "how-to/tests.md": "make test"}
    for page, text in moved.items():
        assert text in (DOCS / page).read_text(), (page, text)


@pytest.mark.parametrize("page", ["cli", "config"])
def test_the_cli_and_config_reference_pages_are_current(page):
    """The two cheap generated pages (the recipe pages compose every recipe: `make docs-check`)."""
    from mixrl.cli.main import app
    from mixrl.cli.reference import render_cli, render_config

    made = render_cli(app) if page == "cli" else render_config()
    assert (DOCS / "reference" / f"{page}.md").read_text() == made, f"docs/reference/{page}.md is stale: run `make docs`"


def test_every_config_key_has_a_meaning():
    """Every row of the config reference says what its key does: the meaning comes from the comment
    beside (or just above) the field in mixrl/config/schema.py; an empty one is a missing comment there."""
    rows = [r for r in (DOCS / "reference" / "config.md").read_text().splitlines() if r.startswith("| `")]
    assert len(rows) > 100
    empty = [r.split("|")[1].strip() for r in rows if not r.rstrip().rstrip("|").rsplit("|", 1)[1].strip()]
    assert not empty, f"keys without a meaning (add a comment beside the field in mixrl/config/schema.py): {empty}"


def test_no_code_points_at_a_readme_section_that_moved_to_the_site():
    """The README is the front door; its old sections live on the site (docs/): a comment or message
    naming one of the README's old sections points at the page that now holds it."""
    stale = re.compile(r"""README(?:'s)? "|see (?:the )?README\b|README \(\w+ section|README, [A-Z]""")
    found = []
    for folder in ("mixrl", "scripts", "tests", "conf"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".sh", ".yaml") and path.is_file() and "pins" not in path.parts:
                found += [f"{path.relative_to(ROOT)}:{n}" for n, line in enumerate(path.read_text().splitlines(), 1)
                          if stale.search(line)]
    found += [f"Makefile:{n}" for n, line in enumerate((ROOT / "Makefile").read_text().splitlines(), 1) if stale.search(line)]
    assert not found, found


def test_the_home_page_shows_the_readmes_method_families():
    """docs/index.md repeats the README's table of method families (links relative to docs/): one
    changed without the other leaves the site's front page behind."""
    readme = [r.replace("](docs/", "](") for r in README.splitlines() if r.startswith("|")]
    home = [r for r in (DOCS / "index.md").read_text().splitlines() if r.startswith("|")]
    assert readme == home, "docs/index.md's method-family table differs from the README's: copy it over"
