"""The model's shape for ``mixrl plan``: from a local ``config.json`` (never the weights) or the
table of known models, and the shapes of the teacher and reward models a config loads.

A built-in model (``builtin:tiny``, ``builtin:tiny-bpe``, ``builtin:tiny-rm``) always takes its row of
the table, never the ``config.json`` of a copy built in the local cache: the plan must read the same on
every machine (the recipe pages of the docs site embed it, and ``mixrl docs site --check`` compares
them), and the table's rows are checked against the built models by ``tests/test_plan.py``.

The parameter count :meth:`ModelShape.params` is checked against :data:`PUBLISHED_PARAMS_B`
by ``tests/test_plan.py``; the formulas that use the shape are in :mod:`mixrl.planning.memory`
(explained in :mod:`mixrl.plan`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from mixrl.models.known import KNOWN_MODELS

#: published parameter counts (billions) the formula is checked against
#: (Qwen3: the model cards' "Number of Parameters": 4.0B / 8.2B, and the safetensors totals the hub pages show, 4.02B / 8.19B)
PUBLISHED_PARAMS_B = {"Qwen/Qwen2.5-7B-Instruct": 7.62, "Qwen/Qwen2.5-Math-7B": 7.62, "Qwen/Qwen2.5-Math-1.5B": 1.54,
                      "Qwen/Qwen3-4B-Instruct-2507": 4.02, "Qwen/Qwen3-8B": 8.19,
                      "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": 1.78, "meta-llama/Llama-3.1-8B-Instruct": 8.03}


@dataclass
class ModelShape:
    source: str  # where the shape came from
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    bias: bool  # q/k/v biases (Qwen2; Qwen3 has none)
    explicit_head_dim: int | None = None  # config.json's head_dim (Qwen3: 128, not hidden / heads)
    qk_norm: bool = False  # per-head RMSNorms on q and k (Qwen3)

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def params(self) -> int:
        h, i, q, kv = self.hidden, self.intermediate, self.q_dim, self.kv_dim
        attn = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if self.bias else 0) + (2 * self.head_dim if self.qk_norm else 0)
        layer = attn + 3 * h * i + 2 * h
        return self.vocab * h * (1 if self.tied else 2) + self.layers * layer + h

    def lora_params(self, r: int) -> int:
        h, i, q, kv = self.hidden, self.intermediate, self.q_dim, self.kv_dim
        per_layer = (h + q) + (h + kv) * 2 + (q + h) + (h + i) * 2 + (i + h)  # q, k, v, o, gate, up, down
        return self.layers * r * per_layer


def _shape(conf: dict, source: str) -> ModelShape:
    return ModelShape(
        source=source, hidden=int(conf["hidden_size"]), intermediate=int(conf["intermediate_size"]),
        layers=int(conf["num_hidden_layers"]), heads=int(conf["num_attention_heads"]),
        kv_heads=int(conf.get("num_key_value_heads") or conf["num_attention_heads"]), vocab=int(conf["vocab_size"]),
        tied=bool(conf.get("tie_word_embeddings", False)),
        bias=conf.get("model_type") == "qwen2" or bool(conf.get("attention_bias", False)),  # Qwen2 always has them
        explicit_head_dim=int(conf["head_dim"]) if conf.get("head_dim") else None,
        qk_norm=conf.get("model_type") == "qwen3",
    )


def model_shape(cfg: DictConfig) -> ModelShape | None:
    """The model's shape from a local ``config.json`` (never the weights) or the known table (a
    built-in model: the table only, whatever the local cache holds)."""
    path = str(cfg.model.path)
    local = None
    if not path.startswith("builtin:") and Path(path).is_dir():
        local = Path(path)
    if local is not None and (local / "config.json").is_file():
        conf = json.loads((local / "config.json").read_text())
        if all(k in conf for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")):
            return _shape(conf, f"{local / 'config.json'}")
    if path in KNOWN_MODELS:
        return _shape(KNOWN_MODELS[path], "mixrl.models.known.KNOWN_MODELS (published config.json)")
    return None


def teacher_shapes(cfg: DictConfig) -> list[ModelShape | None]:
    """The shapes of the teacher models a config loads (``self`` loads none)."""
    source = cfg.get("teacher", {}).get("source", {}) or {}
    if source.get("name") != "teacher":
        return []
    shapes = []
    for path in source.get("models") or []:
        path = str(path)
        if path == "self":
            continue
        if path in ("builtin:tiny-teacher", "builtin:tiny-bpe-teacher"):  # the same shape as its student model
            path = path.removesuffix("-teacher")
        shapes.append(model_shape(OmegaConf.create({"model": {"path": path}})))
    return shapes


def reward_model_shapes(cfg: DictConfig) -> list[ModelShape | None]:
    """The shapes of the reward models a config loads (``reward.name=model``, or one in ``reward.extra``): frozen,
    whole on every GPU (:mod:`mixrl.rewards.reward_model`)."""
    specs = [cfg.reward] + list(cfg.reward.get("extra") or [])
    paths = [str((s.get("params") or {}).get("path", "builtin:tiny-rm")) for s in specs if s.get("name") == "model"]
    return [model_shape(OmegaConf.create({"model": {"path": path}})) for path in paths]
