"""A paper's reported table, carried by its recipe as data (``recipe_info.paper_table``)::

    recipe_info:
      benchmarks: math6              # the paper's evaluation (conf/benchmarks/)
      paper_table:
        source: "Learning to Reason under Off-Policy Guidance (arXiv:2504.14945), Table 1"
        metric: avg                  # the kind of number the paper reports (avg@k accuracy, in %)
        base: {name: Qwen2.5-Math-7B, scores: {aime24: 11.5, ...}}
        method: {name: LUFFY-Qwen-Math-7B-Zero, scores: {aime24: 29.4, ...}}

Scores are percentages keyed by benchmark name; the table's average row shows the mean of the
paper's row over the benchmarks shown (the paper's own averages go in ``note``). ``mixrl eval`` prints both rows beside its own numbers, so the eval of
the base model can be checked against the paper's base row before GPUs are spent on training.
"""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from mixrl.errors import ConfigError

_KEYS = {"source", "metric", "base", "method", "note"}


def paper_table(cfg) -> dict | None:
    """The config's ``recipe_info.paper_table`` as plain data, validated; None when it has none."""
    info = cfg.get("recipe_info") if cfg is not None else None
    raw = info.get("paper_table") if info is not None else None
    if raw is None:
        return None
    table: Any = OmegaConf.to_container(raw, resolve=True) if OmegaConf.is_config(raw) else raw
    check(table, "recipe_info.paper_table")
    return table


def check(table: Any, where: str) -> None:
    if not isinstance(table, dict) or set(table) - _KEYS:
        raise ConfigError(f"{where} must be a mapping with keys from {', '.join(sorted(_KEYS))}; fix the recipe")
    if not isinstance(table.get("source"), str) or not table["source"].strip():
        raise ConfigError(f"{where}.source must name the paper and its table (title, arXiv id, table number); fix the recipe")
    for row in ("base", "method"):
        r = table.get(row)
        if r is None:
            continue
        if not isinstance(r, dict) or not isinstance(r.get("name"), str) or not isinstance(r.get("scores", {}), dict):
            raise ConfigError(f"{where}.{row} must be {{name: ..., scores: {{benchmark: percent}}}}; fix the recipe")
        for k, v in (r.get("scores") or {}).items():
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 100):
                raise ConfigError(f"{where}.{row}.scores.{k}={v!r} must be a percentage in [0, 100] or null; fix the recipe")


_TRAINING_KEYS = ("eval_benchmarks", "eval_benchmark_problems", "eval_benchmark_k", "eval_benchmark_overrides")


def without_unset(cfg):
    """``cfg`` without ``recipe_info.benchmarks`` / ``paper_table`` when they are null, and without
    the ``trainer.eval_benchmark*`` keys when ``trainer.eval_benchmarks`` is null (a copy), so that
    ``mixrl config show`` prints configs that evaluate no benchmark as before these keys existed.
    A recipe's fidelity ledger (``recipe_info.ledger``, documentation of the run rather than a setting
    of it) is always left out: ``mixrl explain`` prints its differences, the recipe's page all of it."""
    info = cfg.get("recipe_info")
    drop_info = info is not None and ("ledger" in info
                                      or any(k in info and info[k] is None for k in ("benchmarks", "paper_table")))
    t = cfg.get("trainer")
    drop_trainer = t is not None and "eval_benchmarks" in t and t.eval_benchmarks is None
    if not drop_info and not drop_trainer:
        return cfg
    cfg = OmegaConf.create(OmegaConf.to_container(cfg))
    for k in ("benchmarks", "paper_table"):
        if drop_info and k in cfg.recipe_info and cfg.recipe_info[k] is None:
            del cfg.recipe_info[k]
    if drop_info and "ledger" in cfg.recipe_info:
        del cfg.recipe_info["ledger"]
    if drop_trainer:
        for k in _TRAINING_KEYS:
            if k in cfg.trainer:
                del cfg.trainer[k]
    return cfg
