"""`mixrl plan`'s count of a multi-turn rollout's tokens (``env=tools`` and the stateful
environments of :mod:`mixrl.envs`), from the config alone (no tokenizer is loaded).

The completion budget ``C = trainer.max_completion_length`` covers every turn of a rollout (TRL's
tool loop and :func:`mixrl.envs.episodes.run_episodes` both cut at it), so a rollout holds at most
``P + C`` tokens (``P`` prompt tokens), as for a single turn: the memory and compute of the plan
already count them. What changes is who wrote them. Formula::

    policy turns     T = max_tool_calls + 1 (tools)  |  env.max_turns (an environment)
    environment turns  K = T - 1                      (a tool result or an observation between two policy turns)
    environment tokens E = min(K o, C)                (o: tokens of one environment turn, estimated below)
    policy tokens      at most C - E trained          (at least, when every turn is taken)

``o`` is the environment's ``OBSERVATION_TOKENS`` (measured on the built-in model) or, for tools,
:data:`TOOL_TURN_TOKENS`; on another tokenizer it is an estimate. ``max_tool_calls: null``
(until the budget): K is unbounded and E up to C.
"""

from __future__ import annotations

from typing import Any

from mixrl.envs import resolve_env

#: tokens of one calculator result turn on the built-in tool model (``\n<|im_start|>user\n<tool_response>77300</tool_response><|im_end|>\n<|im_start|>assistant\n``)
TOOL_TURN_TOKENS = 21


def turn_counts(env: Any, max_completion_length: int, prompt_tokens: int) -> dict | None:
    """The counts of the module's formula for ``env`` (the config's ``env`` group); None for ``single``."""
    if env is None or env.name == "single":
        return None
    C = int(max_completion_length)
    if env.name == "tools":
        calls = env.get("max_tool_calls")
        turns = None if calls is None else int(calls) + 1
        per, what = TOOL_TURN_TOKENS, "tool result"
    else:
        turns = int(env.get("max_turns") or 1)
        per, what = int(getattr(resolve_env(str(env.name)), "OBSERVATION_TOKENS", 0)), "observation"
    env_turns = None if turns is None else turns - 1
    env_tokens = C if env_turns is None else min(env_turns * per, C)
    return {"policy_turns": turns, "env_turns": env_turns, "tokens_per_env_turn": per, "what": what,
            "episode_tokens": int(prompt_tokens) + C, "env_tokens": env_tokens, "policy_tokens_min": C - env_tokens,
            "completion": C, "prompt": int(prompt_tokens)}


def turn_lines(cfg: Any, prompt_tokens: int) -> list[str]:
    """The plan's ``turns`` section (empty for ``env=single``)."""
    c = turn_counts(cfg.get("env"), int(cfg.trainer.max_completion_length), prompt_tokens)
    if c is None:
        return []
    turns = "until the completion budget" if c["policy_turns"] is None else (
        f"up to {c['policy_turns']} policy turns and {c['env_turns']} {c['what']} turns")
    return ["turns",
            f"  env={cfg.env.name}: {turns} per rollout (~{c['tokens_per_env_turn']} tokens per {c['what']} turn); a rollout holds at most "
            f"{c['prompt']} prompt + {c['completion']} completion = {c['episode_tokens']} tokens, of which up to {c['env_tokens']} are "
            f"{c['what']} tokens: not trained (provenance environment), but in memory and compute (counted above); "
            f"the policy's turns get at least {c['policy_tokens_min']}", ""]
