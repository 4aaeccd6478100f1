"""The components page, ``docs/components.md`` (``mixrl docs components`` writes it): every registry
of :mod:`mixrl.core`, then this package's off-policy sources and injections and the rewards computed by models
(:mod:`mixrl.rewards.components`), each rendered by
:mod:`mixrl.core.docs`. The page is put together here, not in core, because core (pure tensor
math, the lowest layer) imports nothing above it."""

from __future__ import annotations

from mixrl.core import REGISTRIES, Registry
from mixrl.core import docs as core_docs
from mixrl.rewards.components import REWARD_MODELS
from mixrl.sources.base import INJECTIONS, SOURCES

#: registry key -> (section title, signature) of the registries this package adds to the page
TITLES = {
    "source": ("Off-policy sources", "class(*, params) with provenances, prepare(train_ds, data_cfg), state_dict()"),
    "injection": (
        "Injections",
        "class(*, params, source, geometry, seed) with hooks before_generation, after_generation, "
        "after_rewards, after_advantages",
    ),
    "reward": ("Rewards from models", "factory(*, params) -> fn(prompts, completions, **columns) -> list[float | list[float] | None] "
                                      "(reward.name; the verifiers exact and math are plain rewards)"),
}


def all_registries() -> dict[str, Registry]:
    """Every registry the page covers: the core ones, then sources, injections and the rewards computed by models."""
    return {**REGISTRIES, "source": SOURCES, "injection": INJECTIONS, "reward": REWARD_MODELS}


def render_components_markdown() -> str:
    """The full text of ``docs/components.md``."""
    return core_docs.render_components_markdown(all_registries(), TITLES)
