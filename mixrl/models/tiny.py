"""A tiny character-level Qwen2 model, warm-started on the easy ``arith`` levels.

``mixrl train`` with no arguments trains this model, so a first run works offline
on a laptop CPU in a few minutes:

* :func:`build_tokenizer` - a character-level tokenizer over the task alphabet plus
  ``<pad>``, ``<s>`` (bos, prepended when encoding), ``</s>`` (eos, ends completions)
  and ``<unk>``; pads on the left. :mod:`mixrl.models.tiny_vocab` extends a saved tiny
  model to the characters of other data.
* :func:`build_model` - a small ``Qwen2ForCausalLM`` (~0.66M parameters by default).
* :func:`warm_start` - a short deterministic supervised run (~300 steps) on the easy
  levels; the result is saved in Hugging Face format under ``<cache>/tiny/<key>/``
  and reused. ``python -m mixrl.models.tiny`` builds it.

The warm start imitates a *mixture of demonstrators*: 40% of its targets are the
expert worked solutions, 60% come from a careless demonstrator that forgets the
last term (:func:`mixrl.tasks.arith.careless_solution`). The warm-started policy
inherits both habits (~15-30% held-out accuracy on levels 1-4), so on-policy RL has a
behaviour to unlearn and, with plain GRPO, roughly doubles held-out accuracy within
a few dozen steps. Warm-starting on expert solutions only leaves the model's errors
in per-fact arithmetic, which RL on a tiny model improves only slowly (~+5-10
points in the same budget) and a higher learning rate destroys.

The cache root is ``$MIXRL_CACHE`` if set, else ``$XDG_CACHE_HOME/mixrl``, else
``~/.cache/mixrl``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mixrl.tasks import arith

#: Bump on any change to the tokenizer, model or warm-start recipe (it is part of the cache key).
TINY_VERSION = "4"

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)

#: Default architecture (see :func:`build_model`).
MODEL_SIZE: dict[str, Any] = {
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "intermediate_size": 256,
    "max_position_embeddings": 64,
    # larger than the usual 0.02: the warm start learns much faster (and GRPO seemed less fragile)
    "initializer_range": 0.08,
}

#: Default warm-start recipe (see :func:`warm_start`).
WARM_START: dict[str, Any] = {
    "steps": 300,
    "batch_size": 64,
    "lr": 3e-3,
    "warmup_steps": 20,
    "weight_decay": 0.0,
    "levels": list(arith.EASY_LEVELS),
    # fraction of warm-start examples imitating a careless demonstrator that forgets the last term
    "careless_fraction": 0.6,
    "seed": 0,
}

#: The built-in teacher (``model: builtin:tiny-teacher`` in a teacher config): the same architecture and
#: tokenizer, warm-started on expert solutions only (no careless demonstrator), on every level, for longer.
#: Cached beside the student under ``<cache>/tiny-teacher/<key>/``; its held-out accuracy per level is
#: in the README (teachers section).
TEACHER_WARM_START: dict[str, Any] = {
    **WARM_START,
    "steps": 600,
    "levels": list(arith.LEVELS),
    "careless_fraction": 0.0,
}
ROLES = ("student", "teacher")

#: GRPO settings that improve the warm-started model on the default ``arith`` mix in ~1 minute on
#: 2 CPU cores (measured with plain ``trl.GRPOTrainer``; see the project notes for the numbers).
GRPO_DEFAULTS: dict[str, Any] = {
    "learning_rate": 5e-5,  # 1e-4 works (faster, noisier); >=3e-4 degrades the model
    "lr_scheduler_type": "constant",
    "per_device_train_batch_size": 128,  # completions per step = 16 prompts x 8 generations
    "num_generations": 8,
    "temperature": 1.0,
    "max_completion_length": arith.MAX_SOLUTION_CHARS + 1,  # = MAX_COMPLETION_TOKENS
    "beta": 0.0,
    "loss_type": "dapo",
    "max_steps": 80,
}

#: Generation budget that fits every ``arith`` completion plus eos.
MAX_COMPLETION_TOKENS = arith.MAX_SOLUTION_CHARS + 1
#: Longest encoded prompt (bos + prompt).
MAX_PROMPT_TOKENS = arith.MAX_PROMPT_CHARS + 1

_META_FILE = "mixrl_tiny.json"


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
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_char = bytes_to_unicode()
    return list(dict.fromkeys(byte_char[b] for ch in chars for b in ch.encode()))


def tokenizer_from_vocab(vocab: dict[str, int]):
    """The tiny model's ``Qwen2Tokenizer`` over ``vocab`` (special tokens first, then byte symbols)."""
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

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
    keys of ``base`` (default :data:`MODEL_SIZE`); ``max_new_tokens`` is its generation config's budget."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

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


# --------------------------------------------------------------------------- cache


def cache_root() -> Path:
    """``$MIXRL_CACHE``, else ``$XDG_CACHE_HOME/mixrl``, else ``~/.cache/mixrl``."""
    if os.environ.get("MIXRL_CACHE"):
        return Path(os.environ["MIXRL_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "mixrl"
    return Path.home() / ".cache" / "mixrl"


def recipe(steps: int | None = None, role: str = "student") -> dict[str, Any]:
    """Everything the warm-started weights depend on (hashed into the cache key). ``role``:
    ``student`` (the default model) or ``teacher`` (:data:`TEACHER_WARM_START`)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    ws = dict(WARM_START if role == "student" else TEACHER_WARM_START)
    if steps is not None:
        ws["steps"] = int(steps)
    rec = {
        "tiny_version": TINY_VERSION,
        "task": arith.NAME,
        "task_version": arith.TASK_VERSION,
        "alphabet": arith.ALPHABET,
        "model": dict(MODEL_SIZE),
        "warm_start": ws,
    }
    if role != "student":  # the student's key stays what it was
        rec["role"] = role
    return rec


def cache_key(steps: int | None = None, role: str = "student") -> str:
    digest = hashlib.sha256(json.dumps(recipe(steps, role), sort_keys=True).encode()).hexdigest()[:12]
    return f"v{TINY_VERSION}-{digest}"


def default_path(cache_dir: Path | str | None = None, *, steps: int | None = None, role: str = "student") -> Path:
    """Where :func:`warm_start` saves (``cache_dir`` defaults to ``cache_root()/"tiny"``, or
    ``cache_root()/"tiny-teacher"`` for the teacher)."""
    folder = "tiny" if role == "student" else f"tiny-{role}"
    base = Path(cache_dir).expanduser() if cache_dir is not None else cache_root() / folder
    return base / cache_key(steps, role)


def is_complete(path: Path) -> bool:
    return (path / _META_FILE).is_file() and (path / "config.json").is_file()


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
    import torch

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
) -> list[float]:
    """Deterministic SFT on ``levels`` (train split); returns per-step losses.

    Each example's target is the expert ``solution``, or with probability
    ``careless_fraction`` :func:`mixrl.tasks.arith.careless_solution` (forgets the last term);
    ``encode`` turns an example into prompt and completion ids (default :func:`encode_plain`).
    """
    import random

    import torch

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
    model.eval()
    return losses


class _NoProgress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def add_task(self, *a, **k):
        return 0

    def update(self, *a, **k):
        pass


def _progress(enabled: bool):
    if not enabled:
        return _NoProgress()
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.3f}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=False,
    )


def warm_start(
    cache_dir: Path | str | None = None,
    *,
    force: bool = False,
    progress: bool = True,
    steps: int | None = None,
    role: str = "student",
) -> Path:
    """Path of the warm-started tiny model (model + tokenizer, ``save_pretrained`` format).

    Trains it (deterministically, on one CPU thread, ~25-60 s) unless a
    complete copy is already cached; ``force`` retrains. ``cache_dir`` replaces
    ``cache_root()/"tiny"``; ``steps`` overrides the number of optimizer steps (and
    is part of the cache key), e.g. for tests. ``role="teacher"`` builds the built-in teacher
    (:func:`teacher_warm_start`).
    """
    final = default_path(cache_dir, steps=steps, role=role)
    if is_complete(final) and not force:
        return final

    def build():
        tokenizer = build_tokenizer()
        return build_model(tokenizer), tokenizer

    description = f"warm-starting tiny {role}" if role != "student" else "warm-starting tiny model"
    return train_and_save(final, recipe(steps, role), build, progress=progress, description=description)


def train_and_save(final: Path, rec: dict[str, Any], build: Callable[[], tuple[Any, Any]], *, encode: Encode = encode_plain,
                   meta_file: str = _META_FILE, progress: bool = True, description: str = "warm-starting tiny model",
                   extra_meta: Callable[[Any, Any], dict[str, Any]] | None = None) -> Path:
    """Build ``(model, tokenizer) = build()``, warm-start it with ``rec["warm_start"]``
    (:func:`train_supervised`) and save both atomically to ``final`` with ``meta_file``
    (``rec`` plus the key, final loss, seconds, parameter count, ``extra_meta(model, tokenizer)``).

    Deterministic: seeded, in a forked RNG, on one thread. Shared by every built-in model.
    """
    import torch

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
                levels=ws["levels"],
                seed=ws["seed"],
                careless_fraction=ws["careless_fraction"],
                progress=progress,
                description=description,
                encode=encode,
            )
    finally:
        torch.set_num_threads(threads)
    seconds = time.time() - t0

    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it 0o700; the cache is meant to be shared like any other
    try:
        from transformers.utils import logging as hf_logging

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
            "train_seconds": round(seconds, 2),
            "num_parameters": sum(p.numel() for p in model.parameters()),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            **(extra_meta(model, tokenizer) if extra_meta else {}),
        }
        (tmp / meta_file).write_text(json.dumps(meta, indent=2) + "\n")
        if final.exists():  # force, or a leftover incomplete dir: move it aside, then swap in
            old = final.parent / f".{final.name}.old-{os.getpid()}-{time.time_ns()}"
            os.rename(final, old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / meta_file).is_file():  # lost a race to a concurrent writer that left nothing usable
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def teacher_warm_start(cache_dir: Path | str | None = None, *, force: bool = False, progress: bool = True,
                       steps: int | None = None) -> Path:
    """Path of the built-in teacher (``builtin:tiny-teacher``): :func:`warm_start` with
    :data:`TEACHER_WARM_START` (expert solutions only, every level, longer), cached the same way."""
    return warm_start(cache_dir, force=force, progress=progress, steps=steps, role="teacher")


def load(path: Path | str | None = None):
    """``(model, tokenizer)`` from ``path`` (default: :func:`warm_start`, training it if needed)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path) if path is not None else warm_start()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    return model, tokenizer


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m mixrl.models.tiny", description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="retrain even if a cached copy exists")
    ap.add_argument("--cache-dir", type=Path, default=None, help="directory to hold <key>/ (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=None, help="override the number of warm-start steps")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--teacher", action="store_true", help="build the built-in teacher (builtin:tiny-teacher) instead")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path = warm_start(args.cache_dir, force=args.force, progress=not args.no_progress, steps=args.steps,
                      role="teacher" if args.teacher else "student")
    print(path)
    meta = json.loads((path / _META_FILE).read_text())
    print(
        f"{meta['num_parameters']:,} parameters; warm start: {meta['warm_start']['steps']} steps, "
        f"final loss {meta['final_loss']:.3f}, {meta['train_seconds']:.1f}s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
