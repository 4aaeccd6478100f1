"""The core axes' registries are :class:`mixrl.registry.Registry` (one registry type for every
registry of mixrl: it imports only the standard library, so the torch-free packages, ``envs`` and
``tools``, use it too). This module keeps the names the core components and their tests import."""

from mixrl.registry import (  # noqa: F401  (re-exported)
    UNSET,
    Bound,
    ComponentParamError,
    Registry,
    UnknownComponentError,
    format_value,
    parse_bound,
    parse_declaration,
)
