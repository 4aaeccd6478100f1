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
model loads; :func:`empty_tokenizer_note` is the tokenizer's check once it is loaded.
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
