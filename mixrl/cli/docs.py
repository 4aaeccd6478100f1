"""``mixrl docs``: the generated reference pages (``components``, ``methods``, ``peers``; ``site``,
all of them, is :mod:`mixrl.cli.reference`)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from mixrl.cli.console import out
from mixrl.cli.errors import user_errors
from mixrl.errors import ConfigError
from mixrl.options import check_out_file, write_out_file

docs_app = typer.Typer(help="Generated reference documentation.", no_args_is_help=True)


@docs_app.command("components")
@user_errors
def docs_components(
    out_path: Path = typer.Option(Path("docs/components.md"), "--out", help="Where to write the page ('-' for stdout)."),
):
    """Regenerate the reference page of every registered component from the code."""
    _check_page(out_path)
    from mixrl.sources.docs import render_components_markdown  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it

    _write_page(render_components_markdown(), out_path)


def _check_page(out_path: Path) -> None:
    """A page's ``--out``, checked before the page is made (:func:`mixrl.options.check_out_file`)."""
    if str(out_path) != "-":
        check_out_file(out_path, "--out", example="page.md")


def _write_page(text: str, out_path: Path) -> None:
    """Write a generated docs page (``-``: standard output)."""
    if str(out_path) == "-":
        sys.stdout.write(text)
        return
    write_out_file(out_path, text, "--out")
    out.print(f"wrote {out_path}")


@docs_app.command("methods")
@user_errors
def docs_methods(
    out_path: Path = typer.Option(Path("docs/methods.md"), "--out", help="Where to write the page ('-' for stdout)."),
    results: Path = typer.Option(Path("docs/results"), "--results", help="Folder of suite results (<suite>/compare.json)."),
):
    """Regenerate docs/methods.md: every shipped method, its recipes, paper, claims and latest verdicts."""
    _check_page(out_path)
    from mixrl.experiments.methods import render_methods  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it

    _write_page(render_methods(results), out_path)


@docs_app.command("peers")
@user_errors
def docs_peers(
    out_path: Path = typer.Option(Path("docs/peers.md"), "--out", help="Where to write the page ('-' for stdout)."),
    data: Path = typer.Option(Path("docs/peers.yaml"), "--data", help="The table's data: every peer option, its overrides, status and tests."),
):
    """Regenerate docs/peers.md from docs/peers.yaml: every verl, TRL, Trinity-RFT and LUFFY option, its mixrl overrides and how far they agree."""
    from mixrl.experiments.peers import load_peers, render_peers  # deferred: `mixrl --help` must stay fast

    _check_page(out_path)
    if not data.is_file():
        raise ConfigError(f"--data {data}: no such file; run from the repository root or pass --data path/to/peers.yaml")
    try:
        table = load_peers(data)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    _write_page(render_peers(table), out_path)


from mixrl.cli.reference import docs_site  # noqa: E402
docs_app.command("site")(docs_site)
