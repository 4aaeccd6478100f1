"""A byte-level BPE tokenizer with a Qwen-style chat template, trained here in seconds.

The character-level tiny model (:mod:`mixrl.models.tiny`) hides what real chat models do
to mixed-policy methods: one token spans several characters (so text cut at a character
position need not be a token boundary), text re-tokenizes differently once joined, and a
chat template adds tokens around every turn. This tokenizer has all three, at the scale of
the built-in task:

* the pipeline of Qwen2.5's tokenizer (``Qwen2Tokenizer``: byte-level BPE, Qwen's
  pre-tokenizer regex, digits split one by one), with merges learned by ``tokenizers``
  (:meth:`~transformers.PreTrainedTokenizerFast.train_new_from_iterator`) on chat-formatted
  ``arith`` problems and their worked solutions, so words and runs such as ``" ####"`` or
  ``"assistant"`` are single tokens;
* Qwen's special tokens ``<|endoftext|>`` (padding), ``<|im_start|>`` and ``<|im_end|>``
  (end of a turn, and eos), and Qwen2.5's chat template without tool calls
  (:data:`CHAT_TEMPLATE`), with :data:`SYSTEM_PROMPT` as the default system message.

Saved with a ``config.json`` of ``model_type: qwen2``, it reloads identically with
``AutoTokenizer`` (tested).
"""

from __future__ import annotations

from collections.abc import Iterable

from mixrl.tasks import arith

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (PAD, IM_START, IM_END)
#: Target vocabulary size: 256 byte symbols + 3 special tokens + the learned merges.
VOCAB_SIZE = 400
#: The system message of every chat-formatted built-in prompt (``data.system_prompt``).
SYSTEM_PROMPT = "You add numbers step by step. Write the answer after ####."

#: Qwen2.5's chat template, without its tool-call branches.
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\n" + SYSTEM_PROMPT + "<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] != 'system' %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)


def chat_text(prompt: str, completion: str | None = None, system: str = SYSTEM_PROMPT) -> str:
    """One conversation as the chat template writes it (the completion closed by ``<|im_end|>``)."""
    text = f"{IM_START}system\n{system}{IM_END}\n{IM_START}user\n{prompt}{IM_END}\n{IM_START}assistant\n"
    return text if completion is None else text + completion + IM_END + "\n"


def training_texts(n: int = 2000, seed: int = 0) -> list[str]:
    """Chat-formatted ``arith`` problems with their expert solutions, every level: the merges' corpus."""
    return [chat_text(r["prompt"], r["solution"]) for r in arith.train_split(n, seed=seed, levels=arith.LEVELS)]


def build_tokenizer(texts: Iterable[str] | None = None, vocab_size: int = VOCAB_SIZE):
    """A ``Qwen2Tokenizer`` whose BPE merges are learned on ``texts`` (default :func:`training_texts`).

    Deterministic for the same texts and size. Pads on the left with ``<|endoftext|>``; eos is
    ``<|im_end|>``, as in Qwen2.5's instruct models; no bos token.
    """
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    bytes_only = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *dict.fromkeys(bytes_to_unicode().values())])}
    base = Qwen2Tokenizer(vocab=bytes_only, merges=[], unk_token=None, bos_token=None, eos_token=IM_END, pad_token=PAD,
                          additional_special_tokens=[IM_START])
    tok = base.train_new_from_iterator(list(texts if texts is not None else training_texts()), vocab_size=vocab_size,
                                       new_special_tokens=list(SPECIAL_TOKENS))
    tok.chat_template = CHAT_TEMPLATE
    tok.padding_side = "left"
    tok.truncation_side = "left"
    return tok
