"""``mixrl recipes list``'s table: the shipped recipes' name, paper, algo, model, data, hardware and
fidelity ledger (how many of the fields read against the authors' code differ; '-': no ledger).

The names and ids (``name``, ``algo``, ``model``, ``data``: what a user types or copies, e.g.
``meta-llama/Llama-3.1-8B-Instruct``) are never broken across lines: ``paper`` and ``hardware``
(prose) wrap between words instead. On a terminal the table fits the terminal; only when the
terminal is too narrow even for the ids do they fold. Elsewhere (a pipe, a log file, CI: no width
to fit) the table is as wide as the ids need (with room for the prose), whatever the console's
nominal width (``mixrl.cli.main.out`` is 160 columns when not a terminal).

Reads the recipe YAML only (:func:`mixrl.config.recipe_index.recipe_summary`): no torch.
"""

from __future__ import annotations

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from mixrl.config.recipe_index import list_recipe_names, recipe_summary

COLUMNS = ("name", "paper", "algo", "model", "data", "hardware", "ledger")
#: what a user types or copies: never broken across lines
ID_COLUMNS = ("name", "algo", "model", "data", "ledger")
#: columns a line per recipe leaves to the prose columns when the width is the table's own
PROSE_ROOM = 40


def recipes_table(rows: list[dict], *, fold_ids: bool = False) -> Table:
    """The table of ``rows`` (:func:`recipe_summary` dicts); ``fold_ids``: let the ids fold (a narrow terminal)."""
    table = Table(title="mixrl recipes (mixrl train recipe=NAME)")
    for col in COLUMNS:
        if col in ID_COLUMNS and not fold_ids:
            table.add_column(col, no_wrap=True, min_width=max([len(col), *(len(r[col]) for r in rows)]))
        else:
            table.add_column(col, overflow="fold")  # prose wraps between words; a word longer than the column folds
    for r in rows:
        table.add_row(*(r[c] for c in COLUMNS))
    return table


def print_recipes(console: Console, rows: list[dict] | None = None) -> None:
    """Print the recipes table on ``console`` (every shipped recipe unless ``rows``): see the module docstring."""
    rows = [recipe_summary(name) for name in list_recipe_names()] if rows is None else rows
    table = recipes_table(rows)
    needed = Measurement.get(console, console.options.update_width(10_000), table).minimum + PROSE_ROOM  # unclipped by the console
    if console.is_terminal:
        console.print(table if console.width >= needed else recipes_table(rows, fold_ids=True))
    else:  # Console.print never goes past the console's width: widen the console for this table
        width = console.width
        console.width = max(width, needed)
        try:
            console.print(table)
        finally:
            console.width = width
