"""``mixrl recipes``: the table of shipped recipes (``list``, from their YAML files only) and one
recipe's overlay and what it resolves to (``show``)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from mixrl.cli.console import out
from mixrl.cli.errors import user_errors
from mixrl.cli.recipes_table import print_recipes
from mixrl.config.recipe_index import recipe_summary, recipes_dir

recipes_app = typer.Typer(help="Shipped recipes: paper methods as config overlays.", no_args_is_help=True)


def _recipe_row(name: str) -> dict:
    """A recipe's table row (its files only) plus its composed config and overlay text."""
    from mixrl.config.compose import compose_config  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it

    return {**recipe_summary(name), "cfg": compose_config([f"recipe={name}"])}


def _recipe_path(name: str) -> Path:
    return recipes_dir() / f"{name}.yaml"


@recipes_app.command("list")
@user_errors
def recipes_list():
    """Table of shipped recipes: name, paper, model, data, hardware it needs."""
    print_recipes(out)  # the YAML files only (no composition, no torch); ids never break, piped or not


@recipes_app.command("show")
@user_errors
def recipes_show(name: str = typer.Argument(..., help="Recipe name, e.g. grpo/arith-tiny")):
    """Print one recipe: its overlay file and what it resolves to."""
    from mixrl.config.compose import load_recipe  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it
    from mixrl.config.geometry import geometry  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it

    load_recipe(name)  # clear error for an unknown name
    r = _recipe_row(name)
    out.print(f"[bold]{name}[/] — {r['paper']}: {r['description']}")
    out.print(f"model {r['model']} | data {r['data']} | hardware {r['hardware']}")
    out.print(f"batch: {geometry(r['cfg']).describe()}")
    out.print(f"\n# {_recipe_path(name)}")
    sys.stdout.write(_recipe_path(name).read_text())
