"""Find the configured columns of a dataset (a dotted name reads a field of a struct column:
``reward_model.ground_truth``) and, when one is missing, say which column was most likely meant."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

from mixrl.errors import ConfigError, DataError

# likely column names per role, most likely first, to suggest the right config value
_GUESSES = {
    "prompt_column": ("prompt", "question", "problem", "input", "instruction", "query", "text", "messages"),
    "answer_column": ("answer", "final_answer", "ground_truth", "reward_model.ground_truth", "solution", "output",
                      "target", "label"),
    "expert_column": ("expert", "solution", "messages", "generations", "target", "completion", "response", "output"),
}


def _has_column(ds: Any, column: str) -> bool:
    if column in ds.column_names:
        return True
    head, _, rest = column.partition(".")
    return bool(rest) and head in ds.column_names and _has_field(ds.features[head], rest.split("."))


def _column_getter(ds: Any, column: str, key: str, where: str, prefix: str, taken: set[str] = frozenset()) -> Callable[[dict], Any]:
    if not isinstance(column, str) or not column:
        raise ConfigError(f"{prefix}.{key} must be a column name, got {column!r}; fix {prefix}.{key}")
    if column in ds.column_names:
        return lambda ex: ex[column]
    head, _, rest = column.partition(".")
    if _has_column(ds, column):
        path = rest.split(".")

        def get(ex: dict) -> Any:
            value = ex[head]
            for part in path:
                value = value.get(part) if isinstance(value, dict) else None
            return value

        return get
    raise DataError(_missing_column_message(ds, column, key, where, prefix, taken))


def _has_field(feature: Any, path: list[str]) -> bool:
    for part in path:
        if isinstance(feature, dict) and part in feature:
            feature = feature[part]
        else:
            return False
    return True


def _all_column_names(ds: Any) -> list[str]:
    names = list(ds.column_names)
    for c in ds.column_names:
        if isinstance(ds.features[c], dict):
            names += [f"{c}.{k}" for k in ds.features[c]]
    return names


def _suggest_column(names: list[str], column: str, key: str, taken: set[str]) -> str | None:
    """The column most likely meant for ``key``: a near spelling of ``column`` (a typo), else a
    usual name for the role (question, problem, input for prompts; answer, solution, output for
    answers); never a column another role uses, nor a name usual only for another role."""
    own = set(_GUESSES.get(key, ()))
    others = {g for k, gs in _GUESSES.items() if k != key for g in gs} - own
    free = [n for n in names if n not in taken and n not in others]
    typo = [n for n in free if column in n or difflib.SequenceMatcher(None, column, n).ratio() >= 0.8]
    if typo:
        return max(typo, key=lambda n: difflib.SequenceMatcher(None, column, n).ratio())
    return next((g for g in _GUESSES.get(key, ()) if g in free), None)


def _missing_column_message(ds: Any, column: str, key: str, where: str, prefix: str, taken: set[str] = frozenset()) -> str:
    guess = _suggest_column(_all_column_names(ds), column, key, set(taken))
    if guess:
        fix = f"set {prefix}.{key}={guess}"
    elif key == "expert_column":  # only read when the algorithm trains on expert completions
        fix = f"the algorithm trains on expert completions: set {prefix}.expert_column to the column holding them, or train on-policy (algo=grpo)"
    else:
        fix = f"set {prefix}.{key} to one of them"
    return f"column {column!r} not found in {where}; columns present: {', '.join(ds.column_names)}; {fix}"
