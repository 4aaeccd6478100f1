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

The model (``model=tiny-bpe``, ``model.path=builtin:tiny-bpe``) is the character model's
``Qwen2ForCausalLM`` (:func:`mixrl.models.tiny_arch.build_model`, a longer context for the chat
turns) over this tokenizer, warm-started the same way (:func:`mixrl.models.supervised.train_and_save`:
the careless-demonstrator mixture on the easy levels) on chat-formatted examples: the prompt is
the chat template around the ``arith`` problem (system message :data:`SYSTEM_PROMPT`), the loss
covers the completion's tokens and ``<|im_end|>``. :func:`warm_start` caches it under
``<cache>/tiny-bpe/<key>/`` with ``mixrl_tiny_bpe.json``, copying the weights shipped in the package
(:mod:`mixrl.models.shipped`) when they were built with this recipe; ``python -m mixrl.models.tiny_bpe --force``
(or ``mixrl model build-tiny --bpe --force``) builds it; ``python -m mixrl.evaluation.builtin_models PATH --n 256``
measures its held-out greedy accuracy.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from mixrl.models import shipped, supervised, tiny_arch, tiny_spec
from mixrl.tasks import arith

#: Bump on any change to the tokenizer, model or warm-start recipe (it is part of the cache key).
BPE_VERSION = "1"

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
    from transformers.convert_slow_tokenizer import bytes_to_unicode  # deferred: transformers, 1 s; config show/plan import this module
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer  # deferred: transformers, 1 s; config show/plan import this module

    bytes_only = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *dict.fromkeys(bytes_to_unicode().values())])}
    base = Qwen2Tokenizer(vocab=bytes_only, merges=[], unk_token=None, bos_token=None, eos_token=IM_END, pad_token=PAD,
                          additional_special_tokens=[IM_START])
    tok = base.train_new_from_iterator(list(texts if texts is not None else training_texts()), vocab_size=vocab_size,
                                       new_special_tokens=list(SPECIAL_TOKENS))
    tok.chat_template = CHAT_TEMPLATE
    tok.padding_side = "left"
    tok.truncation_side = "left"
    return tok


# --------------------------------------------------------------------------- model + warm start

#: The character model's architecture with room for the chat turns (a prompt is ~30-40 tokens).
MODEL_SIZE: dict[str, Any] = {**tiny_spec.MODEL_SIZE, "max_position_embeddings": 128}
#: The character model's warm-start recipe (careless-demonstrator mixture, easy levels, 300 steps), with
#: 45% careless targets instead of 60%. Greedy decoding follows the majority habit, so the fraction sets
#: the starting accuracy; measured held-out greedy accuracy on levels 1-4 (256 problems), 300 steps:
#: careless 0.6 -> 0.109, 0.5 -> 0.137, 0.45 -> 0.199 (the character model's level), 0.4 -> 0.367;
#: 450 steps at 0.6 -> 0.117 (a closer imitation of the mixture, not a better model).
WARM_START: dict[str, Any] = {**tiny_spec.WARM_START, "careless_fraction": 0.45}
#: The BPE teacher (``builtin:tiny-bpe-teacher``, what ``teacher=tiny`` gives a ``model=tiny-bpe``
#: student): this model warm-started as the character teacher is (:data:`mixrl.models.tiny_spec.TEACHER_WARM_START`:
#: expert solutions only, every level, 600 steps). Cached under ``<cache>/tiny-bpe-teacher/<key>/``.
TEACHER_WARM_START: dict[str, Any] = {**WARM_START, "steps": 600, "levels": list(arith.LEVELS), "careless_fraction": 0.0}
ROLES = ("student", "teacher")
#: The merges' corpus (:func:`training_texts`): number of problems and seed.
CORPUS: dict[str, Any] = {"n": 2000, "seed": 0}
#: Generation budget: every ``arith`` completion plus ``<|im_end|>`` (a token spans at least one character).
MAX_COMPLETION_TOKENS = tiny_spec.MAX_COMPLETION_TOKENS
#: Longest chat-formatted prompt of any level, in tokens (40 measured for level 6; checked by the tests).
MAX_PROMPT_TOKENS = 48

BUILTIN = "builtin:tiny-bpe"
BUILTIN_TEACHER = "builtin:tiny-bpe-teacher"
_META_FILE = "mixrl_tiny_bpe.json"


def chat_messages(prompt: str, system: str = SYSTEM_PROMPT) -> list[dict[str, str]]:
    """The conversational prompt of one problem (what ``mixrl train`` gives TRL for this model)."""
    return [{"role": "system", "content": system}, {"role": "user", "content": prompt}]


def encode_chat(tokenizer: Any, problem: dict[str, Any], completion: str) -> tuple[list[int], list[int]]:
    """One warm-start example: the chat template's prompt (ending ``<|im_start|>assistant\\n``)
    and ``completion <|im_end|>``, tokenized apart, as TRL tokenizes a prompt and samples a completion."""
    prompt_ids = tokenizer(chat_text(problem["prompt"]), add_special_tokens=False)["input_ids"]
    return prompt_ids, tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def recipe(steps: int | None = None, role: str = "student") -> dict[str, Any]:
    """Everything the warm-started weights depend on (hashed into the cache key). ``role``:
    ``student`` (the model) or ``teacher`` (:data:`TEACHER_WARM_START`)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    ws = dict(WARM_START if role == "student" else TEACHER_WARM_START)
    if steps is not None:
        ws["steps"] = int(steps)
    rec = {
        "tiny_bpe_version": BPE_VERSION,
        "task": arith.NAME,
        "task_version": arith.TASK_VERSION,
        "tokenizer": {"vocab_size": VOCAB_SIZE, "corpus": dict(CORPUS), "special_tokens": list(SPECIAL_TOKENS),
                      "system_prompt": SYSTEM_PROMPT, "chat_template": CHAT_TEMPLATE},
        "model": dict(MODEL_SIZE),
        "warm_start": ws,
    }
    if role != "student":  # the student's key stays what it was
        rec["role"] = role
    return rec


def cache_key(steps: int | None = None, role: str = "student") -> str:
    digest = hashlib.sha256(json.dumps(recipe(steps, role), sort_keys=True).encode()).hexdigest()[:12]
    return f"v{BPE_VERSION}-{digest}"


def default_path(cache_dir: Path | str | None = None, *, steps: int | None = None, role: str = "student") -> Path:
    """Where :func:`warm_start` saves (``cache_dir`` defaults to ``cache_root()/"tiny-bpe"``, or
    ``cache_root()/"tiny-bpe-teacher"`` for the teacher)."""
    folder = "tiny-bpe" if role == "student" else f"tiny-bpe-{role}"
    base = Path(cache_dir).expanduser() if cache_dir is not None else tiny_spec.cache_root() / folder
    return base / cache_key(steps, role)


def is_tiny_bpe(path: Path | str) -> bool:
    """Whether ``path`` is this model: ``builtin:tiny-bpe`` or a folder written by :func:`warm_start`."""
    return str(path) == BUILTIN or (Path(str(path)).expanduser() / _META_FILE).is_file()


def mark_derived(folder: Path | str, base: Path | str) -> None:
    """Mark ``folder`` (a run's saved ``model/``, trained from ``base``) as this model, so that
    :func:`is_tiny_bpe` knows it: a later stage or ``mixrl eval`` then gives it chat prompts too."""
    (Path(folder) / _META_FILE).write_text(json.dumps({"derived_from": str(base), "system_prompt": SYSTEM_PROMPT}, indent=2) + "\n")


def is_complete(path: Path) -> bool:
    return (path / _META_FILE).is_file() and (path / "config.json").is_file()


def build(**size: Any):
    """``(model, tokenizer)``: a fresh tokenizer (:func:`build_tokenizer`) and a freshly initialised
    ``Qwen2ForCausalLM`` over it (``size`` overrides keys of :data:`MODEL_SIZE`)."""
    tokenizer = build_tokenizer(training_texts(**CORPUS))
    model = tiny_arch.build_model(tokenizer, base=MODEL_SIZE, max_new_tokens=MAX_COMPLETION_TOKENS, **size)
    tokenizer.model_max_length = model.config.max_position_embeddings
    return model, tokenizer


#: CPU-seconds of a build at the full recipe on one idle core, for the build's note: the student 86-93 s
#: measured (300 steps); the teacher estimated (600 steps on every level: issue 51's whole first KDRL run,
#: student and teacher, took 315 s on 2 quiet cores). A busy machine takes several times longer.
BUILD_SECONDS = {"student": 90, "teacher": 220}


def warm_start(cache_dir: Path | str | None = None, *, force: bool = False, progress: bool = True,
               steps: int | None = None, role: str = "student", use_shipped: bool = True, why: str | None = None) -> Path:
    """Path of the warm-started BPE model (model + tokenizer, ``save_pretrained`` format).

    Unless a complete copy is already cached: installs the copy shipped in the package when it was
    built with this recipe (:mod:`mixrl.models.shipped`; ``use_shipped=False`` never does), else learns
    the merges and trains (deterministically, on one CPU thread; see docs/how-to/data.md for the
    time); ``force`` retrains. ``cache_dir`` replaces ``cache_root()/"tiny-bpe"``; ``steps``
    overrides the number of optimizer steps (and is part of the cache key), e.g. for tests;
    ``role="teacher"``: the BPE teacher (:data:`TEACHER_WARM_START`, :func:`teacher_warm_start`).
    ``why``: what needs it, for the note printed before a build.
    """
    final = default_path(cache_dir, steps=steps, role=role)
    if is_complete(final) and not force:
        return final
    name = "tiny-bpe" if role == "student" else f"tiny-bpe-{role}"
    if use_shipped and not force and shipped.install(name, final, meta_file=_META_FILE):
        return final
    rec = recipe(steps, role)
    what = "the BPE teacher (builtin:tiny-bpe-teacher)" if role != "student" else "the BPE chat model (builtin:tiny-bpe)"
    seconds = BUILD_SECONDS[role] * rec["warm_start"]["steps"] / (TEACHER_WARM_START if role != "student" else WARM_START)["steps"]
    supervised.announce_build(what, why, seconds, final, progress=progress)
    description = "building the BPE teacher" if role != "student" else "building the BPE chat model"
    return supervised.train_and_save(final, rec, build, encode=encode_chat, meta_file=_META_FILE,
                                     progress=progress, description=description,
                                     extra_meta=lambda model, tok: {"vocab": len(tok)})


def teacher_warm_start(cache_dir: Path | str | None = None, *, force: bool = False, progress: bool = True,
                       steps: int | None = None, use_shipped: bool = True, why: str | None = None) -> Path:
    """Path of the BPE teacher (``builtin:tiny-bpe-teacher``): :func:`warm_start` with
    :data:`TEACHER_WARM_START` (expert solutions only, every level, longer), cached (or shipped) the same way."""
    return warm_start(cache_dir, force=force, progress=progress, steps=steps, role="teacher", use_shipped=use_shipped, why=why)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mixrl.models.tiny_bpe", description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="retrain even if a cached copy exists")
    ap.add_argument("--cache-dir", type=Path, default=None, help="directory to hold <key>/")
    ap.add_argument("--steps", type=int, default=None, help="override the number of warm-start steps")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--teacher", action="store_true", help="build the BPE teacher (builtin:tiny-bpe-teacher) instead")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path = warm_start(args.cache_dir, force=args.force, progress=not args.no_progress, steps=args.steps,
                      role="teacher" if args.teacher else "student")
    print(path)
    meta = json.loads((path / _META_FILE).read_text())
    print(f"{meta['num_parameters']:,} parameters, {meta['vocab']} tokens; warm start: {meta['warm_start']['steps']} steps, "
          f"final loss {meta['final_loss']:.3f}, {meta['train_seconds']:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
