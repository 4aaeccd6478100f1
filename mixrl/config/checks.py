"""Checks that stop a bad run before any model loads, each with one line and the fix.

Three moments, three functions:

* :func:`check_settings` and :func:`validate_run` (part of
  :func:`mixrl.config.validate.validate_config`, which every command goes through): ranges of
  the run's settings and values no run can use (``trainer.temperature <= 0``,
  ``trainer.max_completion_length <= 0``, ``data.limit <= 0``).
* :func:`check_environment` (called by ``mixrl train``, new or resumed, before a run starts):
  what this machine lacks for the config (CUDA, a package, a writable ``run_dir``, the process
  count a launcher started). ``explain``, ``plan``, ``config show`` and ``eval`` skip it on
  purpose: a GPU recipe can be explained and planned on a laptop.
* :func:`check_training_data` (called at data load, once the tokenizer is known, still
  before the model loads): chat prompts for a tokenizer without a chat template, characters
  the tokenizer cannot encode, prompts longer than
  the model's context, and reward functions that raise or return something other than
  one finite number per completion on the first training rows.
"""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from mixrl.config.generation import check_generation
from mixrl.config.hardware import check_packages, check_world_size, needs_launch
from mixrl.core.registry import format_value, parse_bound
from mixrl.data.cells import texts_of
from mixrl.errors import ConfigError, DataError, MixrlUserError, RunStopped
from mixrl.rewards.builtin import AnswerReward

#: logger name -> (python package, pyproject extra)
LOGGER_PACKAGES = {"wandb": ("wandb", "wandb"), "tensorboard": ("tensorboard", "tensorboard")}


# --------------------------------------------------------------------------- config values
#: valid ranges of the run's numeric settings (a component's own parameters declare theirs
#: where they are defined, see mixrl.core.registry); read by :func:`check_settings`
SETTING_BOUNDS: dict[str, tuple[str, str]] = {
    "seed": ("[0, 4294967295]", "numpy and torch seeds are 32-bit unsigned"),
    "trainer.learning_rate": ("> 0", "the optimizer step size"),
    "trainer.weight_decay": (">= 0", "a negative decay grows the weights"),
    "trainer.max_grad_norm": (">= 0", "the gradient is clipped to this norm; 0 turns clipping off"),
    "trainer.max_abs_advantage": ("> 0", "an advantage larger in magnitude stops the run; null for no bound"),
    "trainer.max_abs_loss": ("> 0", "a loss term larger in magnitude stops the run; null for no bound"),
    "trainer.adam_beta1": ("[0, 1)", "an exponential moving-average factor"),
    "trainer.adam_beta2": ("[0, 1)", "an exponential moving-average factor"),
    "trainer.adam_epsilon": ("> 0", "added to the denominator of every AdamW step"),
    "trainer.warmup_steps": (">= 0", "steps"),
    "trainer.num_iterations": (">= 1", "optimisation passes over each generation batch"),
    "algo.perturbation.sigma": ("> 0", "ALP's noise scale, relative to each token's hidden-state RMS"),
    "algo.reposition.alpha": ("[0, 1]", "SFPO pulls the weights back to theta_0 + alpha (theta - theta_0), between the start and the fast steps' end"),
    "trainer.temperature": ("> 0", "rollouts are sampled"),
    "trainer.top_p": ("(0, 1]", "a probability mass"),
    "trainer.top_k": (">= 0", "the most likely tokens kept when sampling; 0 keeps all"),
    "trainer.logging_steps": (">= 1", "steps"),
    "logger.samples_per_step": ("[0, 1024]", "rows of each logged step written to samples.jsonl; 0 writes none"),
    "logger.samples_eval": ("[0, 1024]", "held-out rows of each evaluation written to samples.jsonl"),
    "logger.samples_max_chars": (">= 16", "characters kept of each prompt and completion in samples.jsonl"),
    "logger.samples_keep_steps": (">= 1", "logged steps whose samples samples.jsonl keeps"),
    "trainer.save_steps": (">= 0", "steps; 0 saves no periodic checkpoint"),
    "trainer.save_total_limit": (">= 0", "checkpoints kept"),
    "trainer.eval_every": (">= 0", "steps; 0 evaluates before and after training only"),
    "trainer.eval_size": (">= 0", "held-out problems"),
    "trainer.eval_pass_k": (">= 0", "samples per problem"),
    "trainer.eval_samples": (">= 0", "samples per problem"),
    "trainer.eval_batch_size": (">= 1", "rows per batch"),
    "data.train_size": (">= 1", "rows of the built-in task"),
    "data.max_prompt_tokens": (">= 1", "the longest prompt the run expects, in tokens"),
    "reward.weight": (">= 0", "a negative weight trains against the reward"),
    "reward.timeout_s": ("> 0", "seconds one reward call may take; null for no limit"),
    "model.lora.r": (">= 1", "the rank of the low-rank update"),
    "model.lora.alpha": ("> 0", "the update is scaled by alpha / r"),
    "model.lora.dropout": ("[0, 1)", "a dropout probability"),
    "hardware.torch_threads": (">= 1", "threads"),
    "hardware.main_process_port": ("[1, 65535]", "a TCP port"),
    "hardware.vllm_gpu_memory_utilization": ("(0, 1]", "a share of the GPU's memory"),
    "hardware.vllm_server_gpu_memory_utilization": ("(0, 1]", "a share of the GPU's memory"),
}


def check_settings(cfg: DictConfig) -> None:
    """Every numeric setting of :data:`SETTING_BOUNDS` inside its range, and no NaN or
    infinite number anywhere in the config; raises ConfigError naming the key and the range."""
    for key, spec in SETTING_BOUNDS.items():
        value = OmegaConf.select(cfg, key, default=None)
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        bound = parse_bound(spec)
        if not bound.contains(value):
            what = "is out of range" if math.isfinite(float(value)) else "is not a finite number"
            raise ConfigError(f"{key}={format_value(value)} {what}: it must be {bound} ({bound.why}); "
                              f"set {key} to a value {bound}")
    bad = _non_finite(OmegaConf.to_container(cfg, resolve=True))
    if bad is not None:
        raise ConfigError(f"{bad[0]}={bad[1]} is not a finite number; set a finite value")


def _non_finite(node: Any, prefix: str = "") -> tuple[str, float] | None:
    if isinstance(node, float) and not math.isfinite(node):
        return prefix, node
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        hit = _non_finite(v, f"{prefix}.{k}" if prefix and isinstance(k, str) else f"{prefix}[{k}]" if prefix else str(k))
        if hit is not None:
            return hit
    return None


def validate_run(cfg: DictConfig) -> None:
    """Reject values that no run can use; raises ConfigError (one line)."""
    t = cfg.trainer
    if float(t.temperature) <= 0:
        raise ConfigError(
            f"trainer.temperature={t.temperature} must be > 0 (rollouts are sampled); "
            "for nearly greedy sampling use a small value such as trainer.temperature=0.1"
        )
    if int(t.max_completion_length) <= 0:
        raise ConfigError(
            f"trainer.max_completion_length={t.max_completion_length} must be a positive number of tokens, "
            "e.g. trainer.max_completion_length=256"
        )
    padding_free = str(t.get("padding_free", "auto")).strip().lower()
    if padding_free not in ("auto", "true", "false"):
        raise ConfigError(f"trainer.padding_free={t.padding_free} is not auto, true or false; "
                          "set trainer.padding_free=auto (packed rows where the model can take them)")
    check_generation(cfg)  # trainer.generation: a known engine, consistent with hardware.use_vllm
    if cfg.data.limit is not None and int(cfg.data.limit) <= 0:
        raise ConfigError(
            f"data.limit={cfg.data.limit} would train on no rows; set a positive number of rows, "
            "or data.limit=null for all of them"
        )


# --------------------------------------------------------------------------- this machine
def _cuda_available() -> bool:
    return torch.cuda.is_available()


def _writable_ancestor(path: Path) -> tuple[Path, bool]:
    p = path.absolute()
    while not p.exists():
        p = p.parent
    return p, p.is_dir() and os.access(p, os.W_OK | os.X_OK)


def check_environment(cfg: DictConfig) -> None:
    """Reject a config this machine cannot run; raises ConfigError (one line). In a process a
    launcher started (or one that needs none) the launched process count must be the config's."""
    check_packages(cfg)
    if cfg.hardware.device == "cuda" and not _cuda_available():
        raise ConfigError(
            f"hardware={cfg.hardware.name} needs a CUDA GPU, but torch sees none on this machine; "
            "use hardware=cpu here (or install a CUDA build of torch on a GPU machine)"
        )
    for name in list(cfg.logger.report_to or []):
        if name in LOGGER_PACKAGES:
            package, extra = LOGGER_PACKAGES[name]
            if importlib.util.find_spec(package) is None:
                raise ConfigError(
                    f"logger {name} needs the '{package}' package, which is not installed; "
                    f"pip install 'mixrl[{extra}]' (or use logger=console)"
                )
    if not needs_launch(cfg):  # else the launcher starts hardware.num_processes: checked in each of them
        check_world_size(cfg, launching=True)
    if cfg.get("resume"):
        return  # the run directory exists and is checked by the resume itself
    if cfg.run_dir:
        run_dir = Path(cfg.run_dir)
        try:
            where, ok = _writable_ancestor(run_dir)
        except OSError as e:  # e.g. a name longer than the file system allows
            raise ConfigError(f"run_dir '{_short_path(run_dir)}' cannot be used ({e.strerror or e}); choose a shorter run_dir "
                              "(each folder name at most 255 bytes on most file systems)") from None
        if not ok:
            raise ConfigError(
                f"run_dir '{run_dir}' cannot be written ({where} is not a writable directory); choose a writable run_dir"
            )


def _short_path(path: Path, width: int = 80) -> str:
    text = str(path)
    return text if len(text) <= width else text[: width // 2] + "..." + text[-width // 4:]


# --------------------------------------------------------------------------- data, tokenizer, rewards
def unencodable_characters(tokenizer, texts) -> list[str]:
    """Characters of ``texts`` that ``tokenizer`` drops or maps to its unknown token."""
    chars: set[str] = set()
    for text in texts:
        chars.update(text)
    unk = getattr(tokenizer, "unk_token_id", None)
    bad = []
    for ch in sorted(chars):
        ids = tokenizer.encode(ch, add_special_tokens=False)
        if not ids or (unk is not None and all(i == unk for i in ids)):
            bad.append(ch)
    return bad


def row_texts(rows) -> list[str]:
    """Every string of the prompt, answer and expert columns of ``rows`` (a Dataset or a list of dicts)."""
    cols = ("prompt", "answer", "expert")
    if hasattr(rows, "column_names"):
        return [t for c in cols if c in rows.column_names for v in rows[c] for t in texts_of(v)]
    return [t for r in rows for c in cols for t in texts_of(r.get(c))]


def check_chat_template(tokenizer, prompts, model_path: str, cfg: DictConfig) -> None:
    """Chat-format prompts (message lists) need a tokenizer with a chat template; raises DataError."""
    chat = next((i for i, p in enumerate(prompts) if isinstance(p, (list, tuple))), None)
    if chat is None or getattr(tokenizer, "chat_template", None):
        return
    why = "data.system_prompt is set" if cfg.data.get("system_prompt") else f"column {cfg.data.prompt_column!r} holds chat messages"
    raise DataError(
        f"row {chat}: the prompts are chat messages ({why}) but the tokenizer of '{model_path}' has no chat template; "
        "use plain-text prompts (data.system_prompt=null and a text prompt column) or a model with a chat template "
        "(e.g. model=qwen2.5-7b-instruct)"
    )


def model_context(model_path: str, cfg: DictConfig) -> int | None:
    """The model's context length from its config (no weights are read), or None."""
    try:
        from transformers import AutoConfig  # deferred: transformers takes seconds to import, and only data loading needs it

        conf = AutoConfig.from_pretrained(model_path, trust_remote_code=bool(cfg.model.trust_remote_code))
    except Exception:  # noqa: BLE001 - unknown here: TRL reports it later
        return None
    return getattr(conf, "max_position_embeddings", None)


def _prompt_tokens(tokenizer, prompt: Any) -> int:
    if isinstance(prompt, str):
        return len(tokenizer(prompt).input_ids)
    return sum(len(tokenizer(t, add_special_tokens=False).input_ids) for t in texts_of(prompt)) + 1


def check_training_data(cfg: DictConfig, tokenizer, train_ds, reward_funcs: list, model_path: str,
                        extra_texts: dict[str, list[str]] | None = None) -> None:
    """Characters, prompt lengths and reward outputs on the training rows; raises DataError
    (one line naming the row and the fix) before any model is loaded. ``extra_texts``: every
    other text the run tokenizes, by where it comes from (held-out rows, a pairs or expert
    file, templates: :func:`mixrl.trainer.build.source_texts`), checked for characters too."""
    check_chat_template(tokenizer, train_ds["prompt"], model_path, cfg)
    for where, texts in {"the training data": row_texts(train_ds), **(extra_texts or {})}.items():
        bad = unencodable_characters(tokenizer, texts)
        if not bad:
            continue
        shown = "".join(bad[:20]) + ("..." if len(bad) > 20 else "")
        fix = "clean the data or use a model whose tokenizer covers them"
        if len(tokenizer) < 256:  # a character vocabulary: a tiny model without its mixrl_tiny.json
            fix = ("this character-level model cannot learn new characters; start from model.path=builtin:tiny "
                   "(it extends its vocabulary to the data's characters) or use a real model (model=...)")
        raise DataError(f"{where} has {len(bad)} character(s) the tokenizer cannot encode (they would be dropped silently): {shown!r}; {fix}")

    context = model_context(model_path, cfg)
    stated = cfg.data.get("max_prompt_tokens")
    if context or stated:
        budget = context - int(cfg.trainer.max_completion_length) if context else None
        for i, prompt in enumerate(train_ds["prompt"]):
            n = _prompt_tokens(tokenizer, prompt)
            if stated and n > int(stated):
                raise DataError(
                    f"training row {i}: the prompt is {n} tokens, longer than data.max_prompt_tokens={stated} (the prompt "
                    "budget the context check assumed); drop or shorten long prompts, or raise data.max_prompt_tokens"
                )
            if budget is not None and n > budget:
                raise DataError(
                    f"training row {i}: the prompt is {n} tokens, and with trainer.max_completion_length="
                    f"{cfg.trainer.max_completion_length} that exceeds the model's context of {context} tokens; "
                    "drop or shorten long prompts, or lower trainer.max_completion_length"
                )

    _check_answers(cfg, train_ds, reward_funcs)
    rows = [train_ds[i] for i in range(min(2, len(train_ds)))]
    if not rows:
        return
    kwargs = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"}
    completions = [_reference_completion(r) for r in rows]
    scored = [False] * len(rows)
    for fn in reward_funcs:
        try:
            out = fn(prompts=[r["prompt"] for r in rows], completions=completions, completion_ids=[[] for _ in rows],
                     trainer_state=None, **kwargs)
        except RunStopped:  # SIGINT / SIGTERM while the reward ran
            raise
        except MixrlUserError as e:  # CheckedReward: raised, timed out, or not one finite number per completion
            raise DataError(f"{e} (checked before training on the first training rows, the reference answer as the completion)") from None
        if len(out) != len(rows):
            raise DataError(f"reward {getattr(fn, '__name__', fn)!r} returned {len(out)} values for {len(rows)} completions")
        scored = [a or v is not None for a, v in zip(scored, out)]
    if not any(scored):  # None = "not applicable"; for every row and function, no rollout would ever be scored
        names = ", ".join(repr(getattr(fn, "spec", getattr(fn, "__name__", fn))) for fn in reward_funcs)
        raise DataError(
            f"reward {names} returned None (no score) for every checked training row, even with the reference answer as "
            "the completion, so training would learn nothing; return a float for the rows it scores "
            "(None only for rows it does not apply to)"
        )


def _check_answers(cfg: DictConfig, train_ds, reward_funcs: list) -> None:
    """The built-in rewards score a completion against the row's answer: an answer column
    that is empty on every row would leave every rollout unscored. Raises DataError."""
    if len(train_ds) == 0:
        return  # no rows at all: check_train_size says so with the sizes
    columns = {getattr(getattr(fn, "fn", fn), "answer_column", None) for fn in reward_funcs
               if isinstance(getattr(fn, "fn", fn), AnswerReward)}
    for column in sorted(c for c in columns if c):
        if column in train_ds.column_names and not any(v is not None and str(v).strip() for v in train_ds[column]):
            raise DataError(
                f"every training row's answer (column {column!r}, from data.answer_column={cfg.data.answer_column!r}) is "
                f"empty, and reward {cfg.reward.name!r} scores completions against it; fill the answers or point "
                "data.answer_column at the column that holds them"
            )


def check_train_size(cfg: DictConfig, train_ds, heldout: dict) -> None:
    """Enough training rows for one optimizer step: TRL's sampler draws
    ``trainer.prompts_per_step`` distinct rows per step and drops an incomplete batch, so
    fewer rows would train 0 steps and "succeed". Raises DataError naming the sizes."""
    n, need = len(train_ds), int(cfg.trainer.prompts_per_step)
    if n >= need:
        return
    read = heldout.get("n_read")
    if read is not None:  # the split rule: rows sharing a prompt with a held-out row leave training too
        where = (f"{read} rows read, {heldout['n_eval']} held out for evaluation and {read - heldout['n_eval'] - n} more "
                 f"dropped because their prompt is a held-out prompt (duplicates), {n} left")
    else:
        where = f"{n} training rows"
    raise DataError(
        f"the training data is too small for one step: {where}, but one step needs trainer.prompts_per_step={need} "
        "distinct rows; add rows (or remove duplicates), lower trainer.prompts_per_step, or hold out fewer rows "
        "(trainer.eval_size, or data.eval_source for a separate file)"
    )


def _reference_completion(row: dict) -> Any:
    answer = row.get("answer")
    text = "" if answer is None else str(answer)
    if isinstance(row.get("prompt"), list):  # conversational data: completions are messages too
        return [{"role": "assistant", "content": text}]
    return text
