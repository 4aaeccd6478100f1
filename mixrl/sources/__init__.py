"""mixrl.sources: off-policy sources and the injections that place their material in a batch.

Importing this package registers every built-in entry:

=================  ===========================================  ==================
registry           entries                                      module
=================  ===========================================  ==================
``SOURCES``        none, expert                                 ``base``, ``expert``
``INJECTIONS``     none, group_replace, replace_all, append_rows  ``base``, ``inject``
                   prefix; hint                                 ``prefix``; ``hint``
=================  ===========================================  ==================

A new source is its own module in this package (every module here is imported, so it
registers itself): a provenance (``mixrl.core.provenance``), a source class and, if none of
these fits, an injection; then a YAML under ``conf/offpolicy`` and a test.
``docs/extending.md`` walks through one.
"""

import importlib
import pkgutil

from mixrl.sources.base import HOOKS, INJECTIONS, SOURCES, InjectContext, Injection, Rollouts, Source

for _module in pkgutil.iter_modules(__path__):  # import = registration
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["HOOKS", "INJECTIONS", "SOURCES", "InjectContext", "Injection", "Rollouts", "Source"]
