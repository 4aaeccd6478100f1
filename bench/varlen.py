"""``--lengths variable``: completion lengths drawn from a stated long-tailed distribution, the
SAME lengths for every variant, and the variants that differ in how a step's rows are batched.

Lengths: a lognormal with median ``--length-median`` and log-space sigma ``--length-sigma``
(``L = round(median * exp(sigma * z))``, ``z`` standard normal), clipped to
``[1, max_completion_length]``; the ``k``-th generation call of every variant gets the same draws
(a ``torch.Generator`` seeded with ``(seed, k)``), row by row. Every variant generates
``max_completion_length`` tokens (eos suppressed, as ``--lengths fixed``) and each completion is
then cut to its drawn length, its last token made eos: the generation work is the same in every
variant, and the rows the training step sees have the drawn, long-tailed lengths.

Variants (beside ``trl``, ``grpo``, ``chord``, ``floor``): ``grpo-budget`` (padded rows in
token-budget micro-batches, ``trainer.max_tokens_per_micro_batch=--token-budget``), ``grpo-pf``
(``trainer.padding_free=true``: packed rows), ``grpo-pf-budget`` (both), and the same for chord,
whose expert rows are stretched to 3x a drawn rollout length (:func:`stretch_experts`).
A variant whose config key this checkout lacks (``trainer.padding_free`` before it is merged) is
reported "not available" rather than run.
"""

from __future__ import annotations

import torch

#: variant suffix -> the config overrides it adds to its algo's (``{budget}``: ``--token-budget``)
#: padded variants say ``trainer.padding_free=false``: its default ``auto`` packs rows wherever the model takes them
SUFFIXES = {"-pf-budget": ("trainer.padding_free=true", "trainer.max_tokens_per_micro_batch={budget}"),
            "-budget": ("trainer.padding_free=false", "trainer.max_tokens_per_micro_batch={budget}"),
            "-pf": ("trainer.padding_free=true",)}
#: the mixrl variants whose plain name means padded rows here
PADDED = ("grpo", "chord")


def base_and_overrides(name: str, budget: int) -> tuple[str, list[str]]:
    """(the variant it is a batching of, the overrides its suffix adds; ``grpo``, ``chord``: padded rows)."""
    for suffix, sets in SUFFIXES.items():
        if name.endswith(suffix):
            return name[: -len(suffix)], [s.format(budget=budget) for s in sets]
    return name, (["trainer.padding_free=false"] if name in PADDED else [])


class LengthDraw:
    """The completion lengths of each generation call (see the module docstring)."""

    def __init__(self, median: float, sigma: float, max_len: int, seed: int = 0):
        if median <= 0 or sigma < 0:
            raise ValueError(f"--length-median must be > 0 and --length-sigma >= 0, got {median} and {sigma}")
        self.median, self.sigma, self.max_len, self.seed = float(median), float(sigma), int(max_len), int(seed)

    def draw(self, call: int, n: int) -> list[int]:
        """Formula: L = clip(round(median * exp(sigma * z)), 1, max_completion_length), z ~ N(0, 1) seeded by (seed, call)."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + int(call))
        z = torch.randn(n, generator=g, dtype=torch.float64)
        return (self.median * torch.exp(self.sigma * z)).round().clamp(1, self.max_len).long().tolist()

    def describe(self) -> str:
        return (f"lognormal, median {self.median:g} tokens, sigma {self.sigma:g} (log space), clipped to "
                f"[1, {self.max_len}]; the same draws for every variant (seed {self.seed})")


def cut(completions: list[list[int]], lengths: list[int], eos: int) -> None:
    """Cut each completion (in place) to its length, the last kept token eos."""
    for c, n in zip(completions, lengths):
        del c[n:]
        if c:
            c[-1] = eos


def wrap_generation(trainer, draw: LengthDraw, eos: int) -> None:
    """The trainer's ``_generate_single_turn`` (TRL's or mixrl's), its completions cut to the drawn lengths."""
    generate = trainer._generate_single_turn
    calls = [0]

    def generate_cut(prompt_ids, *args, **kwargs):
        ids, logprobs = generate(prompt_ids, *args, **kwargs)
        if trainer.model.training:
            cut(ids, draw.draw(calls[0], len(ids)), eos)
            if logprobs is not None:
                for lp, c in zip(logprobs, ids):
                    del lp[len(c):]
            calls[0] += 1
        return ids, logprobs

    trainer._generate_single_turn = generate_cut


def stretch_experts(trainer, draw: LengthDraw, factor: float = 3.0) -> None:
    """CHORD's expert rows (``algo.inject`` appending rows): each expert completion repeated, then cut,
    to ``factor`` x a drawn rollout length in tokens (clipped to max_completion_length): long expert
    rows as R1 demonstrations are beside rollouts. The ``k``-th call draws from stream ``10^6 + k``."""
    injections = trainer.parts.injections.injections
    if not injections or not hasattr(injections[0], "sample"):
        return
    inj, tok = injections[0], trainer.processing_class
    sample = inj.sample
    calls = [0]

    def stretched(ctx):
        picks = sample(ctx)
        lengths = draw.draw(1_000_000 + calls[0], len(picks))
        calls[0] += 1
        out = []
        for (prompt, text), n in zip(picks, lengths):
            target = int(min(max(round(factor * n), 1), draw.max_len))
            ids = tok(text=text, add_special_tokens=False)["input_ids"] or [tok.eos_token_id]
            ids = (ids * (target // len(ids) + 1))[:target]
            out.append((prompt, tok.decode(ids)))
        return out

    inj.sample = stretched


def cut_tensor(completion_ids: torch.Tensor, completion_mask: torch.Tensor, lengths: list[int], eos: int, pad: int):
    """The floor's padded completions cut to ``lengths`` (ids past a row's length set to pad, its last token eos)."""
    n = torch.as_tensor(lengths, device=completion_ids.device).clamp(max=completion_ids.shape[1])
    cols = torch.arange(completion_ids.shape[1], device=completion_ids.device).unsqueeze(0)
    keep = cols < n.unsqueeze(1)
    ids = completion_ids.masked_fill(~keep, pad)
    ids = torch.where(cols == (n - 1).unsqueeze(1), torch.full_like(ids, eos), ids)
    return ids, (completion_mask.bool() & keep).int()
