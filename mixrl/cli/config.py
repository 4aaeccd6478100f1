"""``mixrl config``: the composed configuration as YAML (``show``) and the config groups with
their options (``groups``)."""

from __future__ import annotations

import sys
from typing import List, Optional

import typer
from rich.table import Table

from mixrl.cli.console import OVERRIDES, out
from mixrl.cli.errors import user_errors
from mixrl.config.recipe_index import group_options
from mixrl.config.schema import GROUPS

config_app = typer.Typer(help="Inspect the composed configuration.", no_args_is_help=True)


@config_app.command("show")
@user_errors
def config_show(overrides: Optional[List[str]] = OVERRIDES):
    """Print the fully resolved config as YAML."""
    from mixrl.config.compose import compose_config, to_yaml  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it
    from mixrl.config.sampler import without_inactive_sampler  # deferred: imports torch; `mixrl --help` and `mixrl recipes list` must not load it
    from mixrl.benchmarks.paper import without_unset  # deferred: keeps `mixrl --help` light

    # sampler=none is left out, and a recipe's unset paper table: configs print as before those keys existed
    sys.stdout.write(to_yaml(without_unset(without_inactive_sampler(compose_config(list(overrides or []))))))


@config_app.command("groups")
@user_errors
def config_groups():
    """List the config groups and their options."""
    table = Table(title="config groups")
    table.add_column("group")
    table.add_column("options")
    for g in GROUPS:
        table.add_row(g, ", ".join(group_options(g)))
    out.print(table)
