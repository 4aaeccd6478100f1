"""Built-in synthetic verifiable tasks.

A task is a module exposing ``NAME``, ``LEVELS``, ``DEFAULT_LEVELS``,
``generate(n, *, seed, levels, split)``, ``train_split``, ``heldout_split``,
``extract_answer``, ``verify(completion, answer)`` and ``reward`` (a TRL reward
function reading the ``answer`` column). Problems are dicts with ``prompt``,
``answer``, ``solution`` (expert completion) and ``level``.
"""

from __future__ import annotations

from types import ModuleType

from mixrl.errors import ConfigError, did_you_mean
from mixrl.tasks import arith

TASKS: dict[str, ModuleType] = {arith.NAME: arith}


def get_task(name: str) -> ModuleType:
    """The built-in task called ``name``; raises ``ConfigError`` for an unknown name."""
    try:
        return TASKS[name]
    except KeyError:
        raise ConfigError(
            f"unknown task {name!r}{did_you_mean(name, TASKS)}; built-in tasks: {', '.join(sorted(TASKS))}"
        ) from None


__all__ = ["TASKS", "arith", "get_task"]
