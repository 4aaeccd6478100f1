"""The components page, ``docs/components.md`` (``mixrl docs components`` writes it): every registry
of :mod:`mixrl.core`, then this package's off-policy sources and injections, each rendered by
:mod:`mixrl.core.docs`. The page is put together here, not in core, because core (pure tensor
math, the lowest layer) imports nothing above it."""

from __future__ import annotations

from mixrl.core import REGISTRIES, Registry
from mixrl.core import docs as core_docs
from mixrl.sources.base import INJECTIONS, SOURCES

#: registry key -> (section title, signature) of the registries this package adds to the page
TITLES = {
    "source": ("Off-policy sources", "class(*, params) with provenances, prepare(train_ds, data_cfg), state_dict()"),
    "injection": (
        "Injections",
        "class(*, params, source, geometry, seed) with hooks before_generation, after_generation, "
        "after_rewards, after_advantages",
    ),
}


def all_registries() -> dict[str, Registry]:
    """Every registry the page covers: the core ones, then sources and injections."""
    return {**REGISTRIES, "source": SOURCES, "injection": INJECTIONS}


def render_components_markdown() -> str:
    """The full text of ``docs/components.md``."""
    return core_docs.render_components_markdown(all_registries(), TITLES)
