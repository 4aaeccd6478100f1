"""Two rehearsal rules beside the core table of :data:`mixrl.config.rehearsal.RULES`:

* **reward models** (``reward=model``, or one in ``reward.extra``): a hub sequence classifier -> the
  built-in one (``builtin:tiny-rm``, a Qwen2 classifier trained here on the arithmetic task's right and
  wrong completions; ``python -m mixrl.models.tiny_rm``), so that the recipe's reward path
  (re-tokenisation, batching, transform, normalisation, gate) runs without a download. Its scores mean
  nothing on the recipe's data: the rehearsal checks that the pieces run together, not what they learn.
* **revisited prompts** (an injection with ``revisit``, e.g. SOUP's historical prefixes): the share of
  each process's *whole* groups that revisit buffered prompts is ``round(revisit x groups)``; with the
  rehearsal's one prompt split over two processes no process holds a whole group, so nothing was ever
  revisited and the historical prefix never ran. The rehearsal keeps ``world x ceil(1 / revisit)``
  prompts per step instead, so that every process revisits at least one group from the second step on.
"""

from __future__ import annotations

import math
from typing import Any

from omegaconf import DictConfig

__all__ = ["BUILTIN_RM", "revisit_prompts", "reward_model_swaps"]

BUILTIN_RM = "builtin:tiny-rm"


def _is_hub_id(path: Any) -> bool:
    from mixrl.config.rehearsal import is_hub_id  # deferred: rehearsal imports this module (same layer)

    return is_hub_id(path)


def reward_model_swaps(cfg: DictConfig) -> list[tuple[str, Any, Any, str]]:
    """(key, recipe value, rehearsal value, why) for every reward model of ``cfg`` read from the hub."""
    out = []
    specs = [("reward", cfg.reward)] + [(f"reward.extra.{i}", spec) for i, spec in enumerate(cfg.reward.get("extra") or [])]
    for key, spec in specs:
        params = spec.get("params") or {}
        if str(spec.get("name")) == "model" and _is_hub_id(params.get("path")):
            out.append((f"{key}.params.path", str(params.path), BUILTIN_RM,
                        f"no download: the built-in reward model ({BUILTIN_RM}, a Qwen2 sequence classifier; "
                        "the recipe's reward path runs, its scores are not the recipe's)"))
    return out


def revisit_prompts(cfg: DictConfig, world: int, prompts: int) -> int:
    """The rehearsal's prompts per step: ``prompts``, or, for an injection that revisits a share of each
    process's whole groups, ``world x ceil(1 / revisit)`` (at least one revisited group per process),
    never more than the recipe's own prompts per step.

    Formula: P = min(P_recipe, max(P_0, W ceil(1 / revisit)))  (revisit > 0), else P_0
    """
    inject = cfg.algo.get("inject")
    revisit = float(inject.get("revisit") or 0.0) if inject is not None and hasattr(inject, "get") else 0.0
    if revisit <= 0.0:
        return prompts
    return min(int(cfg.trainer.prompts_per_step), max(prompts, max(world, 1) * math.ceil(1.0 / revisit)))
