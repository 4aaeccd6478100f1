"""Data: loading prompt / answer / expert rows (``mixrl.data.loading``) and batching (``mixrl.data.batch``).

``load_dataset_rows`` and friends are imported lazily, so that ``import mixrl.data.batch`` does not
pay for importing ``datasets``.
"""

from __future__ import annotations

from typing import Any

_LOADING = (
    "load_dataset_rows",
    "standardize_rows",
    "expert_completions",
    "answer_to_str",
    "to_chat_prompt",
    "SUPPORTED_EXTENSIONS",
)

__all__ = list(_LOADING)


def __getattr__(name: str) -> Any:
    if name in _LOADING:
        from mixrl.data import loading

        return getattr(loading, name)
    raise AttributeError(f"module 'mixrl.data' has no attribute {name!r}")
