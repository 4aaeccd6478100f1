"""A saved model folder: a full model, or a LoRA adapter merged into its base model.

``mixrl eval`` and ``mixrl publish`` take a run directory or its ``model/`` folder;
:func:`resolve_model_dir` finds the folder and refuses (one line, :class:`ConfigError`) one that
holds no model, whose weights file is unreadable (:mod:`mixrl.models.files`) or whose LoRA
base model is gone, before anything is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path

from mixrl.errors import ConfigError
from mixrl.models.files import check_model_files


def resolve_model_dir(path: str | Path) -> Path:
    """A saved model folder (a full model, or a LoRA adapter whose base model is still there);
    a run directory stands for its ``model/`` folder."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"model directory '{p}' does not exist; give a run's model/ folder or the run directory")
    if p.is_dir() and not _is_model(p) and _is_model(p / "model"):
        p = p / "model"
    if not p.is_dir() or not _is_model(p):
        raise ConfigError(
            f"'{p}' is not a saved model folder (no config.json, nor a LoRA adapter_config.json); "
            "give a run's model/ folder or the run directory"
        )
    check_model_files(p, f"model directory '{p}'")  # no weights, or a weights file cut short: refused before anything loads
    adapter_base(p)  # a LoRA adapter's base model must still be there
    return p


def _is_model(p: Path) -> bool:
    return (p / "config.json").is_file() or (p / "adapter_config.json").is_file()


def adapter_base(path: Path) -> str | None:
    """The base model a LoRA adapter folder was trained on (``adapter_config.json``), or None
    for a full model folder; raises ConfigError when that base is a local folder that is gone."""
    if (path / "config.json").is_file() or not (path / "adapter_config.json").is_file():
        return None
    try:
        base = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
    except (OSError, ValueError) as e:
        raise ConfigError(f"could not read {path / 'adapter_config.json'} ({e}); re-save the adapter") from None
    if not base:
        raise ConfigError(f"{path / 'adapter_config.json'} names no base model (base_model_name_or_path); set it to the base model")
    if Path(base).is_absolute() and not Path(base).is_dir():
        raise ConfigError(
            f"the LoRA adapter in '{path}' was trained on the base model '{base}', which is no longer there; restore "
            "that folder (mixrl model build-tiny rebuilds the built-in tiny model) or point base_model_name_or_path "
            "in adapter_config.json at the base model"
        )
    return str(base)


def load_saved_model(path: Path, cfg, dtype=None):
    """The model in ``path``: a full model folder, or a LoRA adapter merged into its base model."""
    from transformers import AutoModelForCausalLM  # deferred: transformers is heavy; the light commands (--help, config show, plan) never load it

    trust = bool(cfg.model.trust_remote_code)
    base = adapter_base(path)
    if base is None:
        return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, trust_remote_code=trust)
    from peft import PeftModel  # deferred: peft imports transformers; only a LoRA/adapter path needs it

    model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype, trust_remote_code=trust)
    return PeftModel.from_pretrained(model, str(path)).merge_and_unload()

