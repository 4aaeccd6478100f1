"""The tiny character model warm-started on a user's own rows (``mixrl model build-tiny data.source=DIR``).

The default tiny model (:mod:`mixrl.models.tiny`) is warm-started on arithmetic; on another task it
starts from nothing the task needs, and RL from a policy that never produces a right answer has no
signal (every group's rewards are equal). This module builds the same architecture over a vocabulary
of the task's own characters and warm-starts it, with the same deterministic supervised loop
(:func:`mixrl.models.supervised.train_and_save`), on the training rows it is given:

* each row's target is its first expert completion (the ``expert`` column) if it has one, else its
  answer; ``prompt -> target </s>``, the loss on the target only;
* rows with neither are learned as a language model: ``<s> prompt </s>``, the loss on the prompt;
* the vocabulary is the arithmetic alphabet plus every character of these rows (so a model built
  on one task still encodes digits), one id per UTF-8 byte as in :mod:`mixrl.models.tiny_arch`;
* the context length grows (in steps of 64) when a row does not fit in 64 tokens, with room for
  ``max_completion_length`` generated tokens, up to :data:`MAX_POSITIONS` (512): a longer row is
  refused in one line naming it (the attention of a batch grows with the square of the length).

The caller passes the training rows only (``mixrl model build-tiny`` applies the held-out rule of
:mod:`mixrl.evaluation.heldout` first, as ``mixrl train`` does), so held-out rows never reach the
warm start. The result is cached under ``<cache>/tiny-data/<key>/``, ``key`` a hash of the rows,
the recipe and the architecture; it carries ``mixrl_tiny.json``, so ``mixrl train`` treats it as a
tiny model (a held-out character it lacks is added by :mod:`mixrl.models.tiny_vocab`).
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import torch

from mixrl.errors import DataError
from mixrl.models.supervised import _batch, train_and_save
from mixrl.models.tiny_arch import build_model, build_tokenizer
from mixrl.models.tiny_spec import _META_FILE as META_FILE
from mixrl.models.tiny_spec import MODEL_SIZE, TINY_VERSION, WARM_START, cache_root, is_complete
from mixrl.tasks import arith

#: Bump on any change to how rows become examples (part of the cache key).
DATA_WARM_START_VERSION = "2"  # 2: stops at a target training accuracy

#: The recipe on a user's rows: the default warm start's optimiser, no careless demonstrator.
DATA_WARM_START: dict[str, Any] = {
    "steps": 400,
    "batch_size": 32,
    "lr": WARM_START["lr"],
    "warmup_steps": WARM_START["warmup_steps"],
    "weight_decay": WARM_START["weight_decay"],
    "seed": 0,
    # stop once this fraction of the training rows is answered exactly (greedy), checked every
    # ACCURACY_EVERY steps on ACCURACY_ROWS of them: a warm start that fits every row (400 steps on
    # examples/caesar reach 1.0) leaves GRPO groups whose rewards are all equal, so RL learns nothing
    "target_accuracy": 0.5,
}

#: How often (steps) and on how many training rows (a fixed, seeded sample) the warm start
#: measures its training accuracy against ``target_accuracy``.
ACCURACY_EVERY = 10
ACCURACY_ROWS = 128


def examples_from_rows(rows: list[dict[str, Any]]) -> tuple[list[dict[str, str]], list[str], str]:
    """``(problems, completions, target)``: one warm-start example per row and what its target is
    (``expert``, ``answer`` or ``prompt``: the rows as a language model). Plain-text prompts only."""
    if not rows:
        raise DataError("no training rows to warm-start on; point data.source at a file with rows")
    bad = next((i for i, r in enumerate(rows) if not isinstance(r.get("prompt"), str)), None)
    if bad is not None:
        raise DataError(f"training row {bad}: the tiny character model takes plain-text prompts, not chat messages; "
                        "give a text prompt column (data.prompt_column)")
    if all(r.get("expert") for r in rows):
        return [{"prompt": r["prompt"]} for r in rows], [str(r["expert"][0]) for r in rows], "expert"
    if all(r.get("answer") not in (None, "") for r in rows):
        return [{"prompt": r["prompt"]} for r in rows], [str(r["answer"]) for r in rows], "answer"
    return [{"prompt": ""} for _ in rows], [r["prompt"] for r in rows], "prompt"


#: The longest example the tiny model is warm-started on, in tokens (one per UTF-8 byte): prompt,
#: target and the room for generation. Its batch's attention grows with the square of it (32 rows
#: x 4 heads x 512^2 x 4 bytes = 128 MB a layer); a 200,000-character row would ask for 40 GB.
MAX_POSITIONS = 512


def check_lengths(problems: list[dict[str, str]], completions: list[str], max_completion_length: int) -> None:
    """DataError (one line naming the row, the limit and the fix) for an example longer than
    :data:`MAX_POSITIONS` tokens: ``<s> prompt`` plus the longer of ``target </s>`` and
    ``max_completion_length`` generated tokens."""
    for i, (p, c) in enumerate(zip(problems, completions)):
        prompt, target = len(p["prompt"].encode()) + 1, len(c.encode()) + 1
        if prompt + max(target, int(max_completion_length)) <= MAX_POSITIONS:
            continue
        text = p["prompt"] or c
        shown = json.dumps(text[:30] + ("…" if len(text) > 30 else ""), ensure_ascii=False)
        if prompt + target <= MAX_POSITIONS:
            raise DataError(f"training row {i} ({shown}): its prompt ({prompt} tokens) with trainer.max_completion_length="
                            f"{max_completion_length} exceeds the tiny model's {MAX_POSITIONS} positions; "
                            f"lower trainer.max_completion_length to {MAX_POSITIONS - prompt} or less")
        raise DataError(f"training row {i} ({shown}) is {prompt + target} tokens long (one per UTF-8 byte of prompt and target), "
                        f"beyond the {MAX_POSITIONS} the tiny character model takes; shorten or drop that row "
                        "(or train a real model: model.path=<a Hugging Face model>)")


def _context(problems: list[dict[str, str]], completions: list[str], max_completion_length: int) -> tuple[int, int]:
    """``(max_position_embeddings, max_new_tokens)`` that fit every example plus generation
    (at most :data:`MAX_POSITIONS`: a longer example is refused by :func:`check_lengths`)."""
    check_lengths(problems, completions, max_completion_length)
    longest_prompt = max(len(p["prompt"].encode()) for p in problems) + 1  # <s>
    longest_completion = max(len(c.encode()) for c in completions) + 1  # </s>
    need = max(longest_prompt + longest_completion, longest_prompt + int(max_completion_length))
    positions = max(MODEL_SIZE["max_position_embeddings"], -(-need // 64) * 64)
    return positions, longest_completion


def recipe(problems: list[dict[str, str]], completions: list[str], target: str, *, steps: int | None = None,
           max_completion_length: int = 32, source: str = "", target_accuracy: float | None = None) -> dict[str, Any]:
    """Everything the weights depend on (hashed into the cache key), plus where the rows came from."""
    ws = dict(DATA_WARM_START)
    if steps is not None:
        ws["steps"] = int(steps)
    if target_accuracy is not None:
        ws["target_accuracy"] = float(target_accuracy)
    chars = sorted({ch for p, c in zip(problems, completions) for ch in p["prompt"] + c} - set(arith.ALPHABET))
    positions, new_tokens = _context(problems, completions, max_completion_length)
    digest = hashlib.sha256(json.dumps([[p["prompt"], c] for p, c in zip(problems, completions)]).encode()).hexdigest()
    return {
        "tiny_version": TINY_VERSION,
        "task": "data",
        "data_warm_start_version": DATA_WARM_START_VERSION,
        "alphabet": arith.ALPHABET + "".join(chars),
        "model": {**MODEL_SIZE, "max_position_embeddings": positions},
        "max_new_tokens": new_tokens,
        "warm_start": ws,
        "data": {"source": source, "rows": len(problems), "target": target, "sha256": digest},
    }


def cache_path(rec: dict[str, Any], cache_dir: Path | str | None = None) -> Path:
    """``<cache_dir or cache_root()/tiny-data>/v<version>-<hash of rec>`` (the source's name is not hashed)."""
    keyed = {**rec, "data": {k: v for k, v in rec["data"].items() if k != "source"}}
    digest = hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:12]
    base = Path(cache_dir).expanduser() if cache_dir is not None else cache_root() / "tiny-data"
    return base / f"v{TINY_VERSION}-{digest}"


def exact_match_accuracy(model: Any, tokenizer: Any, problems: list[dict[str, str]], completions: list[str]) -> float:
    """Fraction of ``prompt -> completion </s>`` examples whose every target token is the model's
    argmax given the tokens before it (teacher forcing).

    Formula: ``acc = (1/N) sum_i 1[ argmax_v p(v | x_i, y_i,<t) = y_i,t for every t of y_i </s> ]``;
    all target tokens being the argmax is the same event as greedy decoding writing ``y_i </s>``
    exactly, so this is the training rows' exact-match reward under greedy decoding, in one forward."""
    ids, mask, lab = _batch(tokenizer, problems, completions)
    with torch.no_grad():
        was_training = model.training
        model.eval()
        pred = model(input_ids=ids, attention_mask=mask).logits[:, :-1].argmax(-1)
        model.train(was_training)
    target, scored = lab[:, 1:], lab[:, 1:] != -100
    right = ((pred == target) | ~scored).all(dim=1)
    return float(right.float().mean())


def accuracy_sample(problems: list[dict[str, str]], completions: list[str]) -> tuple[list, list]:
    """The fixed sample (seeded, :data:`ACCURACY_ROWS` rows at most) of training examples that the
    warm start measures its training accuracy on."""
    picked = sorted(random.Random("warm-start-accuracy").sample(range(len(problems)), min(ACCURACY_ROWS, len(problems))))
    return [problems[i] for i in picked], [completions[i] for i in picked]


def warm_start_on_rows(rows: list[dict[str, Any]], *, source: str = "", steps: int | None = None,
                       max_completion_length: int = 32, cache_dir: Path | str | None = None, force: bool = False,
                       progress: bool = True, target_accuracy: float | None = None) -> tuple[Path, bool]:
    """``(path, built)``: the tiny model warm-started on ``rows`` (training rows only), cached by a
    hash of the rows and the recipe; ``built`` is False when a complete cached copy was reused.
    The warm start runs at most ``steps`` steps and stops earlier once its training accuracy
    (:func:`exact_match_accuracy`) reaches ``target_accuracy`` (default
    ``DATA_WARM_START["target_accuracy"]``; 1 runs every step); the metadata records
    ``steps_run`` and ``training_accuracy`` (at the end, on the same sample)."""
    problems, completions, target = examples_from_rows(rows)
    rec = recipe(problems, completions, target, steps=steps, max_completion_length=max_completion_length, source=source,
                 target_accuracy=target_accuracy)
    final = cache_path(rec, cache_dir)
    if is_complete(final) and not force:
        return final, False

    made: dict[str, Any] = {}
    sample = accuracy_sample(problems, completions)
    goal = rec["warm_start"]["target_accuracy"]

    def build():
        tokenizer = build_tokenizer(rec["alphabet"])
        tokenizer.model_max_length = rec["model"]["max_position_embeddings"]
        made["tokenizer"] = tokenizer
        return build_model(tokenizer, max_new_tokens=rec["max_new_tokens"], **rec["model"]), tokenizer

    def stop(model: Any, step: int) -> bool:  # every ACCURACY_EVERY steps; a target >= 1 never stops early
        if goal >= 1 or step % ACCURACY_EVERY:
            return False
        return exact_match_accuracy(model, made["tokenizer"], *sample) >= goal

    def extra_meta(model: Any, tokenizer: Any) -> dict[str, Any]:
        return {"training_accuracy": round(exact_match_accuracy(model, tokenizer, *sample), 4), "accuracy_rows": len(sample[0])}

    path = train_and_save(final, rec, build, progress=progress, examples=(problems, completions),
                          description=f"warm-starting tiny model on {len(problems)} rows ({target})",
                          stop=stop, extra_meta=extra_meta)
    return path, True
