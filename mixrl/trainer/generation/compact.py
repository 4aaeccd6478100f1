"""``trainer.generation=compact`` (what ``auto`` picks without vLLM): padded generation that stops
computing the rows that are done.

Padded generation (transformers' ``generate``, TRL's default) decodes every row of the batch until
the longest is done: a row that emitted eos (or that a stopping criterion ended) is computed on,
its token then replaced by the pad token. With long-tailed completion lengths most rows finish
early, and the work of every decoding step (the linear layers, the attention, the cache's growth)
scales with the rows computed.

Here the policy's ``generate`` is wrapped (:class:`CompactGeneration`) and runs unchanged, with two
hooks installed on the model for the call only:

* the stopping criteria ``generate`` builds (``GenerationMixin._get_stopping_criteria``: eos, the
  length limit, the caller's criteria) are observed: after each sampled token, which rows are
  done is exactly ``generate``'s own ``unfinished_sequences``;
* the model's ``forward``: the prefill runs on the whole batch; each decoding step runs only on
  the rows still held, their ``input_ids``, ``attention_mask`` and ``position_ids`` sliced, and
  its logits are scattered back into a full-batch tensor (zeros in the rows not computed). Rows
  that are done leave the cache (``DynamicCache.batch_select_indices``) once they are at least
  :data:`SHRINK` of the rows held (dropping copies the cache, so it is amortised): a done row may
  be computed a few steps more, as padded generation computes it to the end.

So ``generate``'s own loop does everything else: the logits processors and warpers (temperature,
top-k, top-p, min-p, repetition penalty, min_new_tokens), the sampling (softmax and
``torch.multinomial`` on the full [B, V] scores: the same shapes, so the same random numbers are
drawn, each row from its own), the pad token for finished rows, the stop, the returned tensor
(prompt + completion ids). The scores of a row that is done are those of zero logits instead of
its real ones; its token is replaced by pad either way. What differs from plain padded generation:
the active rows are computed in a smaller batch, so logits can differ in the last bits (greedy
completions equal plain generation's token for token unless two tokens tie to those bits, sampled
ones are drawn from the same stream; ``tests/test_compact_generation.py``).

Rows are dropped only when ``generate`` pads finished rows (an eos criterion is among the
stopping criteria: without one, transformers keeps sampling a row after a caller's criterion
ended it, so every row is computed). Plain ``generate`` runs instead (the call passed through
unchanged) for anything this does not reproduce exactly: positional inputs, a cache given or
configured, beam search, several sequences per prompt, assisted decoding, inputs besides
``input_ids`` and ``attention_mask``, an encoder-decoder model, a model without the default
dynamic cache (:func:`mixrl.trainer.generation.shared_prefill.reproducible`), or outputs beyond
the ids (``return_dict_in_generate``: scores, logits, the cache). A decoding forward with inputs
it does not know how to slice runs on the whole batch.
"""

from __future__ import annotations

import torch

from mixrl.trainer.generation.shared_prefill import reproducible

#: a done row leaves the cache once the done rows are at least this share of the rows held
#: (dropping copies the cache; the decoding step already copies it once, torch.cat in DynamicLayer.update)
SHRINK = 1 / 8
#: decoding-forward inputs sliced to the rows held (2-D, the batch first)
ROW_INPUTS = ("input_ids", "attention_mask", "position_ids")
#: decoding-forward inputs passed as they are (no batch dimension)
KEPT = frozenset({"past_key_values", "use_cache", "return_dict", "logits_to_keep", "cache_position",
                  "output_attentions", "output_hidden_states"})
#: generation outputs beyond the ids (their per-row contents would differ for rows not computed)
OUTPUTS = ("return_dict_in_generate", "output_scores", "output_logits", "output_attentions", "output_hidden_states")


def observed(criteria, record):
    """``criteria`` (a ``StoppingCriteriaList``) as an instance of a subclass whose call also hands
    the rows it marks done to ``record`` (the list's own class is kept: transformers reads its
    ``max_length``)."""
    class Observed(type(criteria)):
        def __call__(self, input_ids, scores, **kwargs):
            done = super().__call__(input_ids, scores, **kwargs)
            record(done)
            return done

    return Observed(criteria)


class _Call:
    """One ``generate`` call: the rows done so far and the rows the cache holds."""

    def __init__(self, forward, batch: int, shrink: float):
        self.forward, self.batch, self.shrink = forward, int(batch), float(shrink)
        self.done = None  # bool [B]: generate's ~unfinished_sequences
        self.pads = False  # generate pads finished rows (has_eos_stopping_criteria)
        self.rows = None  # the batch rows the cache holds, in its order (None: all)
        self.sliceable = None  # decided at the first decoding step
        self.computed = self.decoded = 0  # row-steps computed / decoding steps

    def criteria(self, made):
        self.pads = any(hasattr(c, "eos_token_id") for c in made)  # transformers' has_eos_stopping_criteria
        return observed(made, self.record)

    def record(self, done: torch.Tensor) -> None:
        self.done = done.clone() if self.done is None else self.done | done

    def model_forward(self, *args, **kwargs):
        if args or self.done is None:  # the prefill (no token sampled yet): the whole batch
            return self.forward(*args, **kwargs)
        self.decoded += 1
        if self.sliceable is None:
            self.sliceable = self.pads and self._sliceable(kwargs)
        if not self.sliceable:
            self.computed += self.batch
            return self.forward(**kwargs)
        self._drop_done(kwargs["past_key_values"])
        if self.rows is None:
            self.computed += self.batch
            return self.forward(**kwargs)
        rows = self.rows
        self.computed += len(rows)
        out = self.forward(**{k: (v[rows] if k in ROW_INPUTS and v is not None else v) for k, v in kwargs.items()})
        logits = out.logits
        full = logits.new_zeros((self.batch, *logits.shape[1:]))
        full[rows] = logits
        out.logits = full
        return out

    def _sliceable(self, kwargs: dict) -> bool:
        ids, cache = kwargs.get("input_ids"), kwargs.get("past_key_values")
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[0] != self.batch:
            return False
        if not hasattr(cache, "batch_select_indices"):
            return False
        for k, v in kwargs.items():
            if k in ROW_INPUTS:
                if v is not None and not (isinstance(v, torch.Tensor) and v.dim() == 2 and v.shape[0] == self.batch):
                    return False
            elif k not in KEPT and v is not None:
                return False
            elif k in ("output_attentions", "output_hidden_states") and v:
                return False
        return True

    def _drop_done(self, cache) -> None:
        """The done rows leave the cache once they are at least ``shrink`` of the rows held (never all)."""
        held = self.rows if self.rows is not None else torch.arange(self.batch, device=self.done.device)
        keep = ~self.done[held]
        n_keep = int(keep.sum())
        n_done = len(held) - n_keep
        if n_keep == 0 or n_done == 0 or n_done < self.shrink * len(held):
            return
        index = keep.nonzero().squeeze(1)
        cache.batch_select_indices(index)
        self.rows = held[index]


class CompactGeneration:
    """Wraps ``model.generate`` (an instance attribute, so the class and other models are
    untouched). ``calls``: the calls compacted; ``computed`` / ``padded``: row-steps of their
    decoding computed / that padded generation would have computed (for tests and the benchmark)."""

    def __init__(self, model, shrink: float = SHRINK):
        self.model, self.shrink = model, float(shrink)
        self._generate = model.generate
        model.generate = self.generate
        self.calls = self.computed = self.padded = 0

    def generate(self, *args, **kwargs):
        if args or not self._applies(kwargs):
            return self._generate(*args, **kwargs)
        model = self.model
        call = _Call(model.forward, len(kwargs["input_ids"]), self.shrink)
        make_criteria = model._get_stopping_criteria
        before = {k: model.__dict__[k] for k in ("forward", "_get_stopping_criteria") if k in model.__dict__}
        model._get_stopping_criteria = lambda *a, **k: call.criteria(make_criteria(*a, **k))
        model.forward = call.model_forward
        try:
            out = self._generate(**kwargs)
        finally:
            for k in ("forward", "_get_stopping_criteria"):
                if k in before:
                    setattr(model, k, before[k])
                else:
                    delattr(model, k)
        self.calls += 1
        self.computed += call.computed
        self.padded += call.decoded * call.batch
        return out

    def _applies(self, kwargs: dict) -> bool:
        if not reproducible(self.model, kwargs):
            return False
        gen = kwargs.get("generation_config") or getattr(self.model, "generation_config", None)
        return not any(getattr(gen, name, False) for name in OUTPUTS)
