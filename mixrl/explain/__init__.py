"""``mixrl explain``: the objective a composed config trains, written out as math.

Pure functions over a validated ``DictConfig`` (from ``compose_config``); the CLI command
in :mod:`mixrl.cli.explain` only prints what they return. Split by job:

* :mod:`mixrl.explain.render`: the text (header, the equation ``L = ...`` built from the
  objective's terms and weights, one row per term with the formulas its components
  declare, the advantage, injection, source, controller, batch geometry, notes);
* :mod:`mixrl.explain.schedules`: every value that changes with the step (the learning
  rate, the objective's coefficients, other schedule specs under ``algo``), as functions,
  a table and a plot.

Contradictions and notes come from :func:`mixrl.config.objective.check_objective`, the one
validation pass every command goes through; it is re-exported here.
"""

from mixrl.config.objective import check_objective
from mixrl.explain.render import explain_lines, explain_text, objective_equation
from mixrl.explain.schedules import (
    plot_schedules,
    require_matplotlib,
    schedule_knots,
    schedule_rows,
    schedules,
    table_steps,
)

__all__ = [
    "check_objective",
    "explain_lines",
    "explain_text",
    "objective_equation",
    "plot_schedules",
    "require_matplotlib",
    "schedule_knots",
    "schedule_rows",
    "schedules",
    "table_steps",
]
