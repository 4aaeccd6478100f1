"""The tool-calling variant of the BPE chat model (``builtin:tiny-bpe-tools``, ``model=tiny-bpe-tools``).

:mod:`mixrl.models.tiny_bpe`'s template has no tool branches, so TRL's tool loop refuses it. This
variant keeps its tokenizer pipeline and architecture and adds what TRL's loop needs:

* :data:`TOOL_CHAT_TEMPLATE`: Qwen2.5's tool-call format (an assistant turn writes
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; a ``tool`` message is rendered as a
  user turn ``<tool_response>...</tool_response>``), with the tools listed by name in the system
  message (the 128-token context has no room for JSON schemas). It is prefix-preserving
  (``trl.chat_template_utils.is_chat_template_prefix_preserving``) and passes
  ``supports_tool_calling`` (tested);
* :data:`RESPONSE_TEMPLATE`: transformers' response parser for it (Qwen3's, without thinking), set
  on the tokenizer so ``parse_response`` reads the tool calls back;
* merges learned on the ``arith`` corpus plus the tool task's expert trajectories
  (:mod:`mixrl.tasks.arith_tools`), so ``<tool_call>``, the JSON keys and ``calculator`` are few tokens.

Warm start (:data:`WARM_START`): chat-formatted ``arith_tools`` problems, a ``tool_fraction`` of them
with the expert's tool trajectory (one example per assistant turn: the call, then the answer after
the result) and the rest answered in the head (``#### <the sum>``), so the model starts out calling
the calculator sometimes; RL with the tool decides how often. It stops once its tool-call accuracy
(:func:`call_accuracy`: given that it calls the calculator, it copies the prompt's expression into
the call exactly) reaches ``target_call_accuracy`` on held-out problems, checked every
``check_every`` steps. Digits are single tokens (Qwen's pre-tokenizer splits them), so copying is a
fixed-offset attention pattern; what the earlier 200-step, stop-free warm start lacked was training
on enough calls (measured: 100 steps of calls only copy 98% of 64 held-out expressions exactly, 50
steps 9%).

Its weights ship in the package (:mod:`mixrl.models.shipped`): a first ``env=tools`` run copies them
into the cache instead of training (164 s on 2 quiet cores, 1,464 s on a loaded machine).
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
from pathlib import Path
from typing import Any

from mixrl.models import shipped, supervised, tiny_arch, tiny_bpe, tiny_spec
from mixrl.tasks import arith_tools

BUILTIN = "builtin:tiny-bpe-tools"
VERSION = "3"  # 3: stops at a target tool-call accuracy, 40% tool examples
_META_FILE = "mixrl_tiny_bpe_tools.json"
VOCAB_SIZE = 480
SYSTEM_PROMPT = arith_tools.SYSTEM_PROMPT

TOOL_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{%- set sys = messages[0]['content'] %}"
    "{%- else %}{%- set sys = '" + SYSTEM_PROMPT + "' %}{%- endif %}"
    "{{- '<|im_start|>system\\n' + sys }}"
    "{%- if tools %}{{- '\\nTools:' }}{%- for t in tools %}"
    "{{- ' ' + (t['function']['name'] if t['function'] is defined else t['name']) }}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' or (message['role'] == 'assistant' and not message.get('tool_calls')) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + (message['content'] or '') }}"
    "{%- for tc in message['tool_calls'] %}{%- set f = tc['function'] if tc['function'] is defined else tc %}"
    "{{- '<tool_call>{\"name\": \"' + f['name'] + '\", \"arguments\": ' "
    "+ (f['arguments'] if f['arguments'] is string else f['arguments'] | tojson) + '}</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>' + message['content'] + '</tool_response><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

#: transformers' response template (``tokenizer.response_template``) for :data:`TOOL_CHAT_TEMPLATE`.
RESPONSE_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}

#: ``steps`` is the most it runs; it stops at ``target_call_accuracy`` (:func:`call_accuracy` on
#: ``check_size`` held-out problems every ``check_every`` steps).
WARM_START: dict[str, Any] = {**tiny_spec.WARM_START, "steps": 400, "levels": list(arith_tools.DEFAULT_LEVELS), "tool_fraction": 0.4,
                              "careless_fraction": 0.0, "target_call_accuracy": 0.9, "check_every": 25, "check_size": 32}
CORPUS: dict[str, Any] = {"n": 1000, "seed": 0}


def calculator_schema() -> dict[str, Any]:
    """The calculator's function schema as the template receives it (only its name is rendered)."""
    return {"type": "function", "function": {"name": arith_tools.TOOL, "description": "Evaluate an arithmetic expression.",
                                             "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                                            "required": ["expression"]}}}


def set_templates(tokenizer: Any) -> Any:
    """Give ``tokenizer`` the tool chat template and its response parser."""
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    tokenizer.response_template = RESPONSE_TEMPLATE
    return tokenizer


def turn_examples(tokenizer: Any, problem: dict[str, Any], with_tool: bool) -> list[tuple[str, str]]:
    """``(prompt text, completion text)`` per assistant turn of ``problem`` (the completion ends
    before ``<|im_end|>``, which the encoder adds): the expert's two turns, or one direct answer."""
    tools = [calculator_schema()]
    msgs = arith_tools.expert_messages(problem)
    render = lambda m, gen: tokenizer.apply_chat_template(m, tools=tools, tokenize=False, add_generation_prompt=gen)  # noqa: E731
    if not with_tool:
        return [(render(msgs[:2], True), arith_tools.direct_solution(problem["answer"]))]
    out = []
    for k in (2, 4):  # the assistant turns
        prompt = render(msgs[:k], True)
        full = render(msgs[: k + 1], False)
        out.append((prompt, full[len(prompt):].removesuffix(tiny_bpe.IM_END + "\n")))
    return out


@functools.lru_cache(maxsize=1)
def _template():
    """:data:`TOOL_CHAT_TEMPLATE`, compiled once (compiling it per row cost 34 ms a row: 140 s of
    CPU time for the 4,000 training rows' trajectories at every run's start)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # deferred: jinja2 comes with transformers; only rendering needs it

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = json.dumps  # as transformers' chat templates: plain JSON (jinja's own escapes HTML)
    return env.from_string(TOOL_CHAT_TEMPLATE)


def _render(messages: list[dict[str, Any]], *, generation: bool) -> str:
    return _template().render(messages=messages, tools=[calculator_schema()], add_generation_prompt=generation)


def trajectory_text(problem: dict[str, Any]) -> str:
    """The expert's tool trajectory of ``problem`` as the completion of its chat prompt: what
    :data:`TOOL_CHAT_TEMPLATE` writes after the generation prompt, up to (not including) the final
    ``<|im_end|>``, which the expert source adds as eos. Its tool result (the ``<tool_response>`` turn)
    is read back as provenance ``environment`` (:func:`mixrl.core.turns.written_spans`)."""
    msgs = arith_tools.expert_messages(problem)
    prompt = _render(msgs[:2], generation=True)
    return _render(msgs, generation=False)[len(prompt):].removesuffix(tiny_bpe.IM_END + "\n")


def corpus_texts(tokenizer_like: Any | None = None, n: int = CORPUS["n"], seed: int = CORPUS["seed"]) -> list[str]:
    """The merges' corpus: the ``arith`` texts and the tool task's expert conversations."""
    del tokenizer_like
    texts = tiny_bpe.training_texts(n, seed)
    for p in arith_tools.train_split(n, seed=seed, levels=arith_tools.LEVELS):
        texts.append(_render(arith_tools.expert_messages(p), generation=False))
    return texts


def build(**size: Any):
    tokenizer = set_templates(tiny_bpe.build_tokenizer(corpus_texts(), vocab_size=VOCAB_SIZE))
    return model_for(tokenizer, **size), tokenizer


def model_for(tokenizer: Any, **size: Any):
    """A fresh model over ``tokenizer`` (its context length set on the tokenizer too)."""
    model = tiny_arch.build_model(tokenizer, base=tiny_bpe.MODEL_SIZE, max_new_tokens=MAX_COMPLETION_TOKENS, **size)
    tokenizer.model_max_length = model.config.max_position_embeddings
    return model


#: One tool round: the call (~25 tokens), the result's turn (~15), the answer (~8).
MAX_COMPLETION_TOKENS = 64


def recipe(steps: int | None = None) -> dict[str, Any]:
    ws = dict(WARM_START)
    if steps is not None:
        ws["steps"] = int(steps)
    return {"version": VERSION, "task": arith_tools.NAME, "task_version": arith_tools.TASK_VERSION,
            "tokenizer": {"vocab_size": VOCAB_SIZE, "corpus": dict(CORPUS), "chat_template": TOOL_CHAT_TEMPLATE,
                          "base": tiny_bpe.recipe()["tokenizer"]},
            "model": dict(tiny_bpe.MODEL_SIZE), "warm_start": ws}


def default_path(cache_dir: Path | str | None = None, *, steps: int | None = None) -> Path:
    base = Path(cache_dir).expanduser() if cache_dir is not None else tiny_spec.cache_root() / "tiny-bpe-tools"
    digest = hashlib.sha256(json.dumps(recipe(steps), sort_keys=True).encode()).hexdigest()[:12]
    return base / f"v{VERSION}-{digest}"


def is_tiny_bpe_tools(path: Path | str) -> bool:
    return str(path) == BUILTIN or (Path(str(path)).expanduser() / _META_FILE).is_file()


def _encode(tokenizer: Any, problem: dict[str, Any], completion: str) -> tuple[list[int], list[int]]:
    prompt_ids = tokenizer(problem["prompt_text"], add_special_tokens=False)["input_ids"]
    return prompt_ids, tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def call_prefix(problem: dict[str, Any]) -> tuple[str, str]:
    """``(prefix, target)``: the expert's call turn cut where the expression starts, and what follows
    it up to the end of the call (the expression, then ``"}}</tool_call>``)."""
    msgs = arith_tools.expert_messages(problem)
    prompt = _render(msgs[:2], generation=True)
    call = _render(msgs[:3], generation=False)[len(prompt):]
    expr = arith_tools.tool_call(problem)["function"]["arguments"]["expression"]
    cut = call.index(expr)
    return prompt + call[:cut], expr + call[cut + len(expr):].split(tiny_bpe.IM_END)[0]


def call_accuracy(model: Any, tokenizer: Any, problems: list[dict[str, Any]]) -> float:
    """Tool-call accuracy: the fraction of ``problems`` whose greedy continuation of
    :func:`call_prefix` writes the expression and closes the call exactly (the model copies the
    prompt's numbers into the calculator call)."""
    import torch  # deferred: torch, 2 s; config show/plan import this module

    pairs = [call_prefix(p) for p in problems]
    side, tokenizer.padding_side = tokenizer.padding_side, "left"  # a reloaded tokenizer may pad on the right
    try:
        enc = tokenizer([a for a, _ in pairs], return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tokenizer.padding_side = side
    width = max(len(tokenizer(b, add_special_tokens=False)["input_ids"]) for _, b in pairs)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=width, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    model.train(was_training)
    texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=False)
    return sum(t.startswith(b) for t, (_, b) in zip(texts, pairs, strict=True)) / len(pairs)


#: CPU-seconds of a build at the full recipe on one idle core (it stops at step 200 of 400: 164 s
#: measured at load 2 on 2 cores; 1,464 s on a loaded machine), for the build's note.
BUILD_SECONDS = 150


def warm_start(cache_dir: Path | str | None = None, *, force: bool = False, progress: bool = True,
               steps: int | None = None, use_shipped: bool = True, why: str | None = None) -> Path:
    """Path of the warm-started tool model: cached, else the copy shipped in the package when it was
    built with this recipe (:mod:`mixrl.models.shipped`; ``use_shipped=False`` never uses it), else
    built and cached, like :func:`mixrl.models.tiny_bpe.warm_start` (``why``: what needs it, for the note)."""
    final = default_path(cache_dir, steps=steps)
    if (final / _META_FILE).is_file() and not force:
        return final
    if use_shipped and not force and shipped.install("tiny-bpe-tools", final, meta_file=_META_FILE):
        return final
    rec = recipe(steps)
    supervised.announce_build("the tool model (builtin:tiny-bpe-tools)", why,
                              BUILD_SECONDS * min(rec["warm_start"]["steps"], 200) / 200, final, progress=progress)
    ws = rec["warm_start"]
    tokenizer = set_templates(tiny_bpe.build_tokenizer(corpus_texts(), vocab_size=VOCAB_SIZE))
    rng = random.Random(f"tools-warm-start-{ws['seed']}")
    problems, completions = [], []
    for p in arith_tools.train_split(2000, seed=ws["seed"], levels=ws["levels"]):
        for prompt, completion in turn_examples(tokenizer, p, rng.random() < ws["tool_fraction"]):
            problems.append({**p, "prompt_text": prompt})
            completions.append(completion)
    check = arith_tools.heldout_split(ws["check_size"], levels=ws["levels"])
    seen: dict[str, float] = {}

    def stop(model: Any, step: int) -> bool:
        if step % ws["check_every"]:
            return False
        seen["call_accuracy"] = call_accuracy(model, tokenizer, check)
        return seen["call_accuracy"] >= ws["target_call_accuracy"]

    return supervised.train_and_save(final, rec, lambda **size: (model_for(tokenizer, **size), tokenizer), encode=_encode,
                                     meta_file=_META_FILE, progress=progress, description="building the tool model",
                                     extra_meta=lambda model, tok: {"vocab": len(tok), **seen}, examples=(problems, completions),
                                     stop=stop)
