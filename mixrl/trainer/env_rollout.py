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
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from mixrl.envs import resolve_env, safe_reset
from mixrl.envs.episodes import observation_suffix, run_episodes


def is_episodic(cfg: DictConfig) -> bool:
    """Whether ``env`` names a stateful environment (not ``single`` nor ``tools``)."""
    return cfg.get("env") is not None and cfg.env.name not in ("single", "tools")


def env_return(prompts=None, completions=None, env_return=None, **kwargs) -> list[float]:
    """The rollout's reward: its episode's return (the sum of the turns' rewards)."""
    return [float(x) for x in env_return]


def env_trainer_kwargs(cfg: DictConfig, args, reward_funcs: list, tools: list) -> dict[str, Any]:
    """The trainer's ``reward_funcs`` and ``tools`` or ``rollout_func`` for ``cfg.env``; an
    episodic environment's return replaces the task's reward in training (``args.reward_weights``
    reset to one weight); the held-out evaluation keeps the task's reward."""
    if not is_episodic(cfg):
        return {"reward_funcs": reward_funcs, **({"tools": tools} if tools else {})}
    args.reward_weights = [1.0]
    return {"reward_funcs": [env_return], "rollout_func": episode_rollouts(cfg)}


def episode_rollouts(cfg: DictConfig):
    """TRL's ``rollout_func(prompts, trainer)``: one episode per prompt (the prompts arrive
    repeated per generation), each with a fresh environment reset with its row."""
    factory = resolve_env(str(cfg.env.name))
    max_turns = int(cfg.env.max_turns or 1)
    suffixes: dict[str, list[int]] = {}

    def rollout(prompts: list, trainer) -> dict[str, Any]:
        from trl import GRPOTrainer  # deferred: trl is heavy; only episodic runs reach here

        tok = trainer.processing_class
        rows = trainer._mixrl_batch_inputs or [{"prompt": p} for p in prompts]
        envs, prompt_ids = [], []
        for prompt, row in zip(prompts, rows):
            env = factory()
            first = safe_reset(env, dict(row))
            if first:  # appended to the last user message (TRL's environment_factory convention)
                prompt = prompt[:-1] + [{**prompt[-1], "content": prompt[-1]["content"] + first}]
            envs.append(env)
            prompt_ids.append(list(tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                                           return_dict=False, **trainer.chat_template_kwargs)))

        def generate(histories):
            return GRPOTrainer._generate_single_turn(trainer, histories, None, {}, 1)

        def suffix(text: str) -> list[int]:
            if text not in suffixes:
                suffixes[text] = observation_suffix(tok, text)
            return suffixes[text]

        episodes = run_episodes(envs, prompt_ids, generate, lambda ids: tok.decode(ids, skip_special_tokens=True),
                                suffix, eos_ids=list(trainer.eos_token_ids), max_len=int(trainer.max_completion_length),
                                max_turns=max_turns)
        lps = None if any(e.logprobs is None for e in episodes) else [e.logprobs for e in episodes]
        return {"prompt_ids": prompt_ids, "completion_ids": [e.completion_ids for e in episodes], "logprobs": lps,
                "env_mask": [e.env_mask for e in episodes], "env_return": [e.episode_return for e in episodes],
                "turn_rewards": [list(e.rewards) for e in episodes]}

    return rollout
