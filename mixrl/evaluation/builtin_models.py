"""Held-out accuracy of the built-in BPE models (:mod:`mixrl.models.tiny_bpe`, :mod:`mixrl.models.tiny_bpe_tools`)::

    python -m mixrl.evaluation.builtin_models MODEL_DIR --n 256            # greedy accuracy per level
    python -m mixrl.evaluation.builtin_models MODEL_DIR --n 256 --tools    # the tool model's tool-call accuracy

The measurement reads a built model folder; building it is :mod:`mixrl.models`' job, and the
command that builds the shipped weights and records these numbers in their manifest is
:mod:`mixrl.cli.ship_models` (it sits above both). Evaluation imports models, never the reverse.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from mixrl.evaluation.greedy import accuracy_by_level
from mixrl.models import tiny_bpe, tiny_bpe_tools
from mixrl.tasks import arith, arith_tools


def heldout_accuracy(path: Path | str, n: int = 256, levels: Sequence[int] = tuple(arith.DEFAULT_LEVELS),
                     batch_size: int = 128) -> dict[str, float]:
    """Greedy accuracy of the BPE chat model at ``path`` on ``n`` held-out problems, chat-formatted as
    in training: ``{"all": acc, "level_1": acc, ...}``."""
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    problems = [{**p, "prompt": tiny_bpe.chat_text(p["prompt"])} for p in arith.heldout_split(n, levels=list(levels))]
    with torch.random.fork_rng(devices=[]):
        return accuracy_by_level(model, tok, problems, arith.verify, max_new_tokens=tiny_bpe.MAX_COMPLETION_TOKENS,
                                 batch_size=batch_size)


def tool_call_accuracy(path: Path | str, n: int) -> float:
    """The tool model's tool-call accuracy (:func:`mixrl.models.tiny_bpe_tools.call_accuracy`) on ``n``
    held-out problems of its warm start's levels."""
    tok = tiny_bpe_tools.set_templates(AutoTokenizer.from_pretrained(path))
    model = AutoModelForCausalLM.from_pretrained(path)
    return tiny_bpe_tools.call_accuracy(model, tok, arith_tools.heldout_split(n, levels=tiny_bpe_tools.WARM_START["levels"]))


def builtin_accuracy(name: str, path: Path | str, n: int) -> float:
    """The number a shipped built-in model is measured by: tool-call accuracy for ``tiny-bpe-tools``,
    greedy accuracy over levels 1-4 for the others."""
    if name == "tiny-bpe-tools":
        return tool_call_accuracy(path, n)
    return heldout_accuracy(path, n)["all"]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mixrl.evaluation.builtin_models", description=__doc__.splitlines()[0])
    ap.add_argument("path", type=Path, help="a built model folder (e.g. the path `python -m mixrl.models.tiny_bpe` prints)")
    ap.add_argument("--n", type=int, default=256, metavar="N", help="held-out problems (default: %(default)s)")
    ap.add_argument("--tools", action="store_true", help="the tool model (builtin:tiny-bpe-tools): tool-call accuracy")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.tools:
        print(f"held-out tool-call accuracy: {tool_call_accuracy(args.path, args.n):.3f}", file=sys.stderr)
        return 0
    acc = heldout_accuracy(args.path, args.n)
    print("held-out greedy accuracy: " + ", ".join(f"{k} {v:.3f}" for k, v in acc.items()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
