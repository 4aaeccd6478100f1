"""A config's training and held-out rows: the built-in tasks' rows (chat prompts for a chat
model), a file, folder or hub dataset's rows, the held-out split kept apart from training, and
the one line that says where the held-out rows come from."""

from __future__ import annotations

from omegaconf import DictConfig

from mixrl.data.cells import to_chat_prompt
from mixrl.errors import ConfigError, DataError
from mixrl.evaluation.heldout import describe, separate_heldout
from mixrl.models import tiny_bpe, tiny_bpe_tools
from mixrl.sources import SOURCES
from mixrl.tasks import arith, arith_tools

BUILTIN = "builtin:"


def builtin_system_prompt(cfg: DictConfig) -> str | None:
    """The system message of the built-in task's prompts: ``data.system_prompt``; left null, the
    BPE chat model's own (:data:`mixrl.models.tiny_bpe.SYSTEM_PROMPT`) when ``model.path`` is that
    model (``builtin:tiny-bpe`` or its folder), since it was warm-started on chat-formatted prompts;
    else None (plain-text prompts). ``data.system_prompt=''`` gives the BPE model plain text."""
    if cfg.data.system_prompt is not None:
        return cfg.data.system_prompt or None
    if cfg.data.source == BUILTIN + arith_tools.NAME:  # the tool task: chat prompts for every chat model
        return arith_tools.SYSTEM_PROMPT
    return tiny_bpe.SYSTEM_PROMPT if tiny_bpe.is_tiny_bpe(cfg.model.path) else None


def _builtin_rows(cfg: DictConfig, split: str, n: int, seed: int) -> list[dict]:
    """Rows of the built-in task; chat prompts (system + user message) when :func:`builtin_system_prompt` gives one."""
    name = cfg.data.source[len(BUILTIN):]
    if name not in ("arith", arith_tools.NAME):
        raise ConfigError(f"unknown built-in dataset '{cfg.data.source}'; the built-in tasks are builtin:arith, builtin:arith_tools")
    levels = list(cfg.data.levels)
    task = arith if name == "arith" else arith_tools
    try:
        if split == "train":
            rows = task.train_split(n, seed=seed, levels=levels)
        else:
            rows = task.heldout_split(n, levels=levels)
    except ValueError as e:
        raise ConfigError(f"data.levels: {e}") from None
    if task is arith_tools:  # the expert's tool trajectory, as the built-in tool model's template writes it
        rows = [{**r, "trajectory": tiny_bpe_tools.trajectory_text(r)} for r in rows]
    system = builtin_system_prompt(cfg)
    if system:
        rows = [{**r, "prompt": to_chat_prompt(r["prompt"], system)} for r in rows]
    return rows


def load_train_rows(cfg: DictConfig):
    """The training dataset (a ``datasets.Dataset`` with prompt, answer[, expert] columns)."""
    from datasets import Dataset  # deferred: datasets is heavy; the light commands (--help, config show, plan) never load it

    d = cfg.data
    if d.source.startswith(BUILTIN):
        rows = _builtin_rows(cfg, "train", int(d.limit or d.train_size), int(cfg.seed))
        ds = Dataset.from_list(rows)
        if d.expert_column:
            ds = ds.map(lambda r: {"expert": [r[d.expert_column]]})
        return ds
    from mixrl.data.loading import load_dataset_rows  # deferred: data.loading imports datasets; `mixrl plan` imports this module and must not load it

    return load_dataset_rows(
        d.source, split=d.split, subset=d.subset, prompt_column=d.prompt_column, answer_column=d.answer_column,
        expert_column=d.expert_column, system_prompt=d.system_prompt, limit=d.limit,
        expert_required=SOURCES.get(cfg.offpolicy.source.name).reads_expert_column  # e.g. GRPO: prompt/answer suffice
        or (cfg.get("teacher") is not None and cfg.teacher.source.get("privileged") == "expert"),  # OPSD
    )


def load_eval_rows(cfg: DictConfig) -> list[dict]:
    """A fixed held-out split for accuracy (never overlaps the built-in training split)."""
    d, n = cfg.data, int(cfg.trainer.eval_size)
    if n <= 0:
        return []
    source = d.eval_source or d.source
    if source.startswith(BUILTIN):
        return _builtin_rows(cfg, "heldout", n, 0)
    from mixrl.data.loading import load_dataset_rows  # deferred: data.loading imports datasets; `mixrl plan` imports this module and must not load it

    try:
        ds = load_dataset_rows(
            source, split=d.eval_split or "test", subset=d.subset, prompt_column=d.prompt_column,
            answer_column=d.answer_column, system_prompt=d.system_prompt, limit=n,
        )
    except DataError:
        raise
    return [dict(r) for r in ds]


def heldout_rows(cfg: DictConfig):
    """``(train_ds, eval_rows, info)``: the training rows and held-out rows of ``cfg``, never
    sharing a prompt (see :mod:`mixrl.evaluation.heldout` for the rule)."""
    train_ds = load_train_rows(cfg)
    eval_rows = load_eval_rows(cfg)
    source = str(cfg.data.eval_source or cfg.data.source)
    if str(cfg.data.source).startswith("builtin:") and not cfg.data.eval_source:
        return train_ds, eval_rows, {"rule": "builtin", "source": source, "n_eval": len(eval_rows), "n_train": len(train_ds)}
    return separate_heldout(train_ds, eval_rows, int(cfg.trainer.eval_size), source)


def describe_heldout(info: dict) -> str:
    """One line saying where the held-out rows come from and how they are kept apart from training."""
    if info["rule"] == "builtin":
        return f"held-out: {info['n_eval']} problems of the built-in task's held-out split (disjoint from training)"
    return describe(info)
