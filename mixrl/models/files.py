"""Cheap checks that the files of a saved model or checkpoint can be read, before anything loads them.

A copy or a save cut short (a full disk, a killed ``cp``/``rsync``, a partial download) leaves
a weights file whose tensors run past its end, and transformers then fails deep inside
loading with a library's message (``SafetensorError: incomplete metadata``). A folder copied
without its tokenizer files makes transformers build an empty tokenizer from ``config.json``,
which turns every prompt into no tokens and fails at generation (``IndexError``).
:func:`unreadable_file` finds the first unreadable file in milliseconds (headers only), so
``resume`` (:func:`mixrl.trainer.state.rundir.resume_checkpoint`), ``mixrl eval`` / ``mixrl publish``
(:func:`mixrl.evaluation.saved.resolve_model_dir`) and ``mixrl train model.path=FOLDER``
(:func:`mixrl.trainer.build.resolve_model_path`) refuse such a folder in one line before any
model loads; :func:`check_model_files` also refuses a folder without its weights (a copy that left
them out) or without its ``config.json``; :func:`empty_tokenizer_note` is the tokenizer's check once it is loaded.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from mixrl.errors import ConfigError

#: files a Hugging Face tokenizer is saved as (any one of them is enough to load one)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model", "sentencepiece.bpe.model")


def unreadable_file(folder: str | Path, *, recursive: bool = True) -> tuple[str, str] | None:
    """The first file of ``folder`` that cannot be read, as ``(name, reason)``; None when all
    can. Cheap: a safetensors file's header (its tensors' offsets must fit the file), a
    torch.save file's zip directory (at its end, so a truncated file fails), a JSON file's
    text. Bit flips inside tensor data are not detected. ``recursive``: subfolders too."""
    folder = Path(folder)
    files = folder.rglob("*") if recursive else folder.iterdir()
    for f in sorted(p for p in files if p.is_file()):
        name = str(f.relative_to(folder))
        try:
            if f.suffix == ".safetensors":
                from safetensors import safe_open  # deferred: safetensors is needed only when weights are read or written

                with safe_open(str(f), framework="pt") as st:
                    list(st.keys())
            elif f.suffix in (".pt", ".pth", ".bin"):
                with zipfile.ZipFile(f) as z:
                    z.namelist()
            elif f.suffix == ".json":
                json.loads(f.read_text())
        except Exception as e:  # noqa: BLE001 - any failure to parse is the answer
            return name, f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else 'cannot be parsed'}"[:160]
    return None


def check_model_folder(folder: str | Path, what: str) -> None:
    """ConfigError (one line, ``what`` names the setting) when a top-level file of the model
    folder ``folder`` is unreadable (:func:`unreadable_file`)."""
    bad = unreadable_file(folder, recursive=False)
    if bad is not None:
        name, reason = bad
        raise ConfigError(f"{what}: {Path(folder) / name} is unreadable ({reason}); the model folder is damaged "
                          "(a save or copy cut short): save or copy it again")


#: the weights of a full model folder (one file, or an index of shards) and of a LoRA adapter, as transformers and PEFT save them
MODEL_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")


def check_model_files(path: str | Path, what: str) -> Path:
    """The model folder ``path``, checked before anything loads it (ConfigError, one line that starts
    with ``what``, e.g. ``model directory 'runs/x/model'``, and names the fix): it is a folder, holds
    ``config.json`` (a full model) or ``adapter_config.json`` (a LoRA adapter), holds that model's
    weights (a weights file, or an index whose every shard is there), and every top-level file
    can be read (:func:`check_model_folder`: a save cut short). Without this, transformers fails
    deep inside loading with an ``OSError`` of its own (no weights) or a library's message."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{what}: '{p}' does not exist; give a saved model folder")
    if not p.is_dir():
        raise ConfigError(f"{what}: '{p}' is a file, not a model folder; give the folder that holds it ({p.parent})")
    full, adapter = (p / "config.json").is_file(), (p / "adapter_config.json").is_file()
    if not full and not adapter:
        raise ConfigError(f"{what}: '{p}' holds no config.json (nor a LoRA adapter_config.json), so it is not a saved model "
                          "folder; give the folder save_pretrained wrote")
    check_model_folder(p, what)  # every top-level file readable (JSON parses, weights' headers fit)
    names = MODEL_WEIGHTS if full else ADAPTER_WEIGHTS
    found = [n for n in names if (p / n).is_file()]
    if not found:
        kind = "model" if full else "LoRA adapter"
        raise ConfigError(f"{what}: '{p}' holds no {kind} weights (none of {', '.join(names)}); the save or copy left them out: "
                          "copy the weights file(s) into the folder, or save the model again")
    for index in (n for n in found if n.endswith(".index.json")):
        try:
            shards = sorted(set(json.loads((p / index).read_text()).get("weight_map", {}).values()))
        except (OSError, ValueError, AttributeError):
            shards = []
        missing = [s for s in shards if not (p / s).is_file()]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise ConfigError(f"{what}: '{p}' lacks the weights shard {missing[0]}{more} that {index} lists; copy it into the folder")
    return p


def empty_tokenizer_note(tokenizer, model_path: str) -> str | None:
    """Why the loaded ``tokenizer`` cannot be used (None when it can): it turns text into no
    tokens, as transformers' stand-in does for a folder without tokenizer files."""
    try:
        ids = tokenizer("0123456789 abc xyz", add_special_tokens=False)["input_ids"]
    except Exception:  # noqa: BLE001 - a tokenizer that cannot encode text is as unusable
        ids = []
    if ids:
        return None
    folder = Path(model_path)
    if folder.is_dir() and not any((folder / n).is_file() for n in TOKENIZER_FILES):
        return (f"'{model_path}' holds no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, ...); copy them from the model "
                f"it was trained from, or save them there (tokenizer.save_pretrained('{model_path}'))")
    return (f"the tokenizer of '{model_path}' turns text into no tokens (an empty vocabulary); "
            "restore the folder's tokenizer files from the model it was trained from")
