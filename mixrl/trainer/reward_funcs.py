"""A run's reward functions: ``reward`` and ``reward.extra`` built from the reward registry with
their weights, each given the run's :class:`~mixrl.rewards.protocol.RewardContext` at
construction: the device (a reward model or judge of its own loads there), the policy's model path
(a judge served by the policy's own model), its tokenizer (a process reward's token boundaries) and
the per-call time limit (``reward.timeout_s``)."""

from __future__ import annotations

from omegaconf import DictConfig

from mixrl.config.builders import plain as _plain
from mixrl.rewards import build_reward
from mixrl.rewards.protocol import RewardContext


def build_reward_funcs(cfg: DictConfig, *, model_path: str | None = None, tokenizer=None) -> tuple[list, list[float]]:
    """The rewards and their weights; ``model_path`` and ``tokenizer``: the policy's (None: not
    known, e.g. ``mixrl eval`` scoring with the verifier alone)."""
    context = RewardContext(device=str(cfg.hardware.device), policy_path=None if model_path is None else str(model_path),
                            tokenizer=tokenizer, timeout_s=cfg.reward.get("timeout_s"))
    specs = [{"name": cfg.reward.name, "weight": cfg.reward.weight, "params": _plain(cfg.reward.params) or {}}]
    specs += [dict(_plain(x)) for x in cfg.reward.extra]
    funcs, weights = [], []
    for s in specs:
        funcs.append(build_reward(s["name"], context=context, **(s.get("params") or {})))
        weights.append(float(s.get("weight", 1.0)))
    return funcs, weights
