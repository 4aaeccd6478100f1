"""mixrl.sources: off-policy sources and the injections that place their material in a batch.

Importing this package registers every built-in entry:

=================  ===========================================  ==================
registry           entries                                      module
=================  ===========================================  ==================
``SOURCES``        none, expert                                 ``base``, ``expert``
``INJECTIONS``     none, group_replace, replace_all, append_rows  ``base``, ``inject``
=================  ===========================================  ==================

A new source is its own module: register a provenance (``mixrl.core.provenance``), a source
class and, if none of these fits, an injection; then a YAML under ``conf/offpolicy`` and a
test. ``docs/extending.md`` walks through one.
"""

from mixrl.sources import expert, inject  # noqa: F401  (import = registration)
from mixrl.sources.base import HOOKS, INJECTIONS, SOURCES, InjectContext, Injection, Rollouts, Source

__all__ = ["HOOKS", "INJECTIONS", "SOURCES", "InjectContext", "Injection", "Rollouts", "Source"]
