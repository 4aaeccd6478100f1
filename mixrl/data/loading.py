"""Load prompt / answer / expert rows from local files or the Hugging Face Hub.

``load_dataset_rows`` returns a ``datasets.Dataset`` with the standard columns

* ``prompt``: a string, or a chat list ``[{"role": ..., "content": ...}]`` (when the source column
  holds messages, or when ``system_prompt`` is set);
* ``answer``: the gold answer as a string (numbers cast to ``str``; missing -> ``""``);
* ``expert`` (only with ``expert_column``): ``list[str]`` of expert completions for the prompt;

followed by every other source column (TRL hands them to reward functions as keyword arguments).
The source columns mapped onto ``prompt`` / ``answer`` / ``expert`` are not kept under their old names.
A column may name a field inside a struct column with a dot: ``reward_model.ground_truth``.
"""

from __future__ import annotations

import difflib
import glob
import json
import logging
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mixrl.errors import ConfigError, DataError

__all__ = [
    "SUPPORTED_EXTENSIONS",
    "load_dataset_rows",
    "standardize_rows",
    "expert_completions",
    "answer_to_str",
    "to_chat_prompt",
]

logger = logging.getLogger(__name__)

#: file extension -> ``datasets`` builder
SUPPORTED_EXTENSIONS = {".jsonl": "json", ".ndjson": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
_EXT_TEXT = ".jsonl, .json, .parquet or .csv"

_SPLIT_ALIASES = {
    "train": ("train", "training"),
    "test": ("test", "testing"),
    "validation": ("validation", "valid", "val", "dev"),
    "eval": ("eval", "evaluation"),
}

# likely column names per role, most likely first, to suggest the right config value
_GUESSES = {
    "prompt_column": ("prompt", "question", "problem", "input", "instruction", "query", "text", "messages"),
    "answer_column": ("answer", "final_answer", "ground_truth", "reward_model.ground_truth", "solution", "output",
                      "target", "label"),
    "expert_column": ("expert", "solution", "messages", "generations", "target", "completion", "response", "output"),
}


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
    import datasets

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

    mapped = {
        c if c in ds.column_names else c.split(".")[0] for c in (prompt_column, answer_column, expert_column) if c
    }
    standard = ["prompt"] + (["answer"] if get_answer else []) + (["expert"] if get_expert else [])
    # source columns that are mapped or would be overwritten by a standard one
    drop = sorted(mapped | (set(standard) & set(ds.column_names)))
    kept = [c for c in ds.column_names if c not in drop]

    message = {"role": datasets.Value("string"), "content": datasets.Value("string")}
    new_features: dict[str, Any] = {"prompt": datasets.List(message) if chat else datasets.Value("string")}
    if get_answer:
        new_features["answer"] = datasets.Value("string")
    if get_expert:
        new_features["expert"] = datasets.List(datasets.Value("string"))
    features = datasets.Features({**new_features, **{c: ds.features[c] for c in kept}})

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


# ----------------------------------------------------------------------------- value conversion


class _RowError(ValueError):
    """A cell of an unusable type; re-raised as DataError naming the row."""


def _message_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):  # multimodal parts: keep the text ones
        return "".join(
            p if isinstance(p, str) else str(p.get("text") or "")
            for p in content
            if isinstance(p, (str, dict))
        )
    return str(content)


def _is_message(x: Any) -> bool:
    return isinstance(x, dict) and "content" in x


def _is_message_list(x: Any) -> bool:
    return isinstance(x, (list, tuple)) and len(x) > 0 and all(_is_message(m) for m in x)


def _prompt_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return "" if isinstance(value, float) and math.isnan(value) else str(value)
    raise _RowError(f"holds a {type(value).__name__}, expected a string or a list of chat messages")


def to_chat_prompt(value: Any, system_prompt: str | None = None) -> list[dict[str, str]]:
    """A prompt as chat messages ``[{"role", "content"}]``: a string becomes one user message; a message list
    keeps its messages up to the last non-assistant one (a ``messages`` column that includes the answer
    becomes a prompt). ``system_prompt`` replaces an existing system message, or is put first."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return []
    if isinstance(value, dict):
        value = [value]
    if isinstance(value, (list, tuple)):
        if not all(_is_message(m) for m in value):
            raise _RowError("is a list but not of chat messages ({'role': ..., 'content': ...})")
        messages = [{"role": str(m.get("role") or "user"), "content": _message_text(m.get("content"))} for m in value]
        while messages and messages[-1]["role"] == "assistant":
            messages.pop()
    else:
        messages = [{"role": "user", "content": _prompt_text(value)}]
    if not messages:
        return []
    if system_prompt:
        if messages[0]["role"] == "system":
            messages[0] = {"role": "system", "content": system_prompt}
        else:
            messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def answer_to_str(value: Any) -> str:
    """The gold answer as a string: numbers cast (``72.0`` -> ``"72"``), lists joined with ``", "``, null -> ``""``."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return str(int(value)) if value.is_integer() and abs(value) < 1e16 else repr(value)
    if isinstance(value, (list, tuple)):
        return ", ".join(answer_to_str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    return str(value)


def _conversation_reply(messages: list[Any]) -> str | None:
    """The last assistant message's content of one conversation (a message without a role counts as one)."""
    replies = [m for m in messages if _is_message(m) and (m.get("role") in (None, "assistant"))]
    if not replies:
        return None
    return _message_text(replies[-1].get("content"))


def expert_completions(value: Any) -> list[str]:
    """Expert completions from one cell: a string, a list of strings, a chat message list (its assistant
    reply), or a list of chat lists (one reply each). Empty / null -> ``[]``."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value.strip() else []
    if isinstance(value, float) and math.isnan(value):
        return []
    if _is_message(value):
        text = _conversation_reply([value])
        return [text] if text and text.strip() else []
    if isinstance(value, (list, tuple)):
        if _is_message_list(value):
            text = _conversation_reply(list(value))
            return [text] if text and text.strip() else []
        out: list[str] = []
        for item in value:
            if item is None:
                continue
            if isinstance(item, str):
                text = item
            elif _is_message_list(item):
                text = _conversation_reply(list(item)) or ""
            elif _is_message(item):
                text = _conversation_reply([item]) or ""
            else:
                raise _RowError(f"holds a list with a {type(item).__name__}, expected strings or chat messages")
            if text.strip():
                out.append(text)
        return out
    raise _RowError(f"holds a {type(value).__name__}, expected a string, a list of strings or chat messages")


# ----------------------------------------------------------------------------- columns


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


# ----------------------------------------------------------------------------- sources


def _split_name(split: str) -> tuple[str, str]:
    """``'train[:100]'`` -> ``('train', '[:100]')``."""
    m = re.fullmatch(r"\s*([^\[\]\s]+)\s*(\[.*\])?\s*", split or "")
    if not m:
        return split, ""
    return m.group(1), m.group(2) or ""


def _file_split(rel: Path) -> str | None:
    tokens = {t for part in rel.with_suffix("").parts for t in re.split(r"[^A-Za-z]+", part.lower()) if t}
    for name, aliases in _SPLIT_ALIASES.items():
        if tokens & set(aliases):
            return name
    return None


def _canonical_split(split: str) -> str:
    for name, aliases in _SPLIT_ALIASES.items():
        if split.lower() in aliases:
            return name
    return split


def _looks_like_path(src: str) -> bool:
    return (
        src.startswith((".", "/", "~"))
        or os.path.isabs(src)
        or os.path.splitext(src)[1].lower() in SUPPORTED_EXTENSIONS
        or src.count("/") > 1
        or "\\" in src
    )


def _first_line(e: BaseException) -> str:
    # datasets wraps the real parser error in DatasetGenerationError; report the inner one
    while type(e).__name__ == "DatasetGenerationError" and e.__cause__ is not None:
        e = e.__cause__
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:300]


def _load_raw(source: str, *, split: str, subset: str | None, config_prefix: str) -> tuple[Any, str]:
    """Return (Dataset, description for messages)."""
    if not isinstance(source, str) or not source.strip():
        raise ConfigError(
            f"{config_prefix}.source is empty; set it to a {_EXT_TEXT} file or folder, or a Hugging Face dataset id"
        )
    src = source.strip()
    if src.startswith("builtin:"):
        raise DataError(
            f"{src!r} is a built-in task, not a file or dataset id; load it through mixrl.tasks, "
            f"or set {config_prefix}.source to a {_EXT_TEXT} file"
        )
    split = split or "train"
    path = Path(src).expanduser()

    if any(ch in src for ch in "*?["):
        files = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
        if not files:
            raise DataError(f"no files match {src!r}; fix {config_prefix}.source")
        return _read_files(files, src, split, config_prefix, slice_only=True), src
    if path.is_file():
        return _read_files([path], src, split, config_prefix, slice_only=True), src
    if path.is_dir():
        return _load_dir(path, src, split, config_prefix), src
    if _looks_like_path(src):
        where = "" if path.is_absolute() else f" (relative to {os.getcwd()})"
        raise DataError(f"data file not found: {src}{where}; fix the path in {config_prefix}.source")
    return _load_hub(src, split, subset, config_prefix), f"dataset {src!r}"


def _builder_for(files: list[Path], src: str, config_prefix: str) -> str:
    builders = set()
    for f in files:
        ext = "".join(f.suffixes[-1:]).lower()
        if ext not in SUPPORTED_EXTENSIONS:
            raise DataError(
                f"unsupported data file type {ext or '(no extension)'!r} for {f}; use a {_EXT_TEXT} file in {config_prefix}.source"
            )
        builders.add(SUPPORTED_EXTENSIONS[ext])
    if len(builders) > 1:
        raise DataError(f"{src} mixes file types ({', '.join(sorted(builders))}); keep one type per {config_prefix}.source")
    return builders.pop()


def _read_files(files: list[Path], src: str, split: str, config_prefix: str, *, slice_only: bool) -> Any:
    import datasets

    builder = _builder_for(files, src, config_prefix)
    _, piece = _split_name(split)
    blank = [f for f in files if _is_blank(f)]
    if len(blank) == len(files):
        what = f"data file {files[0]} is empty" if len(files) == 1 else f"the {len(files)} data files of {src} are empty"
        raise DataError(f"{what}; put the training rows in it or point {config_prefix}.source at a file with rows")
    if blank:
        logger.warning("skipping %d empty file(s) of %s: %s", len(blank), src, ", ".join(map(str, blank)))
        files = [f for f in files if f not in blank]
    if builder in ("json", "csv"):
        for f in files:
            _check_utf8(f, config_prefix)
    try:
        ds = datasets.load_dataset(builder, data_files=[str(f) for f in files], split="train" + (piece if slice_only else ""))
    except Exception as e:  # noqa: BLE001 - every parser error becomes one DataError line
        if "corresponds to no data" in _first_line(e):  # a csv header alone, a json "[]"
            raise DataError(
                f"{src} has no rows (only a header or an empty list); put the training rows in it or point "
                f"{config_prefix}.source at a file with rows"
            ) from None
        raise DataError(
            f"could not read {src} as {builder}: {_first_line(e)}; check that the file is valid {builder}"
        ) from e
    # a .json holding {"rows": [...]} loads as one row with one list column: read that field instead
    if builder == "json" and len(ds) == 1 and len(ds.column_names) == 1:
        (field,) = ds.column_names
        value = ds[0][field]
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            try:
                ds = datasets.load_dataset("json", data_files=[str(f) for f in files], field=field, split="train")
            except Exception as e:  # noqa: BLE001
                raise DataError(f"could not read the {field!r} list of {src}: {_first_line(e)}; check the file") from e
    return ds


def _check_utf8(path: Path, config_prefix: str) -> None:
    """Text data files must be UTF-8: the Arrow reader accepts other bytes and fails later,
    deep inside training, with a traceback. Raises DataError naming the line and the byte."""
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(
                    f"data file {path}, line {lineno}: byte {raw[e.start:e.start + 1]!r} at column {e.start + 1} is not UTF-8 "
                    f"text; re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8) or fix that row of {config_prefix}.source"
                ) from None


def _is_blank(path: Path) -> bool:
    """An empty file, or one of whitespace only (files over 64 KiB are not read here)."""
    size = path.stat().st_size
    return size == 0 or (size < 65536 and not path.read_bytes().strip())


def _load_dir(path: Path, src: str, split: str, config_prefix: str) -> Any:
    import datasets

    split_name, piece = _split_name(split)
    if (path / "dataset_dict.json").exists() or (path / "state.json").exists():
        try:
            loaded = datasets.load_from_disk(str(path))
        except Exception as e:  # noqa: BLE001
            raise DataError(f"could not load the saved dataset in {src}: {_first_line(e)}; re-save it with save_to_disk") from e
        if isinstance(loaded, datasets.DatasetDict):
            if split_name not in loaded:
                raise DataError(
                    f"split {split_name!r} not found in {src}; splits present: {', '.join(loaded)}; "
                    f"set {config_prefix}.split (or {config_prefix}.eval_split) to one of them"
                )
            loaded = loaded[split_name]
        return loaded

    files = sorted(
        f for f in path.rglob("*") if f.is_file() and f.suffix.lower() in SUPPORTED_EXTENSIONS and not any(
            p.startswith(".") for p in f.relative_to(path).parts
        )
    )
    if not files:
        raise DataError(f"no {_EXT_TEXT} files in folder {src}; fix {config_prefix}.source")
    by_split: dict[str | None, list[Path]] = {}
    for f in files:
        by_split.setdefault(_file_split(f.relative_to(path)), []).append(f)
    named = {k for k in by_split if k is not None}
    if not named:
        return _read_files(files, src, split, config_prefix, slice_only=True)
    wanted = _canonical_split(split_name)
    if wanted not in by_split:
        raise DataError(
            f"split {split_name!r} not found in folder {src}; splits present (from file names): "
            f"{', '.join(sorted(named))}; set {config_prefix}.split (or {config_prefix}.eval_split) to one of them"
        )
    return _read_files(by_split[wanted], src, split, config_prefix, slice_only=True)


def _offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _load_hub(src: str, split: str, subset: str | None, config_prefix: str) -> Any:
    import datasets

    args = ", ".join(repr(a) for a in (src, subset) if a)
    try:
        return datasets.load_dataset(src, subset, split=split)
    except ConnectionError as e:
        raise DataError(
            f"dataset {src!r} could not be found offline (not a local path, and not in the local Hugging Face cache); "
            f"set {config_prefix}.source to a local {_EXT_TEXT} file or folder, or pre-download it once with "
            f"HF_HUB_OFFLINE unset (python -c \"import datasets; datasets.load_dataset({args})\")"
        ) from e
    except FileNotFoundError as e:
        where = "in the local cache (offline mode)" if _offline() else "on the Hugging Face Hub"
        raise DataError(
            f"dataset {src!r} not found as a local path nor {where}; fix {config_prefix}.source "
            f"(a {_EXT_TEXT} file or folder, or a dataset id like openai/gsm8k)"
        ) from e
    except ValueError as e:
        msg = _first_line(e)
        low = msg.lower()
        if "split" in low:
            raise DataError(f"dataset {src!r}: {msg}; set {config_prefix}.split") from e
        if "config" in low:
            raise DataError(f"dataset {src!r}: {msg}; set {config_prefix}.subset") from e
        raise DataError(f"could not load dataset {src!r}: {msg}; check {config_prefix}.source / {config_prefix}.subset") from e
