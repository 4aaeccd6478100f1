"""Held-out evaluation that acts as the training rollout does: the tool loop (``env=tools``) and a
stateful environment's episodes (``env=<environment>``, e.g. ``arith_retry``).

:func:`acting_generator` returns the generator :func:`mixrl.evaluation.accuracy.evaluate_accuracy`
calls instead of its single completion (None for ``env=single``); periodic, held-out and
saved-model evaluation pick it from ``cfg.env``. Both loops run on token ids, batched: the rows
still acting generate together, a row that finished at an earlier turn leaves the batch
(:func:`mixrl.evaluation.generate.generate_ids`, the batches of :func:`mixrl.evaluation.generate.batches`).

``env=tools`` (TRL 1.16's ``GRPOTrainer._generate`` + ``_tool_call_loop``, re-done on HF generate)::

    ids_0   = chat_template(prompt, tools, add_generation_prompt)      (the prompt shows the tools)
    a_1     = generate(ids_0)                       parsed with trl's parse_response (tool calls)
    while a_t has tool calls and t <= env.max_tool_calls:
        m_t = [{"role": "tool", "name": f, "content": str(f(**args))} per call]   (a failure: {"error": ...})
        s_t = chat_template(dummy + m_t) - chat_template(dummy)  (TRL's _get_tool_suffix_ids)
        stop if |a_1 s_1 ... a_t s_t| > max_completion_length or the whole >= the model's positions
        a_{t+1} = generate(ids_0 a_1 s_1 ... a_t s_t), cut to the completion budget

The row is scored on the message list ``[a_1, m_1, ..., a_T]`` (assistant and tool messages), what
TRL hands the reward functions in training: mixrl's ``exact``/``math`` read the assistant messages'
contents joined (:func:`mixrl.rewards.extract.completion_text`), so the answer after the tool's
result is scored, not the unexecuted call.

``env=<environment>``: one greedy (or sampled) episode per row with
:func:`mixrl.envs.episodes.run_episodes`, ``env.max_turns`` actions at most, the completion budget
``max_completion_length``. The row is scored with the task's reward on ``[a_1, o_1, ..., a_T]``
(assistant actions and the environment's user turns): an episode ends at the first correct answer,
so the last action is correct exactly when the episode was solved within its turns; accuracy is
the fraction of episodes solved (``arith_retry``: the answer right at any of ``env.max_turns`` tries).

Each completion is a :class:`Acted` (a message list, what the reward reads) whose ``text`` is the
decoded completion with its tool or observation turns, as ``samples.jsonl`` shows training rows.
Tool-use RL: "ToolRL: Reward is All Tool Learning Needs" (arXiv:2504.13958); multi-turn episodes:
"ArCHer" (arXiv:2402.19446).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mixrl.envs import resolve_env, safe_reset
from mixrl.envs.episodes import observation_suffix, run_episodes
from mixrl.evaluation.generate import batches, eos_ids, eval_mode, generate_ids
from mixrl.tools.builtin import resolve_tools


class Acted(list):
    """One evaluated rollout: its messages (a list, what the reward function reads) and ``text``
    (the decoded completion, tool/observation turns included: what ``samples.jsonl`` shows)."""

    def __init__(self, messages: Sequence[dict], text: str):
        super().__init__(messages)
        self.text = text


def acting_generator(env: Any) -> Callable | None:
    """The evaluation generator for the config's ``env`` group (None: ``single`` or no env)."""
    name = None if env is None else str(env.get("name") or "single")
    if name in (None, "single"):
        return None
    if name == "tools":
        tools = resolve_tools(list(env.get("tools") or []))
        calls = env.get("max_tool_calls")
        return lambda *a, **k: tool_completions(*a, tools=tools, max_tool_calls=None if calls is None else int(calls), **k)
    factory = resolve_env(name)
    turns = int(env.get("max_turns") or 1)
    return lambda *a, **k: episode_completions(*a, factory=factory, max_turns=turns, **k)


# ----------------------------------------------------------------------------- generation on ids
def _render_ids(tokenizer, prompt: Any, tools: list | None = None) -> list[int]:
    if isinstance(prompt, str):
        return list(tokenizer(prompt)["input_ids"])
    return list(tokenizer.apply_chat_template(prompt, tools=tools or None, add_generation_prompt=True, tokenize=True,
                                              return_dict=False))


def _batches(model, tokenizer, rows: Sequence[dict], run_batch, *, batch_size: int, num_return_sequences: int,
             progress, stop) -> list[list[Acted]]:
    """``run_batch(rows)`` over batches of ``batch_size`` rows (each repeated ``num_return_sequences``
    times), in eval mode, asking ``stop`` between batches (:func:`mixrl.evaluation.generate.batches`)."""
    n = max(int(num_return_sequences), 1)
    out: list[list[Acted]] = []
    with eval_mode(model):
        for _, chunk in batches(rows, batch_size, stop=stop, progress=progress):
            flat = run_batch([r for r in chunk for _ in range(n)])
            out.extend(flat[i * n : (i + 1) * n] for i in range(len(chunk)))
    return out


# ----------------------------------------------------------------------------- env=tools
def _call(tools: dict[str, Callable], call: dict) -> tuple[str, Any]:
    """Run one parsed tool call as TRL's loop does; any failure is the tool message's content."""
    if call.get("type") != "function":
        return call.get("name", "unknown"), {"error": f"Unsupported tool call type: {call.get('type')}"}
    function = call["function"]
    name = function.get("name")
    try:
        if name not in tools:
            raise ValueError(f"Tool {name} not found.")
        return name, tools[name](**function.get("arguments", {}))
    except Exception as e:  # noqa: BLE001 - a tool's failure is what the model reads next (TRL: {"error": ...})
        return name, {"error": str(e)}


def tool_suffix_ids(tokenizer, tool_messages: list[dict]) -> list[int]:
    """The ids that follow an assistant turn's end for these tool messages (TRL 1.16's
    ``GRPOTrainer._get_tool_suffix_ids``: a dummy call rendered with and without them)."""
    dummy = [{"role": "user", "content": "dummy"},
             {"role": "assistant", "content": "",
              "tool_calls": [{"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}]}]
    prefix = list(tokenizer.apply_chat_template(dummy, add_generation_prompt=False, tokenize=True, return_dict=False))
    full = list(tokenizer.apply_chat_template(dummy + tool_messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=False))
    ends = [i for i, t in enumerate(prefix) if t == tokenizer.eos_token_id]
    if ends:
        prefix = prefix[: ends[-1] + 1]
    if full[: len(prefix)] != prefix:
        raise ValueError("the chat template does not render tool messages as a suffix of the assistant's call")
    return full[len(prefix):]


def tool_completions(model, tokenizer, rows: Sequence[dict], *, tools: list[Callable], max_tool_calls: int | None,
                     max_new_tokens: int, batch_size: int = 128, do_sample: bool = False, temperature: float = 1.0,
                     num_return_sequences: int = 1, progress=None, stop=None) -> list[list[Acted]]:
    """Completions of ``rows`` with the tool loop (see the module); ``num_return_sequences`` per row."""
    from trl.chat_template_utils import parse_response  # deferred: trl is heavy; only env=tools evaluation reads calls

    by_name = {f.__name__: f for f in tools}
    rounds = max_tool_calls if max_tool_calls is not None else 1 << 30
    positions = int(getattr(getattr(model, "config", None), "max_position_embeddings", 0) or 1 << 30)

    def parse(ids, prefix):
        return parse_response(tokenizer, ids, prefix=prefix, tools=tools) if ids else {}

    def run_batch(batch: list[dict]) -> list[Acted]:
        prompt_ids = [_render_ids(tokenizer, r["prompt"], tools) for r in batch]
        comp = generate_ids(model, tokenizer, prompt_ids, max_new_tokens=max_new_tokens, do_sample=do_sample,
                            temperature=temperature)
        messages = [[parse(c, p)] if c else [] for c, p in zip(comp, prompt_ids)]
        acting = [i for i, m in enumerate(messages) if m and m[0].get("tool_calls")]
        turn = 0
        while acting and turn < rounds:
            histories, keep = [], []
            for i in acting:
                results = [_call(by_name, c) for c in messages[i][-1]["tool_calls"]]
                tool_msgs = [{"role": "tool", "name": n, "content": r if isinstance(r, list) else str(r)} for n, r in results]
                history = prompt_ids[i] + comp[i] + tool_suffix_ids(tokenizer, tool_msgs)
                if len(history) - len(prompt_ids[i]) > max_new_tokens or len(history) >= positions:
                    continue  # no room for the result: the row ends with its call (TRL rolls the result back)
                messages[i].extend(tool_msgs)
                histories.append(history)
                keep.append(i)
            post = generate_ids(model, tokenizer, histories, do_sample=do_sample, temperature=temperature,
                                max_new_tokens=[max_new_tokens - (len(h) - len(prompt_ids[i])) for h, i in zip(histories, keep)])
            acting = []
            for i, h, ids in zip(keep, histories, post):
                comp[i] = h[len(prompt_ids[i]):] + ids
                reply = parse(ids, h)
                if reply:
                    messages[i].append(reply)
                    if reply.get("tool_calls"):
                        acting.append(i)
            turn += 1
        return [Acted(m, tokenizer.decode(c, skip_special_tokens=True)) for m, c in zip(messages, comp)]

    return _batches(model, tokenizer, list(rows), run_batch, batch_size=batch_size,
                    num_return_sequences=num_return_sequences, progress=progress, stop=stop)


# ----------------------------------------------------------------------------- stateful environments
def episode_completions(model, tokenizer, rows: Sequence[dict], *, factory: Callable, max_turns: int,
                        max_new_tokens: int, batch_size: int = 128, do_sample: bool = False, temperature: float = 1.0,
                        num_return_sequences: int = 1, progress=None, stop=None) -> list[list[Acted]]:
    """One episode per row (``num_return_sequences`` per row), as training runs them
    (:func:`mixrl.trainer.env_rollout.episode_rollouts`) with HF generate; see the module."""
    suffixes: dict[str, list[int]] = {}

    def suffix(text: str) -> list[int]:
        if text not in suffixes:
            suffixes[text] = observation_suffix(tokenizer, text)
        return suffixes[text]

    def run_batch(batch: list[dict]) -> list[Acted]:
        envs, prompt_ids = [], []
        for row in batch:
            env, prompt = factory(), row["prompt"]
            first = safe_reset(env, dict(row))
            if first:  # appended to the last user message, as in training
                prompt = prompt + first if isinstance(prompt, str) else \
                    prompt[:-1] + [{**prompt[-1], "content": prompt[-1]["content"] + first}]
            envs.append(env)
            prompt_ids.append(_render_ids(tokenizer, prompt))

        def generate(histories):
            return generate_ids(model, tokenizer, histories, max_new_tokens=max_new_tokens, do_sample=do_sample,
                                temperature=temperature), None

        episodes = run_episodes(envs, prompt_ids, generate, lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                                suffix, eos_ids=eos_ids(model, tokenizer), max_len=max_new_tokens, max_turns=max_turns)
        out = []
        for ep in episodes:
            msgs: list[dict] = []
            for t, action in enumerate(ep.actions):
                msgs.append({"role": "assistant", "content": action})
                if t < len(ep.observations):
                    msgs.append({"role": "user", "content": ep.observations[t]})
            out.append(Acted(msgs, tokenizer.decode(ep.completion_ids, skip_special_tokens=True)))
        return out

    return _batches(model, tokenizer, list(rows), run_batch, batch_size=batch_size,
                    num_return_sequences=num_return_sequences, progress=progress, stop=stop)
