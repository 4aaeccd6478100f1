"""The built-in tiny reward model (``builtin:tiny-rm``): a ``Qwen2ForSequenceClassification`` with one
output over the tiny model's character tokenizer, trained here as a classifier of right and wrong
``arith`` completions, so that ``reward=model`` runs and is tested on a CPU with no download.

Data (deterministic in the seed): for each training-split problem one completion, right with
probability 1/2 (the expert worked solution) and otherwise wrong, drawn from three kinds of wrong
completion the warm-started policy also writes: the careless demonstrator's (the last term forgotten,
:func:`mixrl.tasks.arith.careless_solution`), the worked solution with its final answer off by 1-3,
and the worked solution with one intermediate sum off by 1-3 and carried to the end. The label is
the exact verifier's (:func:`mixrl.tasks.arith.verify`); the input is ``<s> prompt completion``.

Training: binary cross-entropy on the scalar logit (Bradley-Terry's pointwise form), AdamW, one CPU
thread, seeded: the same weights on every machine, built in seconds and cached under
``<cache>/tiny-rm/<key>/`` like the tiny policy (:mod:`mixrl.models.tiny_spec`). Its held-out
accuracy as a classifier (logit > 0 against the verifier, on held-out problems drawn the same way)
is measured after training, stored in ``mixrl_tiny.json`` and printed by ``python -m mixrl.models.tiny_rm``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mixrl.models.atomic import publishing
from mixrl.models.tiny_arch import build_tokenizer
from mixrl.models.tiny_spec import _META_FILE, cache_root, is_complete
from mixrl.tasks import arith

RM_VERSION = "1"
#: architecture (smaller than the policy: a classifier of short sums needs less)
RM_SIZE: dict[str, Any] = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
                           "intermediate_size": 128, "max_position_embeddings": 64, "initializer_range": 0.08}
#: training recipe (part of the cache key)
RM_TRAIN: dict[str, Any] = {"steps": 300, "batch_size": 64, "lr": 3e-3, "seed": 0, "levels": list(arith.LEVELS[:4]),
                            "heldout_size": 512}


def recipe(steps: int | None = None) -> dict[str, Any]:
    train = dict(RM_TRAIN)
    if steps is not None:
        train["steps"] = int(steps)
    return {"rm_version": RM_VERSION, "task": arith.NAME, "task_version": arith.TASK_VERSION, "alphabet": arith.ALPHABET,
            "model": dict(RM_SIZE), "train": train}


def default_path(cache_dir: Path | str | None = None, *, steps: int | None = None) -> Path:
    rec = recipe(steps)
    key = f"v{RM_VERSION}-" + hashlib.sha256(json.dumps(rec, sort_keys=True).encode()).hexdigest()[:12]
    return (Path(cache_dir).expanduser() if cache_dir is not None else cache_root() / "tiny-rm") / key


def wrong_completion(problem: dict[str, Any], rng: random.Random) -> str:
    """One wrong completion of ``problem`` (see the module docstring for the three kinds)."""
    terms = [int(t) for t in problem["prompt"].rstrip("=").split("+")]
    kind = rng.randrange(3)
    if kind == 0:
        return arith.careless_solution(problem)
    delta = rng.choice([-3, -2, -1, 1, 2, 3])
    sums, total = [], terms[0]
    for t in terms[1:]:
        total += t
        sums.append(total)
    if kind == 1 or len(sums) == 1:
        answer = sums[-1] + delta if sums[-1] + delta >= 0 else sums[-1] + abs(delta)
        return " ".join(str(s) for s in sums) + f" {arith.ANSWER_MARKER} {answer}"
    at = rng.randrange(len(sums) - 1)  # an intermediate sum goes wrong and the error is carried on
    shift = delta if sums[at] + delta >= 0 else abs(delta)
    bad = [s + shift if i >= at else s for i, s in enumerate(sums)]
    return " ".join(str(s) for s in bad) + f" {arith.ANSWER_MARKER} {bad[-1]}"


def examples(n: int, *, seed: int, split: str, levels: Sequence[int]) -> tuple[list[str], list[float]]:
    """``n`` (text, label) pairs: ``prompt + completion`` and 1.0 if the verifier accepts it."""
    problems = arith.generate(n, seed=seed, levels=levels, split=split)
    rng = random.Random(f"tiny-rm-{seed}-{split}")
    texts, labels = [], []
    for p in problems:
        completion = p["solution"] if rng.random() < 0.5 else wrong_completion(p, rng)
        texts.append(p["prompt"] + completion)
        labels.append(1.0 if arith.verify(completion, p["answer"]) else 0.0)
    return texts, labels


def build(tokenizer: Any):
    """A freshly initialised one-output ``Qwen2ForSequenceClassification`` over ``tokenizer``."""
    from transformers import Qwen2Config, Qwen2ForSequenceClassification  # deferred: transformers, 1 s; plan imports this module

    config = Qwen2Config(vocab_size=len(tokenizer), num_labels=1, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
                         **{k: v for k, v in RM_SIZE.items()})
    return Qwen2ForSequenceClassification(config)


def score_texts(model: Any, tokenizer: Any, texts: Sequence[str], batch_size: int = 256):
    """The model's scalar logit for each text (a float tensor [n]), without gradients."""
    import torch  # deferred: plan imports this module

    out = []
    with torch.no_grad():
        for i in range(0, len(texts), batch_size):
            enc = tokenizer(list(texts[i:i + batch_size]), return_tensors="pt", padding=True)
            enc = {k: v.to(model.device) for k, v in enc.items()}
            out.append(model(**enc).logits[:, 0].float().cpu())
    return torch.cat(out) if out else torch.zeros(0)


def accuracy(model: Any, tokenizer: Any, texts: Sequence[str], labels: Sequence[float]) -> float:
    """The fraction of ``texts`` whose logit sign (> 0: right) agrees with ``labels``."""
    logits = score_texts(model, tokenizer, texts)
    return float(sum(int((x > 0) == (y > 0.5)) for x, y in zip(logits.tolist(), labels)) / max(len(labels), 1))


def train(steps: int | None = None, *, progress: bool = False):
    """``(model, tokenizer, meta)``: the reward model trained by :data:`RM_TRAIN` (deterministic, one thread)."""
    import torch  # deferred: plan imports this module

    rec = recipe(steps)
    tr = rec["train"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    t0 = time.time()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(tr["seed"])
            tokenizer = build_tokenizer()
            model = build(tokenizer)
            texts, labels = examples(tr["steps"] * tr["batch_size"], seed=tr["seed"], split="train", levels=tr["levels"])
            opt = torch.optim.AdamW(model.parameters(), lr=tr["lr"], weight_decay=0.0)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.1, 1 - s / tr["steps"]))
            model.train()
            losses = []
            for step in range(tr["steps"]):
                sl = slice(step * tr["batch_size"], (step + 1) * tr["batch_size"])
                enc = tokenizer(texts[sl], return_tensors="pt", padding=True)
                logits = model(**enc).logits[:, 0]
                loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.tensor(labels[sl]))
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                losses.append(loss.item())
                if progress and step % 50 == 0:
                    print(f"tiny-rm step {step}/{tr['steps']} loss {sum(losses[-20:]) / len(losses[-20:]):.3f}", file=sys.stderr)
            model.eval()
            held_texts, held_labels = examples(tr["heldout_size"], seed=tr["seed"], split="heldout", levels=tr["levels"])
            acc = accuracy(model, tokenizer, held_texts, held_labels)
    finally:
        torch.set_num_threads(threads)
    meta = {**rec, "final_loss": sum(losses[-20:]) / max(len(losses[-20:]), 1), "heldout_accuracy": acc,
            "heldout_positive_fraction": sum(held_labels) / len(held_labels), "train_seconds": round(time.time() - t0, 2),
            "num_parameters": sum(p.numel() for p in model.parameters())}
    return model, tokenizer, meta


def build_tiny_rm(cache_dir: Path | str | None = None, *, force: bool = False, progress: bool = False,
                  steps: int | None = None) -> Path:
    """The cached folder of ``builtin:tiny-rm`` (trained first when absent or ``force``)."""
    final = default_path(cache_dir, steps=steps)
    if is_complete(final) and not force:
        return final
    model, tokenizer, meta = train(steps, progress=progress)
    with publishing(final, complete=is_complete, replace=True) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _META_FILE).write_text(json.dumps({**meta, "key": final.name}, indent=2) + "\n")
    return final


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mixrl.models.tiny_rm", description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="retrain even if a cached copy exists")
    ap.add_argument("--cache-dir", type=Path, default=None)
    ap.add_argument("--steps", type=int, default=None, help="override the number of training steps")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path = build_tiny_rm(args.cache_dir, force=args.force, progress=True, steps=args.steps)
    meta = json.loads((path / _META_FILE).read_text())
    print(path)
    print(f"{meta['num_parameters']:,} parameters; {meta['train']['steps']} steps in {meta['train_seconds']:.1f}s, final loss "
          f"{meta['final_loss']:.3f}; held-out accuracy as a classifier {meta['heldout_accuracy']:.3f} "
          f"({meta['train']['heldout_size']} held-out completions, {meta['heldout_positive_fraction']:.0%} right)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
