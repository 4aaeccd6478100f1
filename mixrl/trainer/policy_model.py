"""The policy's model folder and tokenizer for a run: a built-in model built (and cached) on first
use, a local folder checked readable, a hub id passed on; the tokenizer loaded left-padded; the
tiny model's vocabulary extended with the characters of the data it lacks."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from mixrl.errors import ConfigError
from mixrl.models import builtin
from mixrl.models.files import check_model_files, empty_tokenizer_note


def resolve_model_path(cfg: DictConfig, *, progress: bool = True) -> str:
    """A local directory or hub id; a built-in model (:mod:`mixrl.models.builtin`) is built (and cached) on first use."""
    path = cfg.model.path
    if builtin.is_builtin(path):
        try:
            return builtin.resolve(path, progress=progress, why=f"the policy (model.path={path})")
        except ValueError as e:
            raise ConfigError(str(e)) from None
    if os.path.isabs(path) or path.startswith("."):
        if not Path(path).is_dir():
            raise ConfigError(f"model.path '{path}' is not a directory; give a local model folder or a Hugging Face id")
    if Path(path).is_dir():
        check_model_files(path, f"model.path={path}")  # no weights, or a weights file cut short: refused before the run directory
    return path


def load_tokenizer(model_path: str, cfg: DictConfig):
    from transformers import AutoTokenizer  # deferred: transformers is heavy; the light commands (--help, config show, plan) never load it

    try:
        tok = AutoTokenizer.from_pretrained(model_path, trust_remote_code=cfg.model.trust_remote_code)
    except OSError as e:
        raise ConfigError(
            f"could not load the tokenizer of '{model_path}' (offline?): {str(e).splitlines()[0]}; "
            "download it first or point model.path at a local folder"
        ) from None
    empty = empty_tokenizer_note(tok, model_path)  # a folder without tokenizer files: transformers' stand-in has no vocabulary
    if empty is not None:
        raise ConfigError(empty)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def tiny_missing_characters(cfg: DictConfig, model_path: str, tokenizer, texts: list[str]) -> list[str]:
    """Characters of ``texts`` the tiny model (``model.path=builtin:tiny`` or a folder with
    ``mixrl_tiny.json``) lacks and will be extended with; ``[]`` for any other model."""
    from mixrl.models import tiny_vocab  # deferred: tiny_vocab imports transformers; `mixrl plan` imports this module and must not load it

    if cfg.model.path != "builtin:tiny" and not tiny_vocab.is_tiny(model_path):
        return []
    return tiny_vocab.missing_characters(tokenizer, texts)


def extend_tiny(cfg: DictConfig, model_path: str, chars: list[str], say=print) -> tuple[str, Any]:
    """``(model_path, tokenizer)`` of the tiny model extended with ``chars`` (built once, cached;
    see :mod:`mixrl.models.tiny_vocab`)."""
    from mixrl.models import tiny_vocab  # deferred: tiny_vocab imports transformers; `mixrl plan` imports this module and must not load it

    path = str(tiny_vocab.extend(model_path, chars))
    shown = "".join(chars[:20]) + ("..." if len(chars) > 20 else "")
    say(f"tiny model: added the data's {len(chars)} new character(s) {shown!r} to its vocabulary "
        f"(new embedding rows start near the mean of the trained ones): {path}")
    return path, load_tokenizer(path, cfg)
