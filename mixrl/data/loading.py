"""Load prompt / answer / expert rows from local files or the Hugging Face Hub.

``load_dataset_rows`` returns a ``datasets.Dataset`` with the standard columns

* ``prompt``: a string, or a chat list ``[{"role": ..., "content": ...}]`` (when the source column
  holds messages, or when ``system_prompt`` is set);
* ``answer``: the gold answer as a string (numbers cast to ``str``; missing -> ``""``);
* ``expert`` (only with ``expert_column``): ``list[str]`` of expert completions for the prompt;

followed by every other source column (TRL hands them to reward functions as keyword arguments).
The source columns mapped onto ``prompt`` / ``answer`` / ``expert`` are not kept under their old names.
A column may name a field inside a struct column with a dot: ``reward_model.ground_truth``.

This module maps rows onto the standard columns; reading the source is :mod:`mixrl.data.reading`,
finding its columns :mod:`mixrl.data.columns`, converting each cell :mod:`mixrl.data.cells`.
"""

from __future__ import annotations

import logging
from typing import Any

import datasets

from mixrl.data.cells import _is_message_list, _prompt_text, _RowError, answer_to_str, expert_completions, to_chat_prompt
from mixrl.data.columns import _column_getter, _has_column
from mixrl.data.reading import _load_raw
from mixrl.errors import ConfigError, DataError

__all__ = [
    "load_dataset_rows",
    "standardize_rows",
]

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------- public API


def load_dataset_rows(
    source: str,
    *,
    split: str = "train",
    prompt_column: str = "prompt",
    answer_column: str | None = "answer",
    expert_column: str | None = None,
    system_prompt: str | None = None,
    limit: int | None = None,
    subset: str | None = None,
    config_prefix: str = "data",
    expert_required: bool = True,
) -> Any:
    """Load ``source`` and map it onto the standard columns (see the module docstring).

    ``source``: a local ``.jsonl`` / ``.json`` / ``.parquet`` / ``.csv`` file, a glob of them, a folder of them
    (files named after splits, e.g. ``train.jsonl`` / ``test.jsonl``, are picked by ``split``), a folder written by
    ``Dataset.save_to_disk``, or a Hugging Face dataset id (with ``subset`` as its config name). ``split`` is
    ignored for a single file, except for a slice (``train[:100]``). ``answer_column=None`` loads no answer.
    ``limit`` keeps the first ``limit`` rows. ``config_prefix`` names the config section in error messages.
    ``expert_required=False``: an ``expert_column`` absent from the data is skipped (no ``expert`` column)
    instead of an error, for runs that read no expert rows.

    Raises ``DataError`` (missing file, column or split, unreadable file, dataset not cached offline) and
    ``ConfigError`` (bad ``limit``), each with a one-line message naming the fix.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
        raise ConfigError(f"{config_prefix}.limit must be a positive integer or null, got {limit!r}; fix {config_prefix}.limit")
    ds, where = _load_raw(source, split=split, subset=subset, config_prefix=config_prefix)
    if len(ds) == 0:
        raise DataError(f"{where} has no rows; point {config_prefix}.source at a non-empty dataset")
    if limit is not None and limit < len(ds):
        ds = ds.select(range(limit))
    return standardize_rows(
        ds,
        where=where,
        prompt_column=prompt_column,
        answer_column=answer_column,
        expert_column=expert_column,
        system_prompt=system_prompt,
        config_prefix=config_prefix,
        expert_required=expert_required,
    )


def _standard_features(ds: Any, columns: tuple, *, chat: bool, answer: bool, expert: bool) -> tuple[list[str], Any]:
    """``(kept, features)``: the source columns kept beside the standard ones (not mapped, not
    overwritten by a standard column) and the features of the standardized dataset."""
    mapped = {c if c in ds.column_names else c.split(".")[0] for c in columns if c}
    standard = ["prompt"] + (["answer"] if answer else []) + (["expert"] if expert else [])
    # source columns that are mapped or would be overwritten by a standard one
    drop = sorted(mapped | (set(standard) & set(ds.column_names)))
    kept = [c for c in ds.column_names if c not in drop]

    message = {"role": datasets.Value("string"), "content": datasets.Value("string")}
    new_features: dict[str, Any] = {"prompt": datasets.List(message) if chat else datasets.Value("string")}
    if answer:
        new_features["answer"] = datasets.Value("string")
    if expert:
        new_features["expert"] = datasets.List(datasets.Value("string"))
    return kept, datasets.Features({**new_features, **{c: ds.features[c] for c in kept}})


def standardize_rows(
    ds: Any,
    *,
    where: str = "the dataset",
    prompt_column: str = "prompt",
    answer_column: str | None = "answer",
    expert_column: str | None = None,
    system_prompt: str | None = None,
    config_prefix: str = "data",
    expert_required: bool = True,
) -> Any:
    """Map an already loaded ``datasets.Dataset`` onto the standard columns (the second half of
    ``load_dataset_rows``; useful for datasets built in memory)."""
    if isinstance(expert_column, str) and expert_column and not expert_required and not _has_column(ds, expert_column):
        expert_column = None  # configured (e.g. by the data group) but absent, and no expert rows are read
    roles = {"prompt_column": prompt_column, "answer_column": answer_column, "expert_column": expert_column}

    def getter(column: str, key: str):
        taken = {c for k, c in roles.items() if k != key and c}
        return _column_getter(ds, column, key, where, config_prefix, taken=taken)

    get_prompt = getter(prompt_column, "prompt_column")
    get_answer = getter(answer_column, "answer_column") if answer_column else None
    get_expert = getter(expert_column, "expert_column") if expert_column else None
    if system_prompt is not None and not isinstance(system_prompt, str):
        raise ConfigError(f"{config_prefix}.system_prompt must be a string, got {type(system_prompt).__name__}; fix it")

    first = next((v for v in (get_prompt(ds[i]) for i in range(min(len(ds), 20))) if v is not None), None)
    chat = bool(system_prompt) or _is_message_list(first) or isinstance(first, dict)

    kept, features = _standard_features(ds, (prompt_column, answer_column, expert_column), chat=chat,
                                        answer=get_answer is not None, expert=get_expert is not None)

    def convert(example: dict[str, Any], idx: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        try:
            out["prompt"] = to_chat_prompt(get_prompt(example), system_prompt) if chat else _prompt_text(get_prompt(example))
        except _RowError as e:
            raise DataError(
                f"row {idx} of {where}: {prompt_column!r} {e}; fix the data or set {config_prefix}.prompt_column"
            ) from None
        if get_answer:
            out["answer"] = answer_to_str(get_answer(example))
        if get_expert:
            try:
                out["expert"] = expert_completions(get_expert(example))
            except _RowError as e:
                raise DataError(
                    f"row {idx} of {where}: {expert_column!r} {e}; fix the data or set {config_prefix}.expert_column"
                ) from None
        for c in kept:
            out[c] = example[c]
        return out

    n_before = len(ds)
    out = ds.map(
        convert,
        with_indices=True,
        remove_columns=ds.column_names,
        features=features,
        desc="mixrl: standard columns",
    )
    out = out.filter(_has_prompt, input_columns="prompt", batched=True, desc="mixrl: drop empty prompts")
    if len(out) < n_before:
        logger.warning("dropped %d of %d rows of %s with an empty %r", n_before - len(out), n_before, where, prompt_column)
    if len(out) == 0:
        raise DataError(f"every row of {where} has an empty {prompt_column!r}; set {config_prefix}.prompt_column to the column holding the prompts")
    return out


def _has_prompt(prompts: list[Any]) -> list[bool]:
    return [bool(p) for p in prompts]
