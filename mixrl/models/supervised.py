"""The supervised warm start that every built-in model shares (:mod:`mixrl.models.tiny`,
:mod:`mixrl.models.tiny_bpe`, :mod:`mixrl.models.tiny_data`): a short deterministic SFT run on the
``arith`` task (or on given examples), then an atomic save of the model and tokenizer with a metadata file."""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from mixrl.models.atomic import publishing
from mixrl.models.tiny_spec import _META_FILE
from mixrl.progress import progress_bar
from mixrl.tasks import arith

# --------------------------------------------------------------------------- warm start


#: ``encode(tokenizer, problem, completion) -> (prompt_ids, completion_ids)``: one warm-start example as
#: token ids; the loss covers ``completion_ids`` only (which end with eos).
Encode = Callable[[Any, dict[str, Any], str], tuple[list[int], list[int]]]


def encode_plain(tokenizer: Any, problem: dict[str, Any], completion: str) -> tuple[list[int], list[int]]:
    """``<s> prompt`` and ``completion </s>``: the character model's examples (TRL encodes prompts the same way)."""
    prompt_ids = tokenizer(problem["prompt"])["input_ids"]
    return prompt_ids, tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def _batch(tokenizer: Any, problems: Sequence[dict[str, Any]], completions: Sequence[str] | None = None,
           encode: Encode = encode_plain):
    """Right-padded ``prompt completion`` rows (``encode`` makes their ids) with labels on the completion only.

    ``completions`` defaults to the problems' expert ``solution``.
    """
    if completions is None:
        completions = [p["solution"] for p in problems]
    rows, labels = [], []
    for p, completion in zip(problems, completions, strict=True):
        prompt_ids, sol_ids = encode(tokenizer, p, completion)
        rows.append(prompt_ids + sol_ids)
        labels.append([-100] * len(prompt_ids) + sol_ids)
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    lab = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, lb) in enumerate(zip(rows, labels, strict=True)):
        ids[i, : len(r)] = torch.tensor(r)
        lab[i, : len(lb)] = torch.tensor(lb)
        mask[i, : len(r)] = 1
    return ids, mask, lab


def train_supervised(
    model: Any,
    tokenizer: Any,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    warmup_steps: int,
    weight_decay: float,
    levels: Sequence[int],
    seed: int,
    careless_fraction: float = 0.0,
    progress: bool = True,
    description: str = "warm-starting tiny model",
    encode: Encode = encode_plain,
    examples: tuple[Sequence[dict[str, Any]], Sequence[str]] | None = None,
    stop: Callable[[Any, int], bool] | None = None,
) -> list[float]:
    """Deterministic SFT on ``levels`` (train split); returns per-step losses.

    Each example's target is the expert ``solution``, or with probability
    ``careless_fraction`` :func:`mixrl.tasks.arith.careless_solution` (forgets the last term);
    ``encode`` turns an example into prompt and completion ids (default :func:`encode_plain`).
    ``examples=(problems, completions)`` trains on those instead of ``arith`` (``levels`` and
    ``careless_fraction`` unused): epochs over them, each in a fresh order drawn from ``seed``.
    ``stop(model, steps_done)``, called after each step, ends training early when it returns True
    (the learning-rate schedule stays the one for ``steps``); ``len(losses)`` is the steps run.
    """
    if examples is not None:
        problems, completions = _epochs(examples, max(steps * batch_size, 1), seed)
    else:
        problems = arith.train_split(max(steps * batch_size, 1), seed=seed, levels=levels)
        rng = random.Random(f"warm-start-{seed}")
        completions = [arith.careless_solution(p) if rng.random() < careless_fraction else p["solution"] for p in problems]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=weight_decay)

    def lr_at(step: int) -> float:  # linear warmup, cosine decay to 10%
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        t = (step - warmup_steps) / max(steps - warmup_steps, 1)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train()
    losses: list[float] = []
    bar = _progress(progress)
    with bar:
        task = bar.add_task(description, total=steps, loss=float("nan"))
        for step in range(steps):
            sl = slice(step * batch_size, (step + 1) * batch_size)
            ids, mask, lab = _batch(tokenizer, problems[sl], completions[sl], encode)
            loss = model(input_ids=ids, attention_mask=mask, labels=lab).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
            bar.update(task, advance=1, loss=sum(losses[-20:]) / len(losses[-20:]))
            if stop is not None and stop(model, step + 1):
                break
    model.eval()
    return losses


def _epochs(examples: tuple[Sequence[dict[str, Any]], Sequence[str]], n: int, seed: int) -> tuple[list, list]:
    """``n`` (problem, completion) pairs: whole epochs over ``examples``, each shuffled (seeded)."""
    problems, completions = examples
    if not problems or len(problems) != len(completions):
        raise ValueError("examples must be two non-empty sequences of the same length")
    rng = random.Random(f"warm-start-data-{seed}")
    order: list[int] = []
    while len(order) < n:
        epoch = list(range(len(problems)))
        rng.shuffle(epoch)
        order.extend(epoch)
    return [problems[i] for i in order[:n]], [completions[i] for i in order[:n]]


def announce_build(what: str, why: str | None, seconds: float, final: Path, *, progress: bool = True) -> None:
    """One line on stderr before a built-in model is built (nothing when ``progress`` is off): what is
    built, for what (``why``), that it happens once per machine, and about how long it takes."""
    if not progress:
        return
    purpose = f" for {why}" if why else ""
    Console(stderr=True).print(f"building {what}{purpose}, once per machine (about {seconds:.0f} CPU-s on an idle core, "
                               f"longer on a busy one); cached in {final.parent}", markup=False, highlight=False, soft_wrap=True)


def _progress(enabled: bool):
    return progress_bar(Console(stderr=True), quiet=not enabled, fields=("loss {task.fields[loss]:.3f}",))


def train_and_save(final: Path, rec: dict[str, Any], build: Callable[[], tuple[Any, Any]], *, encode: Encode = encode_plain,
                   meta_file: str = _META_FILE, progress: bool = True, description: str = "warm-starting tiny model",
                   extra_meta: Callable[[Any, Any], dict[str, Any]] | None = None,
                   examples: tuple[Sequence[dict[str, Any]], Sequence[str]] | None = None,
                   stop: Callable[[Any, int], bool] | None = None) -> Path:
    """Build ``(model, tokenizer) = build()``, warm-start it with ``rec["warm_start"]``
    (:func:`train_supervised`) and save both atomically to ``final`` with ``meta_file``
    (``rec`` plus the key, final loss, seconds, parameter count, ``extra_meta(model, tokenizer)``).

    Deterministic: seeded, in a forked RNG, on one thread. Shared by every built-in model.
    ``examples``: train on these (problems, completions) instead of ``arith`` (see :func:`train_supervised`);
    ``stop``: ends the warm start early (see :func:`train_supervised`), the metadata's ``steps_run`` says when.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    ws = rec["warm_start"]
    t0 = time.time()
    threads = torch.get_num_threads()
    # One thread: bitwise the same weights on any machine (the reduction order depends on the thread
    # count), and never the 5-10x slowdown that busy-waiting OpenMP threads suffer on a shared CPU.
    # Small batches of a tiny model gain little from a second thread anyway.
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(ws["seed"])
            model, tokenizer = build()
            losses = train_supervised(
                model,
                tokenizer,
                steps=ws["steps"],
                batch_size=ws["batch_size"],
                lr=ws["lr"],
                warmup_steps=min(ws["warmup_steps"], max(ws["steps"] // 10, 1)),
                weight_decay=ws["weight_decay"],
                levels=ws.get("levels", ()),
                seed=ws["seed"],
                careless_fraction=ws.get("careless_fraction", 0.0),
                progress=progress,
                description=description,
                encode=encode,
                examples=examples,
                stop=stop,
            )
    finally:
        torch.set_num_threads(threads)
    seconds = time.time() - t0

    # force, or a leftover incomplete dir: moved aside, then swapped in
    with publishing(final, complete=lambda folder: (folder / meta_file).is_file(), replace=True) as tmp:
        from transformers.utils import logging as hf_logging  # deferred: transformers, 1 s; config show/plan import this module

        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # no "Writing model shards" bar after ours
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        finally:
            if bars:
                hf_logging.enable_progress_bar()
        meta = {
            **rec,
            "key": final.name,
            "final_loss": sum(losses[-20:]) / max(len(losses[-20:]), 1),
            "steps_run": len(losses),
            "train_seconds": round(seconds, 2),
            "num_parameters": sum(p.numel() for p in model.parameters()),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            **(extra_meta(model, tokenizer) if extra_meta else {}),
        }
        (tmp / meta_file).write_text(json.dumps(meta, indent=2) + "\n")
    return final
