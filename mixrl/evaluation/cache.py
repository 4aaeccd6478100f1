"""A cache of the starting model's held-out evaluation (``trainer.eval_before_cache``).

Every run of a grid evaluates its starting model before training. For the runs of one seed
that evaluation is the same work with the same result: the same model, held-out rows,
sampling seed and evaluation settings. With ``trainer.eval_before_cache=DIR`` the first run
stores its result in ``DIR/<key>.json`` and later runs with the same key read it instead of
evaluating again (``mixrl reproduce`` sets it for its grids).

The key is a hash of everything the result depends on:
- the model folder (its path, and the size and modification time of its files) and its dtype;
- the held-out prompts and answers;
- the seed and the evaluation settings: new tokens, batch size, temperature, pass@k, samples, ks;
- the reward.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf


def _model_fingerprint(model_path: str) -> list:
    p = Path(model_path)
    if not p.is_dir():
        return [model_path]  # a hub id: its revision is what the name resolves to
    files = sorted(f for f in p.iterdir() if f.is_file())
    return [str(p.resolve()), *[(f.name, f.stat().st_size, int(f.stat().st_mtime)) for f in files]]


def cache_key(cfg, model_path: str, rows: list[dict]) -> str:
    t = cfg.trainer
    payload: dict[str, Any] = {
        "model": _model_fingerprint(model_path),
        "dtype": str(cfg.model.dtype),
        "lora": bool(cfg.model.lora.get("enabled", False)) if cfg.model.get("lora") else False,
        "rows": [[str(r.get("prompt")), str(r.get("answer"))] for r in rows],
        "seed": int(cfg.seed),
        "eval": [int(t.max_completion_length), int(t.eval_batch_size), float(t.temperature), int(t.eval_pass_k),
                 int(t.eval_samples), [int(k) for k in t.eval_pass_at]],
        "reward": [str(cfg.reward.name), json.dumps(_plain(cfg.reward.params), sort_keys=True, default=str)],
    }
    env = cfg.get("env")
    if env is not None and str(env.get("name") or "single") != "single":  # the evaluation acts (mixrl.evaluation.acting)
        payload["env"] = json.dumps(_plain(env), sort_keys=True, default=str)
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _plain(node):
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def load(cache_dir: str | Path, key: str) -> dict | None:
    p = Path(cache_dir) / f"{key}.json"
    try:
        return json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def store(cache_dir: str | Path, key: str, result: dict) -> None:
    """Write atomically (a parallel run with the same key may write at the same time)."""
    d = Path(cache_dir)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{key}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(result, indent=2))
    os.replace(tmp, d / f"{key}.json")
