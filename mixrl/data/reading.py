"""Read the raw rows of a data source: a local ``.jsonl`` / ``.json`` / ``.parquet`` / ``.csv``
file, a glob of them, a folder of them (files named after splits are picked by ``split``), a
folder written by ``Dataset.save_to_disk``, or a Hugging Face dataset id. Every failure (missing
file or split, unreadable or non-UTF-8 file, dataset not cached offline) becomes one
``DataError`` line naming the fix; :func:`mixrl.data.loading.load_dataset_rows` then maps the
rows onto the standard columns.
"""

from __future__ import annotations

import glob
import logging
import os
import re
from pathlib import Path
from typing import Any

import datasets

from mixrl.errors import ConfigError, DataError

__all__ = ["SUPPORTED_EXTENSIONS"]

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


def _source_key(config_prefix: str) -> str:
    """The key a user fixes: ``data.source`` for a config section, the option itself for a command's ``--source``."""
    return config_prefix if config_prefix.startswith("--") else f"{config_prefix}.source"


def _load_raw(source: str, *, split: str, subset: str | None, config_prefix: str) -> tuple[Any, str]:
    """Return (Dataset, description for messages)."""
    if not isinstance(source, str) or not source.strip():
        raise ConfigError(
            f"{_source_key(config_prefix)} is empty; set it to a {_EXT_TEXT} file or folder, or a Hugging Face dataset id"
        )
    src = source.strip()
    if src.startswith("builtin:"):
        raise DataError(
            f"{src!r} is a built-in task, not a file or dataset id; load it through mixrl.tasks, "
            f"or set {_source_key(config_prefix)} to a {_EXT_TEXT} file"
        )
    split = split or "train"
    path = Path(src).expanduser()

    if any(ch in src for ch in "*?["):
        files = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
        if not files:
            raise DataError(f"no files match {src!r}; fix {_source_key(config_prefix)}")
        return _read_files(files, src, split, config_prefix, slice_only=True), src
    if path.is_file():
        return _read_files([path], src, split, config_prefix, slice_only=True), src
    if path.is_dir():
        return _load_dir(path, src, split, config_prefix), src
    if _looks_like_path(src):
        where = "" if path.is_absolute() else f" (relative to {os.getcwd()})"
        raise DataError(f"data file not found: {src}{where}; fix the path in {_source_key(config_prefix)}")
    return _load_hub(src, split, subset, config_prefix), f"dataset {src!r}"


def _builder_for(files: list[Path], src: str, config_prefix: str) -> str:
    builders = set()
    for f in files:
        ext = "".join(f.suffixes[-1:]).lower()
        if ext not in SUPPORTED_EXTENSIONS:
            raise DataError(
                f"unsupported data file type {ext or '(no extension)'!r} for {f}; use a {_EXT_TEXT} file in {_source_key(config_prefix)}"
            )
        builders.add(SUPPORTED_EXTENSIONS[ext])
    if len(builders) > 1:
        raise DataError(f"{src} mixes file types ({', '.join(sorted(builders))}); keep one type per {_source_key(config_prefix)}")
    return builders.pop()


def _read_files(files: list[Path], src: str, split: str, config_prefix: str, *, slice_only: bool) -> Any:
    builder = _builder_for(files, src, config_prefix)
    _, piece = _split_name(split)
    blank = [f for f in files if _is_blank(f)]
    if len(blank) == len(files):
        what = f"data file {files[0]} is empty" if len(files) == 1 else f"the {len(files)} data files of {src} are empty"
        raise DataError(f"{what}; put the training rows in it or point {_source_key(config_prefix)} at a file with rows")
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
                f"{_source_key(config_prefix)} at a file with rows"
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
                    f"text; re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8) or fix that row of {_source_key(config_prefix)}"
                ) from None


def _is_blank(path: Path) -> bool:
    """An empty file, or one of whitespace only (files over 64 KiB are not read here)."""
    size = path.stat().st_size
    return size == 0 or (size < 65536 and not path.read_bytes().strip())


def _load_dir(path: Path, src: str, split: str, config_prefix: str) -> Any:
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
        raise DataError(f"no {_EXT_TEXT} files in folder {src}; fix {_source_key(config_prefix)}")
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
    args = ", ".join(repr(a) for a in (src, subset) if a)
    try:
        return datasets.load_dataset(src, subset, split=split)
    except ConnectionError as e:
        raise DataError(
            f"dataset {src!r} could not be found offline (not a local path, and not in the local Hugging Face cache); "
            f"set {_source_key(config_prefix)} to a local {_EXT_TEXT} file or folder, or pre-download it once with "
            f"HF_HUB_OFFLINE unset (python -c \"import datasets; datasets.load_dataset({args})\")"
        ) from e
    except FileNotFoundError as e:
        where = "in the local cache (offline mode)" if _offline() else "on the Hugging Face Hub"
        raise DataError(
            f"dataset {src!r} not found as a local path nor {where}; fix {_source_key(config_prefix)} "
            f"(a {_EXT_TEXT} file or folder, or a dataset id like openai/gsm8k)"
        ) from e
    except ValueError as e:
        msg = _first_line(e)
        low = msg.lower()
        if "split" in low:
            raise DataError(f"dataset {src!r}: {msg}; set {config_prefix}.split") from e
        if "config" in low:
            raise DataError(f"dataset {src!r}: {msg}; set {config_prefix}.subset") from e
        raise DataError(f"could not load dataset {src!r}: {msg}; check {_source_key(config_prefix)} / {config_prefix}.subset") from e
