"""A run's reward functions: ``reward`` and ``reward.extra`` built from the reward registry with
their weights and the per-call time limit, and bound to the policy's model path and tokenizer
(a judge served by the policy's own model, process rewards that need token boundaries)."""

from __future__ import annotations

from omegaconf import DictConfig

from mixrl.config.builders import plain as _plain
from mixrl.rewards import build_reward
from mixrl.rewards.components import bind_device


def build_reward_funcs(cfg: DictConfig) -> tuple[list, list[float]]:
    specs = [{"name": cfg.reward.name, "weight": cfg.reward.weight, "params": _plain(cfg.reward.params) or {}}]
    specs += [dict(_plain(x)) for x in cfg.reward.extra]
    funcs, weights = [], []
    for s in specs:
        fn = build_reward(s["name"], **(s.get("params") or {}))
        fn.timeout_s = cfg.reward.get("timeout_s")  # reward.timeout_s: the wall-clock limit of each call
        bind_device(fn, cfg.hardware.device)  # a reward model or judge of its own loads on the run's device
        funcs.append(fn)
        weights.append(float(s.get("weight", 1.0)))
    return funcs, weights


def _bind_rewards(reward_funcs: list, model_path: str, tokenizer) -> None:
    """A judge served by the policy's own model (path=policy) gets its path; process rewards get the token boundaries."""
    for fn in reward_funcs:
        inner = getattr(fn, "fn", fn)
        if hasattr(inner, "bind_policy"):
            inner.bind_policy(model_path)
        if hasattr(inner, "bind_tokenizer"):
            inner.bind_tokenizer(tokenizer)
