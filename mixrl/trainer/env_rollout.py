"""A stateful environment's episodes as TRL's rollouts (``env.name`` a registered
:mod:`mixrl.envs` environment, e.g. ``env=arith_retry``).

Built on TRL 1.16's ``rollout_func``, not its ``environment_factory``: the factory exposes an
environment's methods as tools (the policy acts only through tool calls), appends ``reset``'s text
to the prompt and scores a rollout once with ``get_reward``; it has no text actions, no
observation after a plain assistant turn, no per-turn reward and no ``done``. ``rollout_func``
returns the rows' ids with ``env_mask`` (0 on tokens the policy did not write), which TRL reads
as its ``tool_mask`` and mixrl as provenance ``environment`` and ``turn_id``
(:func:`mixrl.trainer.parts.batch_fields.provenance_fields`); its extra keys (``env_return``,
``turn_rewards``) reach the reward functions with the rows.

The episode function returns an :class:`EpisodeBatch`: TRL's dict, the rows' provenance and the
episode metrics; the trainer (``spec.episodes``) wraps it as TRL's ``rollout_func`` and keeps the
provenance and logs the metrics itself (``MixrlGRPOTrainer._keep_episodes``): nothing here writes
the trainer.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from omegaconf import DictConfig

from mixrl.core import provenance as prov
from mixrl.envs import resolve_env, safe_reset
from mixrl.envs.episodes import observation_suffix, run_episodes
from mixrl.envs.patching import Patcher, episode_injection, episode_sources
from mixrl.sources.base import Rollouts
from mixrl.sources.reachable_cache import ReachableCache, assimilate


def is_episodic(cfg: DictConfig) -> bool:
    """Whether ``env`` names a stateful environment (not ``single`` nor ``tools``)."""
    return cfg.get("env") is not None and cfg.env.name not in ("single", "tools")


def env_return(prompts=None, completions=None, env_return=None, **kwargs) -> list[float]:
    """The rollout's reward: its episode's return (the sum of the turns' rewards)."""
    return [float(x) for x in env_return]


class EpisodeBatch(NamedTuple):
    """What the episode function hands back for one generation batch."""

    trl: dict[str, Any]  # TRL's rollout dict: prompt_ids, completion_ids, logprobs, env_mask and the reward functions' extra keys
    rollouts: Rollouts  # the rows' provenance (per-row and per-token sources, guided rows)
    metrics: dict[str, float]  # episode/* metrics (training only)


def env_rewards(cfg: DictConfig, reward_funcs: list, reward_weights: list | None) -> tuple[list, list | None]:
    """The trainer's reward functions and weights for ``cfg.env``: the task's, or an episodic
    environment's return in their place in training (one function, weight 1; its episodes:
    :func:`env_episodes`); the held-out evaluation keeps the task's reward."""
    if not is_episodic(cfg):
        return reward_funcs, reward_weights
    return [env_return], [1.0]


def env_episodes(cfg: DictConfig):
    """The episode function of an episodic ``env`` (:func:`episode_rollouts`), else None."""
    return episode_rollouts(cfg) if is_episodic(cfg) else None


def episode_rollouts(cfg: DictConfig):
    """``rollout(prompts, trainer, rows=None) -> EpisodeBatch``, TRL's ``rollout_func`` once the
    trainer wraps it: one episode per prompt (the prompts arrive repeated per generation), each with
    a fresh environment reset with its row (``rows``: the batch's rows, default the prompts alone);
    in training, ``algo.episode`` injects turns (``patch``) or cached reachable episodes
    (``reachable``). Every row's provenance and the episode metrics come back with TRL's dict."""
    factory = resolve_env(str(cfg.env.name))
    max_turns = int(cfg.env.max_turns or 1)
    episode = episode_injection(cfg)
    cache = ReachableCache() if episode["name"] == "reachable" else None
    suffixes: dict[str, list[int]] = {}

    def rollout(prompts: list, trainer, rows: list | None = None) -> EpisodeBatch:
        from trl import GRPOTrainer  # deferred: trl is heavy; only episodic runs reach here

        tok = trainer.processing_class
        rows = rows or [{"prompt": p} for p in prompts]
        training = bool(trainer.model.training)

        def start(indices, plan=False):
            envs, ids = [], []
            for i in indices:
                env, prompt = factory(), prompts[i]
                first = safe_reset(env, dict(rows[i]))
                first = ((first or "") + env.plan()) if plan else first
                if first:  # appended to the last user message (TRL's environment_factory convention)
                    prompt = prompt[:-1] + [{**prompt[-1], "content": prompt[-1]["content"] + first}]
                envs.append(env)
                ids.append(list(tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                                        return_dict=False, **trainer.chat_template_kwargs)))
            return envs, ids

        def generate(histories):
            return GRPOTrainer._generate_single_turn(trainer, histories, None, {}, 1)

        def suffix(text: str) -> list[int]:
            if text not in suffixes:
                suffixes[text] = observation_suffix(tok, text)
            return suffixes[text]

        def run(envs, ids, patch=None):
            return run_episodes(envs, ids, generate, lambda x: tok.decode(x, skip_special_tokens=True), suffix,
                                eos_ids=list(trainer.eos_token_ids), max_len=int(trainer.max_completion_length),
                                max_turns=max_turns, patch=patch)

        envs, prompt_ids = start(range(len(prompts)))
        patcher = None
        if training and episode["name"] == "patch":
            patcher = Patcher(lambda text: tok(text, add_special_tokens=False)["input_ids"], suffix,
                              int(trainer.eos_token_ids[0]), int(episode.get("threshold", 2)))
        episodes = run(envs, prompt_ids, patcher)
        injected = [False] * len(episodes)
        metrics = {}
        if training and cache is not None:
            injected = _assimilate(cache, episode, prompts, envs, episodes, int(trainer.num_generations),
                                   lambda idx: start(idx, plan=True), run)
            metrics["episode/cached_tasks"] = float(len(cache.entries))
            metrics["episode/injected_rows"] = float(sum(injected))
        if training and patcher is not None:
            metrics["episode/patches"] = float(sum(patcher.used.values()))
        lps = None if any(e.logprobs is None for e in episodes) else [e.logprobs for e in episodes]
        trl = {"prompt_ids": prompt_ids, "completion_ids": [e.completion_ids for e in episodes], "logprobs": lps,
               "env_mask": [e.env_mask for e in episodes], "env_return": [e.episode_return for e in episodes],
               "turn_rewards": [list(e.rewards) for e in episodes],
               "turn_matched": [[bool(m) for m in e.matched] for e in episodes]}
        return EpisodeBatch(trl, _rollouts([e.completion_ids for e in episodes], episodes, injected), metrics)

    return rollout


def _assimilate(cache, episode: dict, prompts: list, envs: list, episodes: list, group_size: int, start, run) -> list[bool]:
    """BEPA over this batch (:func:`mixrl.sources.reachable_cache.assimilate`): solved episodes
    refresh the cache, LEVEL-1 self-rolls the plan-conditioned episodes of failed tasks not cached
    (``algo.episode.attempts`` tries each), cached episodes fill totally failed groups."""
    keys = [json.dumps(p, sort_keys=True, default=str) for p in prompts]
    attempts = int(episode.get("attempts", 2))

    def self_roll(indices: list[int]):
        best = {i: (None, False) for i in indices}
        todo = list(indices)
        for _ in range(attempts):
            if not todo:
                break
            guided_envs, guided_ids = start(todo)
            for i, env, ep in zip(todo, guided_envs, run(guided_envs, guided_ids)):
                best[i] = (ep, bool(getattr(env, "solved", False)))
            todo = [i for i in todo if not best[i][1]]
        return [best[i] for i in indices]

    solved = [bool(getattr(env, "solved", False)) for env in envs]
    return assimilate(keys, episodes, solved, group_size, cache, self_roll)


def _rollouts(completions: list, episodes: list, injected: list[bool]) -> Rollouts:
    """The rows' provenance for the trainer: the policy's turns ``on_policy`` (``reachable`` in an
    injected row), an injected turn ``patched``, observations ``environment``."""
    sources = [episode_sources(e.env_mask, e.injected, prov.REACHABLE if inj else prov.ON_POLICY)
               for e, inj in zip(episodes, injected)]
    return Rollouts(list(completions), None, [prov.REACHABLE if inj else prov.ON_POLICY for inj in injected],
                    token_source=sources, guided=[2 if inj else 0 for inj in injected])
