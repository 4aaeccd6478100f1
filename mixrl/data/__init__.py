"""Data: loading prompt / answer / expert rows (``mixrl.data.loading``: reading a source in
``mixrl.data.reading``, finding its columns in ``mixrl.data.columns``, converting each cell in
``mixrl.data.cells``). Separating held-out rows is evaluation's job (``mixrl.evaluation.heldout``).

``load_dataset_rows`` and the other names of ``loading`` and ``reading`` are imported lazily, so
that importing another module of this package does not pay for importing ``datasets``.
"""

from __future__ import annotations

from typing import Any

from mixrl.data.cells import answer_to_str, expert_completions, to_chat_prompt

_LAZY = ("load_dataset_rows", "standardize_rows", "SUPPORTED_EXTENSIONS")

__all__ = [*_LAZY, "answer_to_str", "expert_completions", "to_chat_prompt"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from mixrl.data import loading, reading  # deferred: both import datasets (~1 s)

        return getattr(loading if name in loading.__all__ else reading, name)
    raise AttributeError(f"module 'mixrl.data' has no attribute {name!r}")
