"""Two rehearsal rules beside the core table of :data:`mixrl.config.rehearsal.RULES`:

* **reward models** (``reward=model``, or one in ``reward.extra``): a hub sequence classifier -> the
  built-in one (``builtin:tiny-rm``, a Qwen2 classifier trained here on the arithmetic task's right and
  wrong completions; ``python -m mixrl.models.tiny_rm``), so that the recipe's reward path
  (re-tokenisation, batching, transform, normalisation, gate) runs without a download. Its scores mean
  nothing on the recipe's data: the rehearsal checks that the pieces run together, not what they learn.
* **whole groups per process**: two injections read only the groups that lie wholly on one process.
  One that revisits buffered prompts (``revisit``, e.g. SOUP's historical prefixes) revisits
  ``round(revisit x whole groups)`` of them; on-policy preference pairs (``pairs`` with ``on_policy > 0``,
  SimpleMix; ``group_pairs``) are the best vs worst of a whole group. With the rehearsal's one prompt
  split over two processes no process holds a whole group, so SOUP's historical prefix and SimpleMix's
  on-policy pairs never ran (their rehearsals trained on the rest and passed). The rehearsal keeps
  ``world x ceil(1 / revisit)`` prompts per step for the first and ``world`` for the second, so that
  every process has a whole group to revisit or pair.
* **preference pairs per step** (``algo.inject.pairs`` of ``pairs`` / ``group_pairs``): scaled with the
  prompts, a multiple of the processes (at least one pair each), so the on-/off-policy ratio is the
  recipe's (SimpleMix's 128 pairs for 64 prompts -> 4 for 2 prompts on 2 processes: 1 + 1 per process,
  not 1 on-policy + 32 off-policy).
"""

from __future__ import annotations

import math
import os
from typing import Any

from omegaconf import DictConfig

__all__ = ["BUILTIN_RM", "is_hub_id", "whole_group_prompts", "reward_model_swaps"]

BUILTIN_RM = "builtin:tiny-rm"


def is_hub_id(source: Any) -> bool:
    """A Hugging Face dataset / model id (``owner/name``), not ``builtin:`` and not a local path."""
    return (
        isinstance(source, str) and "/" in source and not source.startswith(("builtin:", ".", "/", "~"))
        and not os.path.exists(source)
    )


def reward_model_swaps(cfg: DictConfig) -> list[tuple[str, Any, Any, str]]:
    """(key, recipe value, rehearsal value, why) for every reward model of ``cfg`` read from the hub."""
    out = []
    specs = [("reward", cfg.reward)] + [(f"reward.extra.{i}", spec) for i, spec in enumerate(cfg.reward.get("extra") or [])]
    for key, spec in specs:
        params = spec.get("params") or {}
        if str(spec.get("name")) == "model" and is_hub_id(params.get("path")):
            out.append((f"{key}.params.path", str(params.path), BUILTIN_RM,
                        f"no download: the built-in reward model ({BUILTIN_RM}, a Qwen2 sequence classifier; "
                        "the recipe's reward path runs, its scores are not the recipe's)"))
    return out


def whole_group_prompts(cfg: DictConfig, world: int, prompts: int) -> int:
    """The rehearsal's prompts per step: ``prompts``, or, for an injection that reads whole groups of
    one process, enough that each process holds them (never more than the recipe's prompts per step).

    Formula: P = min(P_recipe, max(P_0, W k)), k = ceil(1 / revisit) (revisit > 0), 1 (on-policy pairs), else P = P_0
    """
    inject = cfg.algo.get("inject")
    if inject is None or not hasattr(inject, "get"):
        return prompts
    revisit = float(inject.get("revisit") or 0.0)
    if revisit > 0.0:
        k = math.ceil(1.0 / revisit)
    elif inject.get("name") in ("group_pairs", "self_judged_pairs") or (inject.get("name") == "pairs" and float(inject.get("on_policy") or 0.0) > 0.0):
        k = 1
    else:
        return prompts
    return min(int(cfg.trainer.prompts_per_step), max(prompts, max(world, 1) * k))


def pair_swaps(cfg: DictConfig, prompts: int, world: int) -> list[tuple[str, Any, Any, str]]:
    """(key, recipe value, rehearsal value, why) for ``algo.inject.pairs`` scaled to ``prompts`` per step.

    Formula: pairs' = W max(1, round(pairs P' / (P W)))
    """
    inject = cfg.algo.get("inject")
    if inject is None or not hasattr(inject, "get") or inject.get("name") not in ("pairs", "group_pairs", "self_judged_pairs"):
        return []
    pairs, P, W = int(inject.get("pairs") or 0), int(cfg.trainer.prompts_per_step), max(world, 1)
    new = W * max(1, round(pairs * prompts / (P * W)))
    if pairs <= 0 or new == pairs:
        return []
    return [("algo.inject.pairs", pairs, new,
             f"scaled with the prompts ({pairs} for {P} -> {new} for {prompts}), a multiple of the {W} processes: the on/off-policy ratio kept")]
