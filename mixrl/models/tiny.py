"""A tiny character-level Qwen2 model, warm-started on the easy ``arith`` levels.

``mixrl train`` with no arguments trains this model, so a first run works offline
on a laptop CPU in a few minutes:

* :func:`mixrl.models.tiny_arch.build_tokenizer` - a character-level tokenizer over the task alphabet plus
  ``<pad>``, ``<s>`` (bos, prepended when encoding), ``</s>`` (eos, ends completions)
  and ``<unk>``; pads on the left. :mod:`mixrl.models.tiny_vocab` extends a saved tiny
  model to the characters of other data.
* :func:`mixrl.models.tiny_arch.build_model` - a small ``Qwen2ForCausalLM`` (~0.66M parameters by default).
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

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from mixrl.models.supervised import announce_build, train_and_save
from mixrl.models.tiny_arch import build_model, build_tokenizer
from mixrl.models.tiny_spec import _META_FILE, default_path, is_complete, recipe


def warm_start(
    cache_dir: Path | str | None = None,
    *,
    force: bool = False,
    progress: bool = True,
    steps: int | None = None,
    role: str = "student",
    why: str | None = None,
) -> Path:
    """Path of the warm-started tiny model (model + tokenizer, ``save_pretrained`` format).

    Trains it (deterministically, on one CPU thread, ~25-60 s) unless a
    complete copy is already cached; ``force`` retrains. ``cache_dir`` replaces
    ``cache_root()/"tiny"``; ``steps`` overrides the number of optimizer steps (and
    is part of the cache key), e.g. for tests. ``role="teacher"`` builds the built-in teacher
    (:func:`teacher_warm_start`). ``why``: what needs it, for the note printed before a build.
    """
    final = default_path(cache_dir, steps=steps, role=role)
    if is_complete(final) and not force:
        return final

    def build():
        tokenizer = build_tokenizer()
        return build_model(tokenizer), tokenizer

    rec = recipe(steps, role)
    what = "the character-level teacher (builtin:tiny-teacher)" if role != "student" else "the character-level tiny model (builtin:tiny)"
    announce_build(what, why, BUILD_SECONDS_PER_STEP * rec["warm_start"]["steps"], final, progress=progress)
    description = f"building the tiny {role}" if role != "student" else "building the tiny model"
    return train_and_save(final, rec, build, progress=progress, description=description)


#: CPU-seconds per warm-start step on one idle core (300 steps in ~25-60 s), for the build's note.
BUILD_SECONDS_PER_STEP = 0.15


def teacher_warm_start(cache_dir: Path | str | None = None, *, force: bool = False, progress: bool = True,
                       steps: int | None = None, why: str | None = None) -> Path:
    """Path of the built-in teacher (``builtin:tiny-teacher``): :func:`warm_start` with
    :data:`TEACHER_WARM_START` (expert solutions only, every level, longer), cached the same way."""
    return warm_start(cache_dir, force=force, progress=progress, steps=steps, role="teacher", why=why)


def load(path: Path | str | None = None):
    """``(model, tokenizer)`` from ``path`` (default: :func:`warm_start`, training it if needed)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # deferred: transformers, 1 s; config show/plan import this module

    path = Path(path) if path is not None else warm_start()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    return model, tokenizer


def main(argv: Sequence[str] | None = None) -> int:
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
