"""The episode loop of a stateful environment (:mod:`mixrl.envs`), on token ids, generator-agnostic.

Each turn, every running episode generates one assistant turn (``generate``: HF generate or vLLM
through the trainer), its text is the action, ``env.step`` answers, and the observation is
appended as the chat template's user turn followed by the assistant header
(:func:`observation_suffix`). An episode ends when the environment says ``done``, after
``max_turns`` actions, when a turn does not end with an end-of-turn token (cut by the budget), or
when the observation and one more token no longer fit ``max_len`` (the completion budget).

Formula (one episode of T turns, rewards r_1..r_T)::

    completion = a_1 o_1 a_2 o_2 ... a_T          (a_t: the policy's tokens, o_t: observation tokens)
    env_mask   = 1 on a_t, 0 on o_t               (TRL's env_mask -> provenance environment)
    return     = sum_t r_t                        (the rollout's reward: reward function env_return)

An episode injection may write an assistant turn at a turn boundary (``patch``: UI-S1's patch
module, :mod:`mixrl.envs.patching`): after an action that ended the episode by diverging from an
expert trajectory, ``patch(i, env)`` returns the expert's action and what the environment shows
next; the row goes on ``a_t n e_t o_t a_{t+1} ...`` (n: a user turn saying a patch follows, and
o_t, the environment's; e_t the injected turn, ``injected`` 1 on its tokens, ``env_mask`` 0), and
``matched`` is False for the diverging turn.

The per-turn rewards are kept (``turn_rewards``, one list per episode, in the batch's rows) for
turn-level terms; the losses today see the return (a sequence-level reward, GRPO's group
baseline), with ``turn_id`` per token for the turn-level ratio (ST-PPO, ``algo.loss.name=turn_ppo``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from mixrl.envs.base import Environment, Step, safe_step

#: generate(prompt-and-history ids per running episode) -> (new ids per episode, their log-probs or None)
Generate = Callable[[list[list[int]]], tuple[list[list[int]], list[list[float]] | None]]


@dataclass
class Episode:
    """One rollout: its completion (turns and observations), the mask of the policy's tokens, the
    behaviour log-probs (0.0 on observations; None without), the turns' rewards and actions."""

    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    done: bool = False
    injected: list[int] = field(default_factory=list)  # 1 on the tokens of an assistant turn an episode injection wrote
    matched: list[bool] = field(default_factory=list)  # per policy turn: False where the action diverged (and was patched)

    @property
    def episode_return(self) -> float:
        return float(sum(self.rewards))


def observation_suffix(tokenizer, observation: str) -> list[int]:
    """The ids that follow an assistant turn's end-of-turn token when the environment answers
    ``observation``: the chat template's user turn and the assistant header (what
    ``apply_chat_template(..., add_generation_prompt=True)`` adds), found by rendering a dummy
    conversation with and without it and cutting at the last end-of-turn token (TRL's
    ``_get_tool_suffix_ids``, for a user message)."""
    dummy = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    prefix = tokenizer.apply_chat_template(dummy, tokenize=False)
    full = tokenizer.apply_chat_template(dummy + [{"role": "user", "content": observation}], tokenize=False,
                                         add_generation_prompt=True)
    eos = tokenizer.eos_token
    cut = prefix.rfind(eos) + len(eos) if eos and eos in prefix else len(prefix)
    if not full.startswith(prefix[:cut]):
        raise ValueError("the chat template does not render a user turn after an assistant turn as a suffix")
    return list(tokenizer(full[cut:], add_special_tokens=False)["input_ids"])


def run_episodes(
    envs: Sequence[Environment],
    prompt_ids: Sequence[Sequence[int]],
    generate: Generate,
    decode: Callable[[list[int]], Any],
    suffix: Callable[[str], list[int]],
    *,
    eos_ids: Sequence[int],
    max_len: int,
    max_turns: int,
    patch: Callable[[int, Environment], tuple[list[int], list[int], Step] | None] | None = None,
) -> list[Episode]:
    """Run one episode per ``envs[i]`` (already reset) from ``prompt_ids[i]``; see the module.
    ``patch(i, env)``: after an action that ended episode i, the ids of the note turn (user turn
    and assistant header), of the injected turn (closed by its end-of-turn id) and the Step the
    environment answers it with; None: the episode ends."""
    episodes = [Episode() for _ in envs]
    history = [list(p) for p in prompt_ids]
    running = list(range(len(envs)))
    for turn in range(max_turns):
        if not running:
            break
        new_ids, new_lps = generate([history[i] for i in running])
        still = []
        for k, i in enumerate(running):
            ep = episodes[i]
            ids = list(new_ids[k])[: max(0, max_len - len(ep.completion_ids))]
            _extend(ep, history[i], ids, None if new_lps is None else list(new_lps[k])[: len(ids)], trained=True)
            action = decode(ids)
            step = safe_step(envs[i], action)
            ep.actions.append(action if isinstance(action, str) else str(action))
            ep.rewards.append(step.reward)
            ep.done = step.done
            ep.matched.append(True)
            cut = not ids or ids[-1] not in eos_ids
            if cut or turn + 1 == max_turns:
                continue
            if step.done and patch is not None:
                step = _patched(ep, history[i], patch(i, envs[i]), max_len)
            if step is None or step.done:
                continue
            obs = suffix(step.observation)
            if len(ep.completion_ids) + len(obs) + 1 > max_len:  # no room for the observation and a reply
                continue
            ep.observations.append(step.observation)
            _extend(ep, history[i], obs, [0.0] * len(obs), trained=False)
            still.append(i)
        running = still
    return episodes


def _patched(ep: Episode, history: list[int], patched, max_len: int) -> Step | None:
    """Write an injection's turn after the last action (None: no patch, or no room for it, an
    observation and one more token): the note, then the injected turn; its Step."""
    if patched is None:
        return None
    note, turn, step = patched
    if len(ep.completion_ids) + len(note) + len(turn) + 2 > max_len:
        return None
    ep.matched[-1] = False
    _extend(ep, history, list(note), [0.0] * len(note), trained=False)
    _extend(ep, history, list(turn), [0.0] * len(turn), trained=False, injected=True)
    ep.rewards[-1] += float(step.reward)  # 0 for an expert's patch: the turn's reward stays the policy's action's
    ep.done = step.done
    return step


def _extend(ep: Episode, history: list[int], ids: list[int], lps: list[float] | None, *, trained: bool,
            injected: bool = False) -> None:
    ep.completion_ids += ids
    ep.env_mask += [1 if trained else 0] * len(ids)
    ep.injected += [1 if injected else 0] * len(ids)
    history += ids
    if ep.logprobs is not None:
        ep.logprobs = None if lps is None else ep.logprobs + lps  # a generator without log-probs: none for the episode
