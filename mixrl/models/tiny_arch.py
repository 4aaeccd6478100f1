"""The tiny model's tokenizer (character-level, over byte symbols) and network (a small
``Qwen2ForCausalLM``), freshly built; their sizes and tokens are :mod:`mixrl.models.tiny_spec`."""

from __future__ import annotations

from typing import Any

from mixrl.models.tiny_spec import BOS, EOS, MAX_COMPLETION_TOKENS, MODEL_SIZE, PAD, SPECIAL_TOKENS, UNK
from mixrl.tasks import arith

# --------------------------------------------------------------------------- tokenizer / model


def build_tokenizer(alphabet: str = arith.ALPHABET):
    """Character-level tokenizer: ids 0-3 are ``<pad> <s> </s> <unk>``, then one id per character.

    Encoding prepends ``<s>`` (with ``add_special_tokens=True``, the default, which is
    what TRL uses for prompts); decoding concatenates characters; pads on the left.
    Characters outside the vocabulary are dropped when encoding (``mixrl train`` extends the
    vocabulary to the training data first: :mod:`mixrl.models.tiny_vocab`).

    It is a ``Qwen2Tokenizer`` (a ``PreTrainedTokenizerFast`` backed by ``tokenizers``)
    with a byte-level vocabulary of single characters and no merges, on purpose:
    transformers 5 makes ``AutoTokenizer`` load *any* checkpoint whose config has
    ``model_type == "qwen2"`` as a ``Qwen2Tokenizer``, rebuilding its pre-tokenizer and
    decoder and ignoring the saved pipeline, so a custom character pipeline would come
    back changed (spaces silently dropped). With this layout the reload is exact. A
    character of several UTF-8 bytes (``é``) gets one id per byte (and decodes back whole).
    """
    return tokenizer_from_vocab({tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *byte_symbols(alphabet)])})


def byte_symbols(chars: str) -> list[str]:
    """The vocabulary entries that spell ``chars``: one per distinct UTF-8 byte, in order of first use
    (the byte-level pre-tokenizer writes byte ``b`` as ``bytes_to_unicode()[b]``, e.g. " " as "\u0120")."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode  # deferred: transformers, 1 s; config show/plan import this module

    byte_char = bytes_to_unicode()
    return list(dict.fromkeys(byte_char[b] for ch in chars for b in ch.encode()))


def tokenizer_from_vocab(vocab: dict[str, int]):
    """The tiny model's ``Qwen2Tokenizer`` over ``vocab`` (special tokens first, then byte symbols)."""
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer  # deferred: transformers, 1 s; config show/plan import this module

    return Qwen2Tokenizer(
        vocab=vocab,
        merges=[],
        unk_token=UNK,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        add_bos_token=True,
        padding_side="left",
        truncation_side="left",
        model_max_length=MODEL_SIZE["max_position_embeddings"],
    )


def build_model(tokenizer: Any, *, base: dict[str, Any] | None = None, max_new_tokens: int = MAX_COMPLETION_TOKENS,
                **size: Any):
    """A freshly initialised ``Qwen2ForCausalLM`` over ``tokenizer``'s vocabulary; ``size`` overrides
    keys of ``base`` (default :data:`mixrl.models.tiny_spec.MODEL_SIZE`); ``max_new_tokens`` is its generation config's budget."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM  # deferred: transformers, 1 s; config show/plan import this module

    base = MODEL_SIZE if base is None else base
    unknown = set(size) - set(base)
    if unknown:
        raise ValueError(f"unknown model size key(s) {sorted(unknown)}; known: {sorted(base)}")
    dims = {**base, **size}
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=dims["hidden_size"],
        intermediate_size=dims["intermediate_size"],
        num_hidden_layers=dims["num_hidden_layers"],
        num_attention_heads=dims["num_attention_heads"],
        num_key_value_heads=dims["num_key_value_heads"],
        max_position_embeddings=dims["max_position_embeddings"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        initializer_range=dims["initializer_range"],
        use_cache=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        max_new_tokens=max_new_tokens,
    )
    return model
