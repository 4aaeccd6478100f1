"""``mixrl eval``: a saved model on its run's held-out split (greedy accuracy, per level, pass@k).

:func:`eval_config` is the config it uses (the run's own ``config.yaml`` with the command line's
overrides on top); :func:`evaluate_saved_model` loads the model folder
(:mod:`mixrl.evaluation.saved`) and evaluates it (:mod:`mixrl.evaluation.accuracy`) on the same
held-out rows training used, with the trainer's reward and tokenizer assembly. It lives on the
trainer side because it needs that assembly; the evaluation package never imports the trainer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from transformers import set_seed

from mixrl.config.checks import check_chat_template
from mixrl.config.compose import _parse, compose_config, expand_aliases, import_plugins, validate
from mixrl.config.schema import GROUPS
from mixrl.config.trust import require_trust
from mixrl.errors import ConfigError, MixrlUserError
from mixrl.evaluation.accuracy import evaluate_accuracy
from mixrl.evaluation.acting import acting_generator
from mixrl.evaluation.saved import adapter_base, load_saved_model, resolve_model_dir
from mixrl.models import tiny_bpe
from mixrl.options import read_user_text
from mixrl.rewards.components import heldout_reward
from mixrl.trainer import build
from mixrl.trainer.build import describe_heldout, heldout_rows


def eval_config(model_dir: str | Path, overrides: list[str], *, trust_run_code: bool = False):
    """The config ``mixrl eval`` uses: the run's own ``config.yaml`` when ``model_dir`` is a
    run directory (or its ``model/``), with the command line's overrides applied on top
    (``group=option`` replaces that whole section); otherwise the overrides alone.
    Returns ``(cfg, config_path or None)``.

    Code the run's config names (plugins, a reward file or module, remote model code) is
    refused unless ``trust_run_code`` (``--trust-run-code``) or the overrides replace it
    (:mod:`mixrl.config.trust`); with it, the run's plugins are imported before validation."""
    p = Path(model_dir)
    saved_path = next((c / "config.yaml" for c in (p, p.parent) if (c / "config.yaml").is_file()), None)
    if saved_path is None or overrides:
        fresh = compose_config(list(overrides))  # a bad override fails here, before any model is loaded
    if saved_path is None:
        return fresh, None
    try:
        saved = OmegaConf.create(read_user_text(saved_path, "the run's config"))  # not UTF-8: one line naming the file
    except Exception as e:  # noqa: BLE001 - any YAML error of a hand-edited or damaged file: one line
        if isinstance(e, MixrlUserError):
            raise
        raise ConfigError(f"{saved_path} is not a config mixrl can read ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                          "restore it, or evaluate the model folder with your own overrides") from None
    if not isinstance(saved, DictConfig):
        raise ConfigError(f"{saved_path} holds a YAML list, not the mapping `mixrl train` writes; restore it")
    user_keys = []
    for ov in _parse(expand_aliases(list(overrides))):
        key = ov.key_or_group
        user_keys.append(key)
        if key in GROUPS:
            saved[key] = fresh[key]
        else:
            OmegaConf.update(saved, key, OmegaConf.select(fresh, key), merge=False, force_add=True)
    require_trust(saved, saved_path.parent, trusted=trust_run_code, what=f"eval {model_dir}", user_keys=user_keys,
                  alternative=" (or override those keys, e.g. reward=exact)")
    import_plugins(list(saved.get("plugins") or []))  # the run's own components (trusted, or named by the user)
    return validate(saved), saved_path


def evaluate_saved_model(model_dir: str | Path, cfg, *, progress: Callable[[int], None] | None = None,
                         on_rows: Callable[[int], None] | None = None) -> dict:
    """Evaluate the model saved in ``model_dir`` on ``cfg``'s held-out split (``data``,
    ``trainer.eval_size``, ``trainer.eval_pass_k``, ``trainer.eval_samples``, ``reward``). Returns a JSON-ready dict
    with the metrics of :func:`~mixrl.evaluation.accuracy.evaluate_accuracy` under ``metrics``."""
    path = resolve_model_dir(model_dir)
    t = cfg.trainer
    if int(t.eval_size) <= 0:
        raise ConfigError("trainer.eval_size must be > 0 to evaluate (it is the number of held-out problems)")
    device = str(cfg.hardware.device)
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("hardware.device=cuda but no CUDA device is available; use hardware=cpu")
    if cfg.hardware.torch_threads:
        torch.set_num_threads(int(cfg.hardware.torch_threads))
    if tiny_bpe.is_tiny_bpe(path) and not tiny_bpe.is_tiny_bpe(cfg.model.path):  # a BPE chat model folder without its run's config
        cfg = cfg.copy()
        cfg.model.path = str(path)  # the built-in task then gives it chat prompts (build.builtin_system_prompt)
    _, rows, heldout = heldout_rows(cfg)  # the same held-out rows as training used, never training rows
    if not rows:
        raise ConfigError(f"the held-out split of '{cfg.data.eval_source or cfg.data.source}' is empty")
    if on_rows is not None:
        on_rows(len(rows))
    reward_funcs, _ = build.build_reward_funcs(cfg)
    tokenizer = build.load_tokenizer(str(path), cfg)
    check_chat_template(tokenizer, [r["prompt"] for r in rows], str(path), cfg)
    dtype = None if cfg.model.dtype == "auto" else getattr(torch, str(cfg.model.dtype))
    t0 = time.perf_counter()
    model = load_saved_model(path, cfg, dtype)
    model.to(device)
    set_seed(int(cfg.seed))
    metrics = evaluate_accuracy(
        model, tokenizer, rows, heldout_reward(reward_funcs[0]), max_new_tokens=int(t.max_completion_length),
        batch_size=int(t.eval_batch_size), pass_k=int(t.eval_pass_k),
        samples=int(t.eval_samples), ks=[int(k) for k in t.eval_pass_at], temperature=float(t.temperature), progress=progress,
        generate=acting_generator(cfg.get("env")),
    )
    return {
        "model_dir": str(path),
        "lora_base": adapter_base(path),  # None: a full model folder
        "data": str(cfg.data.eval_source or cfg.data.source),
        "split": cfg.data.eval_split or ("heldout" if str(cfg.data.source).startswith("builtin:") else "test"),
        "heldout": describe_heldout(heldout),
        "reward": str(cfg.reward.name),
        "max_new_tokens": int(t.max_completion_length),
        "seed": int(cfg.seed),
        "metrics": metrics,
        "seconds": round(time.perf_counter() - t0, 2),
    }
