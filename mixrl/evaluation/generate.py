"""The one batched HF ``generate`` loop: held-out evaluation (:mod:`mixrl.evaluation.accuracy`,
:mod:`mixrl.evaluation.greedy`), acting evaluation (:mod:`mixrl.evaluation.acting`) and the
benchmarks' HF backend (:class:`mixrl.benchmarks.runner.HFGenerator`) all generate through it.

* :func:`generate_texts`: one batch of prompts (text, or chat messages rendered with the chat
  template), left-padded; the decoded new tokens (special tokens dropped).
* :func:`generate_ids`: one batch of token-id histories; the new ids, cut after the first
  end-of-sequence token and to each row's budget (the multi-turn loops work on ids).
* :func:`batches` (inside :func:`eval_mode`): the items cut into batches, ``stop`` asked before
  each (:class:`EvaluationInterrupted`), ``progress`` told after each.
* :func:`generate_completions`: the three together for text prompts, ``n`` completions each.

Greedy unless ``do_sample`` (temperature and top-p then apply); ``top_k`` is never used.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch


class EvaluationInterrupted(Exception):
    """The evaluation stopped because its ``stop`` callable asked it to (SIGINT / SIGTERM during
    training's held-out evaluation: :class:`mixrl.trainer.guards.InterruptGuard`)."""


def render_prompt(tokenizer, prompt: Any) -> str:
    """A text prompt as is; a chat message list rendered with the tokenizer's chat template."""
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)


def _sampling(do_sample: bool, temperature: float, top_p: float | None) -> dict:
    return {"do_sample": do_sample, "temperature": temperature if do_sample else None,
            "top_p": top_p if do_sample else None, "top_k": None}


@contextlib.contextmanager
def left_padding(tokenizer) -> Iterator[None]:
    """The tokenizer pads on the left inside the block (decoder-only generation), as before after."""
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        yield
    finally:
        tokenizer.padding_side = side


@torch.no_grad()
def generate_texts(model, tokenizer, prompts: Sequence[Any], *, max_new_tokens: int, do_sample: bool = False,
                   temperature: float = 1.0, top_p: float | None = None, num_return_sequences: int = 1,
                   stopping_criteria: Any = None, logits_processor: Any = None) -> list[str]:
    """One ``generate`` call on ``prompts`` (the tokenizer already left-padding, see
    :func:`left_padding`): ``num_return_sequences`` decoded completions per prompt, in order."""
    texts = [render_prompt(tokenizer, p) for p in prompts]
    # as TRL does: plain prompts get the tokenizer's special tokens (e.g. bos); a rendered chat
    # template already holds them
    plain = isinstance(prompts[0], str)
    device = next(model.parameters()).device
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=plain).to(device)
    gen = model.generate(
        **enc,
        max_new_tokens=max_new_tokens,
        **_sampling(do_sample, temperature, top_p),
        num_return_sequences=num_return_sequences,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **({"stopping_criteria": stopping_criteria} if stopping_criteria is not None else {}),
        **({"logits_processor": logits_processor} if logits_processor is not None else {}),
    )
    return tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)


def eos_ids(model, tokenizer) -> list[int]:
    """The end-of-sequence ids: the model's generation config's and the tokenizer's."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    eos = eos if isinstance(eos, list) else [eos] if eos is not None else []
    return sorted({int(e) for e in [*eos, tokenizer.eos_token_id] if e is not None})


@torch.no_grad()
def generate_ids(model, tokenizer, histories: Sequence[Sequence[int]], *, max_new_tokens: Sequence[int] | int,
                 do_sample: bool = False, temperature: float = 1.0) -> list[list[int]]:
    """One continuation per history (left-padded batch), cut after its first end-of-sequence token
    and to its row's ``max_new_tokens``."""
    if not histories:
        return []
    limits = [int(max_new_tokens)] * len(histories) if isinstance(max_new_tokens, int) else [int(m) for m in max_new_tokens]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(h) for h in histories)
    device = next(model.parameters()).device
    ids = torch.tensor([[pad] * (width - len(h)) + list(h) for h in histories], device=device)
    mask = torch.tensor([[0] * (width - len(h)) + [1] * len(h) for h in histories], device=device)
    eos = eos_ids(model, tokenizer)
    gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(max(limits), 1),
                         **_sampling(do_sample, temperature, None), pad_token_id=pad, eos_token_id=eos or None)
    out = []
    for row, limit in zip(gen[:, width:].tolist(), limits):
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        out.append(row[: min(cut, max(limit, 0))])
    return out


@contextlib.contextmanager
def eval_mode(model) -> Iterator[None]:
    """``model`` in eval mode inside the block, then back in the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def batches(items: Sequence[Any], batch_size: int, *, stop: Callable[[], bool] | None = None,
            progress: Callable[[int], None] | None = None) -> Iterator[tuple[int, Sequence[Any]]]:
    """``(start, chunk)`` for each batch of ``items``. ``stop`` is asked before each batch: True
    raises :class:`EvaluationInterrupted`; ``progress(len(chunk))`` is called after each batch."""
    size = max(int(batch_size), 1)
    for start in range(0, len(items), size):
        if stop is not None and stop():
            raise EvaluationInterrupted(f"stopped after {start} of {len(items)} prompts")
        chunk = items[start : start + size]
        yield start, chunk
        if progress is not None:
            progress(len(chunk))


def _stopping(stop: Callable[[], bool] | None):
    """A ``generate`` stopping criterion that ends every row once ``stop()`` is true, so a signal
    stops a long batch within one token, not at its end. Only in a single process: under a
    launcher the processes' batches end at the same point only when they stop between batches
    (their token counts may differ), so there ``stop`` is asked between batches alone."""
    import torch.distributed as dist  # deferred: only to know whether processes generate together

    if stop is None or (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return None
    from transformers import StoppingCriteria, StoppingCriteriaList  # deferred: transformers is heavy; only generation needs it

    class _Stop(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), bool(stop()), dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([_Stop()])


def generate_completions(
    model,
    tokenizer,
    prompts: Sequence[Any],
    *,
    max_new_tokens: int,
    batch_size: int = 128,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_p: float | None = None,
    num_return_sequences: int = 1,
    progress: Callable[[int], None] | None = None,
    stop: Callable[[], bool] | None = None,
    logits_processor: Callable[[int], Any] | None = None,
) -> list[list[str]]:
    """Completions (decoded, special tokens removed) for each prompt: a list of n per prompt.
    ``top_p``: nucleus sampling when sampling (None: the whole distribution).
    ``logits_processor(start)``: a ``LogitsProcessorList`` for the batch of prompts from index
    ``start`` (e.g. :class:`mixrl.benchmarks.sampling.SeededSampling`, which samples through greedy
    decoding of Gumbel-perturbed scores, so pass ``do_sample=False`` with it).
    ``stop``: asked before each batch (and, in a single process, at each generated token);
    once it returns True the generation ends and :class:`EvaluationInterrupted` is raised."""
    criteria = _stopping(stop)
    n = num_return_sequences
    out: list[list[str]] = []
    with eval_mode(model), left_padding(tokenizer):
        for start, chunk in batches(prompts, batch_size, stop=stop, progress=progress):
            texts = generate_texts(model, tokenizer, chunk, max_new_tokens=max_new_tokens, do_sample=do_sample,
                                   temperature=temperature, top_p=top_p, num_return_sequences=n,
                                   stopping_criteria=criteria,
                                   logits_processor=logits_processor(start) if logits_processor is not None else None)
            if criteria is not None and stop():  # the batch was cut short: its completions are not results
                raise EvaluationInterrupted(f"stopped during prompts {start}..{start + len(chunk)} of {len(prompts)}")
            out.extend(texts[i * n : (i + 1) * n] for i in range(len(chunk)))
    return out
