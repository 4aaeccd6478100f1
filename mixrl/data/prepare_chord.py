"""CHORD's OpenR1-Math data, as the authors prepare it (``mixrl data prepare chord-openr1``).

The authors' script (Trinity-RFT ``examples/mix_chord/get_openr1_data.py``, read at commit
9051d6374db5d4199dbe317d33eb1caa2e42a9fb of the yanxi-chen/Trinity-RFT mirror) turns
``open-r1/OpenR1-Math-220k`` (``default``, ``train``) into a disjoint SFT set and RL set:

1. *filter* (``process_dataset``, lines 61-100): drop a problem containing a CJK character
   (U+4E00-U+9FFF or U+3400-U+4DBF); keep a generation only if its ``correctness_math_verify``
   entry is true and it is at most 8196 tokens (``len(tokenizer.tokenize(g))``, the model's
   slow tokenizer, line 186); keep a problem with at least one kept generation, as
   ``{problem, answer, generations: kept}``, in dataset order;
2. *SFT* (``create_sft_dataset``, lines 103-121): ``random.sample(filtered, 5000)``, then one
   ``random.choice`` of each sampled problem's kept generations, in sample order, as
   ``[system, user, assistant]`` messages under their think-format system prompt;
3. *RL* (``create_rl_dataset``, lines 124-167, from ``main`` line 201): the filtered
   problems not sampled for SFT, whose answer ``int()`` accepts and that have at least two
   kept generations; ``random.sample(those, 20000)``; ``{problem, answer}`` in sample order.

All draws come from one generator seeded 42 (their module-level ``random.seed(42)``, line 32)
in that order, so with the same source rows, tokenizer and sizes this reproduces their files
row for row. (Their docstring warns that the paper's own run used no fixed seed: the paper's
selection is not recoverable.)
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from mixrl.errors import ConfigError, DataError

#: the system prompt of the authors' SFT messages (get_openr1_data.py:39, verbatim)
SFT_SYSTEM_PROMPT = (
    "You are a helpful assistant that solves MATH problems. You should first think about the reasoning process in "
    "mind and then provides the user with the answer. You should present your reasoning process using the format: "
    "<think>\n ...your reasoning process here... </think>\n first. You should always include your final answer in "
    "\\boxed{} as closed-form results."
)
#: the columns of OpenR1-Math the preparation reads
COLUMNS = ("problem", "answer", "generations", "correctness_math_verify")
#: what the command writes into --out (anything else there is refused)
OUTPUTS = ("rl", "sft", "manifest.json")
DEFAULTS = {"sft_size": 5000, "rl_size": 20000, "max_tokens": 8196, "seed": 42}


def contains_cjk(text: str) -> bool:
    """A CJK unified ideograph (U+4E00-U+9FFF) or extension A (U+3400-U+4DBF) in ``text``."""
    return any("\u4e00" <= ch <= "\u9fff" or "\u3400" <= ch <= "\u4dbf" for ch in text)


def int_answer(answer: Any) -> bool:
    """Does Python's ``int()`` accept the answer (their ``can_convert_to_int``)?"""
    try:
        int(answer)
        return True
    except (ValueError, TypeError):
        return False


def filter_rows(rows: Iterable[dict], count_tokens: Callable[[str], int], max_tokens: int) -> list[dict]:
    """Step 1: the problems with at least one verified generation of at most ``max_tokens`` tokens."""
    kept_rows = []
    for row in rows:
        if contains_cjk(row["problem"]):
            continue
        correct = row.get("correctness_math_verify") or []
        kept = [g for i, g in enumerate(row.get("generations") or [])
                if i < len(correct) and correct[i] and count_tokens(g) <= max_tokens]
        if kept:
            kept_rows.append({"problem": row["problem"], "answer": row["answer"], "generations": kept})
    return kept_rows


def _key(row: dict) -> tuple:
    # their `d not in sampled_for_sft` compares the dicts: equal problem, answer and generations
    return (row["problem"], row["answer"], tuple(row["generations"]))


def split_sft_rl(filtered: list[dict], *, sft_size: int, rl_size: int, seed: int) -> tuple[list[dict], list[dict]]:
    """Steps 2 and 3: the SFT rows ({problem, answer, response, messages}) and the RL rows
    ({problem, answer}), drawn as the authors' script draws them."""
    rng = random.Random(seed)
    sampled = rng.sample(filtered, min(sft_size, len(filtered)))
    sft = []
    for row in sampled:
        response = rng.choice(row["generations"])
        sft.append({"problem": row["problem"], "answer": row["answer"], "response": response,
                    "messages": [{"role": "system", "content": SFT_SYSTEM_PROMPT},
                                 {"role": "user", "content": row["problem"]},
                                 {"role": "assistant", "content": response}]})
    taken = {_key(r) for r in sampled}
    remaining = [r for r in filtered if _key(r) not in taken]
    eligible = [r for r in remaining if int_answer(r["answer"]) and len(r["generations"]) >= 2]
    rl = [{"problem": r["problem"], "answer": r["answer"]} for r in rng.sample(eligible, min(rl_size, len(eligible)))]
    return sft, rl


def check_out_dir(out: Path) -> None:
    """Refuse an ``--out`` that is a file, or a folder holding anything this command does not write."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a folder (new, or one this command wrote)")
    if out.is_dir():
        foreign = sorted(p.name for p in out.iterdir() if p.name not in OUTPUTS)
        if foreign:
            raise ConfigError(f"--out {out} holds files this command did not write ({', '.join(foreign[:3])}"
                              f"{', ...' if len(foreign) > 3 else ''}); give an empty or new folder")


def read_source(source: str, *, split: str = "train", subset: str | None = "default") -> list[dict]:
    """The source's rows, in order, with the columns the preparation reads (a one-line
    :class:`DataError` for a missing file or column)."""
    import datasets  # deferred: datasets, 1 s

    from mixrl.data.reading import _load_raw  # deferred: datasets, 1 s

    datasets.disable_progress_bars()  # the command prints its own summary; errors stay one line
    ds, where = _load_raw(source, split=split, subset=subset, config_prefix="--source")
    missing = [c for c in COLUMNS if c not in ds.column_names]
    if missing:
        raise DataError(f"{where} lacks the OpenR1-Math column(s) {', '.join(missing)} (it has: "
                        f"{', '.join(ds.column_names) or 'none'}); point --source at OpenR1-Math-220k (default, train) "
                        "or a file in its schema")
    return ds.select_columns(list(COLUMNS)).to_list()


def token_counter(tokenizer: str) -> tuple[Callable[[str], int], str]:
    """``len(tokenizer.tokenize(text))`` with the slow tokenizer, as the authors load it
    (``use_fast=False``); the fast one where a slow one cannot be built (same tokens for Qwen2)."""
    from transformers import AutoTokenizer  # deferred: transformers, 2 s

    try:
        tok, kind = AutoTokenizer.from_pretrained(tokenizer, use_fast=False), "slow"
    except Exception:  # noqa: BLE001 - no slow tokenizer files (tokenizer.json only): the fast one
        try:
            tok, kind = AutoTokenizer.from_pretrained(tokenizer), "fast"
        except Exception as e:  # noqa: BLE001 - one line for a missing or offline tokenizer
            raise ConfigError(f"cannot load the tokenizer {tokenizer!r} ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
                              "set --tokenizer to the trained model's folder or hub id") from None
    return (lambda text: len(tok.tokenize(text))), kind


def _write_jsonl(path: Path, rows: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    path.write_text(text, encoding="utf-8")
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def prepare_chord_openr1(source: str, out: Path, *, tokenizer: str, sft_size: int = 5000, rl_size: int = 20000,
                         max_tokens: int = 8196, seed: int = 42, split: str = "train",
                         subset: str | None = "default") -> dict:
    """Write ``out/rl/train.jsonl``, ``out/sft/train.jsonl`` and ``out/manifest.json``; return the manifest."""
    for name, value in (("--sft-size", sft_size), ("--rl-size", rl_size), ("--max-tokens", max_tokens)):
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    out = Path(out)
    check_out_dir(out)
    rows = read_source(source, split=split, subset=subset)
    count_tokens, kind = token_counter(tokenizer)
    filtered = filter_rows(rows, count_tokens, max_tokens)
    if not filtered:
        raise DataError(f"no row of {source} passes the filters (a verified generation of at most {max_tokens} tokens, "
                        "no CJK character in the problem); check --source and --max-tokens")
    sft, rl = split_sft_rl(filtered, sft_size=sft_size, rl_size=rl_size, seed=seed)
    manifest = {
        "recipe": "CHORD (Trinity-RFT examples/mix_chord/get_openr1_data.py)",
        "source": source, "split": split, "subset": subset, "tokenizer": tokenizer, "tokenizer_kind": kind,
        "max_tokens": max_tokens, "seed": seed, "sft_size": sft_size, "rl_size": rl_size,
        "rows": {"source": len(rows), "filtered": len(filtered), "sft": len(sft), "rl": len(rl)},
        "sha256": {"sft/train.jsonl": _write_jsonl(out / "sft" / "train.jsonl", sft),
                   "rl/train.jsonl": _write_jsonl(out / "rl" / "train.jsonl", rl)},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest
