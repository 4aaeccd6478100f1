"""The ``mixrl`` command line (Typer). Every command takes Hydra-style overrides.

This module builds the app and registers the commands, in the order ``mixrl --help`` lists them;
each command lives in its topic module: ``train`` (with ``rehearse`` and ``resume``, its
``--rehearse`` and ``resume=auto`` glue), ``plan``, ``explain``, ``compare`` (``compare``,
``rejudge``, ``eval``), ``samples``, ``reproduce``, and the command groups ``config``,
``recipes``, ``model``, ``docs`` and ``data``. They print through :mod:`mixrl.cli.console`.
"""

from __future__ import annotations

import os

import typer

from mixrl.cli.config import config_app
from mixrl.cli.data import data_app
from mixrl.cli.console import out  # noqa: F401  (mixrl.cli.main.out: tests/test_cli.py sets its width)
from mixrl.cli.docs import docs_app
from mixrl.cli.errors import OneLineUsageErrors, freeze_at_exit
from mixrl.cli.model import model_app
from mixrl.cli.recipes import recipes_app

# Everything that imports torch, transformers, Hydra or TRL is imported inside the command that
# needs it (`# deferred:`): `mixrl --help` and `mixrl recipes list` answer in well under two
# seconds (tests/test_recipes_list.py checks that their path never imports torch).

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

freeze_at_exit()  # the process's last garbage collection skips the run's objects (mixrl.cli.errors)

app = typer.Typer(
    help="mixrl: train language models with on-policy RL mixed with off-policy data, declared in config.\n\n"
    "Overrides use Hydra syntax: group=option (algo=chord), key=value (trainer.max_steps=20), recipe=NAME.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=OneLineUsageErrors,  # a usage error (an unknown option, --steps abc) is one line, exit 2
)
app.add_typer(config_app, name="config")
app.add_typer(recipes_app, name="recipes")
app.add_typer(model_app, name="model")
app.add_typer(docs_app, name="docs")
app.add_typer(data_app, name="data")

from mixrl.cli.train import _summary_table, train  # noqa: E402,F401  (_summary_table: tests import it from here)
app.command()(train)
from mixrl.cli.plan import plan  # noqa: E402
app.command()(plan)
from mixrl.cli.explain import explain  # noqa: E402
app.command()(explain)
from mixrl.cli.compare import compare, eval_model, rejudge  # noqa: E402
app.command("compare")(compare)
app.command("rejudge")(rejudge)
from mixrl.cli.samples import samples  # noqa: E402
app.command("samples")(samples)
app.command("eval")(eval_model)
from mixrl.cli.reproduce import reproduce  # noqa: E402
app.command("reproduce")(reproduce)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
