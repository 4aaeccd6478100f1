"""``trainer.generation=shared-prefill``: padded generation with each distinct prompt prefilled once.

A GRPO step generates G completions of every prompt: TRL repeats each prompt G times in the batch
(its ``RepeatSampler``) and transformers' ``generate`` then computes the prompt's keys and values
G times, once per row. Here the policy's ``generate`` is wrapped (:class:`SharedPrefill`): the
distinct rows of the left-padded prompt batch (``input_ids`` and ``attention_mask`` alike) run one
forward over all prompt positions but the last, the cache of that forward is expanded to every
row (``DynamicCache.batch_select_indices``: row ``i`` gets the cache of its prompt), and
``generate`` continues from that cache on the whole batch: it computes only the last prompt
position, then decodes as before.

What stays the same as plain padded generation: the rows, their order and width, the decoding
steps (every step runs on the whole batch, the same shapes), the sampling calls and so the random
stream, the returned tensor (prompt + completion ids). What differs: the prompt's keys and values
are computed in a batch of P distinct rows instead of P x G, and the last prompt position in a
forward of its own: the same operations on the same numbers, summed in another blocking by the
matmul and attention kernels, so logits can differ in the last bits (greedy completions equal
plain generation's token for token unless two tokens tie to those bits; sampled ones are drawn
from the same stream, ``tests/test_shared_prefill.py``). Saved: (G - 1) / G of the prefill's
work, nothing of the decoding's.

Plain ``generate`` runs instead (the call is passed through unchanged) when the batch has no
repeated prompt, a prompt of one token, or anything this does not reproduce exactly: a cache
given or configured (``cache_implementation``), beam search, several sequences per prompt,
assisted decoding, inputs besides ``input_ids`` and ``attention_mask`` (images), an
encoder-decoder model, or a model without transformers' default dynamic cache.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

#: generate() keywords that pass through unchanged (others: plain generate)
PASSED = frozenset({"input_ids", "attention_mask", "generation_config", "stopping_criteria", "logits_processor",
                    "max_new_tokens", "min_new_tokens", "do_sample", "temperature", "top_k", "top_p", "min_p",
                    "repetition_penalty", "pad_token_id", "eos_token_id", "bos_token_id", "use_cache", "synced_gpus"})


def prompt_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(first, index): ``first[j]`` is the first row of the ``j``-th distinct prompt (in order of
    first appearance) and ``index[i]`` the distinct prompt of row ``i``: ``first[index]`` lists, for
    every row, a row with the same ``input_ids`` and ``attention_mask``."""
    key = torch.cat([input_ids, attention_mask.to(input_ids.dtype)], 1)
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    rows = torch.arange(len(key), device=key.device)
    first_of = torch.full((int(inverse.max()) + 1,), len(key), device=key.device).scatter_reduce(0, inverse, rows, "amin")
    order = first_of.argsort()  # distinct prompts in order of first appearance
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order), device=key.device)
    return first_of[order], rank[inverse]


def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of left-padded rows as ``generate`` derives them from the mask (transformers
    5.x, ``GenerationMixin._prepare_position_ids_for_generation``): the count of real tokens
    before each, padding at 0."""
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.masked_fill(attention_mask == 0, 0)


def reproducible(model, kwargs: dict) -> bool:
    """Whether a wrapper of ``generate`` that rebuilds its decoding reproduces this call exactly:
    keyword inputs ``input_ids`` and ``attention_mask`` (2-D, same shape) and only :data:`PASSED`
    keywords, a decoder-only model with transformers' default dynamic cache, no cache given or
    configured, no beam search, one sequence per prompt, no assisted decoding."""
    ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
    if not (isinstance(ids, torch.Tensor) and isinstance(mask, torch.Tensor) and ids.dim() == mask.dim() == 2):
        return False
    if ids.shape != mask.shape or ids.shape[1] < 1 or not set(kwargs) <= PASSED:
        return False
    config = getattr(model, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return False
    supports = getattr(model, "_supports_default_dynamic_cache", None)
    if supports is None or not supports():
        return False
    gen = kwargs.get("generation_config") or getattr(model, "generation_config", None)
    model_gen = getattr(model, "generation_config", None)
    for g in (gen, model_gen):
        if g is None:
            continue
        if getattr(g, "cache_implementation", None) is not None or getattr(g, "use_cache", True) is False:
            return False
    if gen is None or int(getattr(gen, "num_beams", 1) or 1) != 1 or int(getattr(gen, "num_return_sequences", 1) or 1) != 1:
        return False
    if getattr(gen, "prompt_lookup_num_tokens", None) or getattr(gen, "assistant_early_exit", None):
        return False
    return kwargs.get("use_cache", True) is not False


class SharedPrefill:
    """Wraps ``model.generate`` (an instance attribute, so the class and other models are
    untouched); ``new_cache()`` returns an empty cache of the kind ``generate`` would build
    (transformers' ``DynamicCache`` for the model's text config: the assembly passes it, this
    module imports no transformers). ``prefilled`` / ``saved``: prompt positions computed / not
    computed by the calls that shared (for tests and the benchmark)."""

    def __init__(self, model, new_cache: Callable[[], object]):
        self.model, self.new_cache = model, new_cache
        self._generate = model.generate
        model.generate = self.generate
        self.prefilled = self.saved = self.calls = 0

    def generate(self, *args, **kwargs):
        if args or not self._shareable(kwargs):
            return self._generate(*args, **kwargs)
        ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
        first, index = prompt_groups(ids, mask)
        if len(first) == len(ids):
            return self._generate(*args, **kwargs)
        cache = self._prefill(ids[first, :-1], mask[first, :-1])
        cache.batch_select_indices(index)  # row i: the keys and values of its prompt
        self.calls += 1
        self.prefilled += len(first) * (ids.shape[1] - 1)
        self.saved += (len(ids) - len(first)) * (ids.shape[1] - 1)
        return self._generate(**kwargs, past_key_values=cache)

    def _shareable(self, kwargs: dict) -> bool:
        ids = kwargs.get("input_ids")
        return reproducible(self.model, kwargs) and ids.shape[1] >= 2

    @torch.no_grad()
    def _prefill(self, ids: torch.Tensor, mask: torch.Tensor):
        """The cache of ``ids`` (left-padded), computed as ``generate``'s own prefill would: the
        positions it derives from the mask, no mask when there is no padding (generate drops an
        all-ones mask), only the last position's logits."""
        cache = self.new_cache()
        extra = {"logits_to_keep": 1} if getattr(self.model, "_supports_logits_to_keep", lambda: False)() else {}
        self.model(input_ids=ids, attention_mask=None if bool(mask.all()) else mask, position_ids=positions(mask),
                   past_key_values=cache, use_cache=True, **extra)
        return cache

