"""The no-grad scoring forwards of one generation batch, in fixed row chunks against token-budget chunks.

    python -m bench.scoring --context 512 --set trainer.max_completion_length=256 --set trainer.micro_batch_size=32 \\
        --length-median 48 --length-sigma 1 --repeats 3 --out runs/bench/scoring.md

What TRL runs per generation batch when ``algo.kl.coef > 0`` and ``trainer.num_iterations > 1``:
two calls of the trainer's per-token log-probs (``_get_per_token_logps_and_entropies``) under
``torch.no_grad``, the old policy's and the reference model's, over the step's rows. Each mode is
timed on the same batch, the modes interleaved ``--repeats`` times (median):

* ``rows``: ``trainer.micro_batch_size`` rows per forward (null: the whole batch in one), every
  forward padded to the batch's widest completion (before issue 51; ``trainer.parts.score_chunks`` None);
* ``chunks``: token-budget chunks (:mod:`mixrl.trainer.parts.scoring_chunks`), the budget
  ``trainer.max_tokens_per_micro_batch`` (default: the fixed micro-batch's tokens at full width,
  as ``bench.throughput --lengths variable`` sizes it), at most ``rows`` rows per chunk;

each with padded rows (``trainer.padding_free=false``) and packed ones (``true``). The batch: 16
prompts x 8 (``trainer.prompts_per_step`` x ``algo.num_generations``), prompts of random tokens
(each group's the same) with lengths uniform in [``--prompt-min``, ``--prompt-max``], completions
of random tokens with the lengths of ``bench.varlen.LengthDraw`` (lognormal). Memory: the torch
allocator's peak over the two calls (``torch.profiler``, ``profile_memory=True``: what the forwards
allocate beyond what was live, the same on every machine) and the process's RSS high-water mark
over them (reset before; Linux), above the RSS when they began. The two modes' log-probs are
compared (max |difference|).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.memory import _profiled_peak
from bench.probes import reset_rss_peak, rss_hwm_mb
from bench.report import write_text
from bench.variants import build_mixrl_trainer, compose, run_overrides
from mixrl.config.rehearsal import BUILTIN_MODEL, widened

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

MODES = ("rows-padded", "chunks-padded", "rows-packed", "chunks-packed")


def batch(cfg, *, median: float, sigma: float, prompt_min: int, prompt_max: int, vocab: int, seed: int = 0):
    """``(input_ids, attention_mask, logits_to_keep)`` in TRL's layout (prompts left-padded, completions right-padded)."""
    import torch  # deferred: torch loads only when something is measured (`--help` stays light)

    from bench.varlen import LengthDraw  # deferred: imports torch

    groups, k = int(cfg.trainer.prompts_per_step), int(cfg.algo.num_generations)
    C = int(cfg.trainer.max_completion_length)
    lengths = LengthDraw(median, sigma, C, seed=seed).draw(0, groups * k)
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(prompt_min, prompt_max + 1, (groups,), generator=g).repeat_interleave(k).tolist()
    P = max(prompts)
    ids = torch.zeros(groups * k, P + C, dtype=torch.long)
    att = torch.zeros_like(ids)
    for i, (p, c) in enumerate(zip(prompts, lengths)):
        ids[i, P - p:P + c] = torch.randint(3, vocab, (p + c,), generator=g)
        att[i, P - p:P + c] = 1
    return ids, att, C


def _calls(trainer, ids, att, C, rows: int):
    """TRL's two scoring calls of a generation batch: the old policy's and the reference model's log-probs."""
    import torch  # deferred: torch loads only when something is measured (`--help` stays light)

    with torch.no_grad():
        old, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, att, C, batch_size=rows)
        ref, _, _ = trainer._get_per_token_logps_and_entropies(trainer.ref_model, ids, att, C, batch_size=rows)
    return old, ref


def _set_mode(trainer, mode: str, budget: int) -> None:
    from mixrl.trainer.parts.packing import Packing  # deferred: imports torch
    from mixrl.trainer.parts.scoring_chunks import ScoringChunks  # deferred: imports torch

    packing = Packing("true" if mode.endswith("packed") else "false", say=lambda text: None)
    trainer.parts.packing = packing
    trainer.parts.score_chunks = (ScoringChunks(budget, collective=False, packed=packing.applies)
                                  if mode.startswith("chunks") else None)


def _allocator_peak(fn) -> int:
    import torch  # deferred: torch loads only when something is measured (`--help` stays light)


    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return _profiled_peak(prof)


def measure(opts) -> dict:
    import torch  # deferred: torch loads only when something is measured (`--help` stays light)


    if opts.threads:
        torch.set_num_threads(opts.threads)
    model = str(widened(BUILTIN_MODEL, opts.context)) if opts.context else opts.model
    cfg = compose("grpo", [*run_overrides(opts.set, model), "algo.kl.coef=0.04", "trainer.num_iterations=2"], 1)
    rows = int(cfg.trainer.micro_batch_size or int(cfg.trainer.prompts_per_step) * int(cfg.algo.num_generations))
    C = int(cfg.trainer.max_completion_length)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_mixrl_trainer(cfg, Path(tmp), [])
    ids, att, C = batch(cfg, median=opts.length_median or C / 4, sigma=opts.length_sigma, prompt_min=opts.prompt_min,
                        prompt_max=opts.prompt_max, vocab=int(trainer.model.config.vocab_size))
    budget = opts.token_budget or rows * ids.size(1)
    trainer.model.eval()
    seconds = {m: [] for m in MODES}
    values = {}
    modes = [m for m in MODES if m in opts.modes.split(",")]
    for m in sorted(modes, key=lambda m: m != "rows-padded"):  # warm-up, the values (rows-padded: the reference)
        _set_mode(trainer, m, budget)
        values[m] = _calls(trainer, ids, att, C, rows)
    rss = {}
    for m in modes:
        _set_mode(trainer, m, budget)
        reset_rss_peak()
        base = rss_hwm_mb()
        _calls(trainer, ids, att, C, rows)
        rss[m] = rss_hwm_mb() - base
    alloc = {}
    for m in modes:
        _set_mode(trainer, m, budget)
        alloc[m] = _allocator_peak(lambda: _calls(trainer, ids, att, C, rows)) / 2**20
    for _ in range(opts.repeats):
        for m in modes:
            _set_mode(trainer, m, budget)
            t = time.perf_counter()
            _calls(trainer, ids, att, C, rows)
            seconds[m].append(time.perf_counter() - t)
    ref = "rows-padded" if "rows-padded" in values else modes[0]
    diff = {m: max(float((a - b).abs().max()) for a, b in zip(values[m], values[ref])) for m in modes}
    real = int(att.sum())
    return {"rows": ids.size(0), "width": ids.size(1), "real_tokens": real, "fixed_rows": rows, "budget": budget,
            "modes": modes, "reference": ref, "seconds": seconds, "alloc_mb": alloc, "rss_mb": rss, "max_diff": diff,
            "completion_lengths": att[:, -C:].sum(-1).tolist()}


def markdown(r: dict, argv: list[str]) -> str:
    lens = sorted(r["completion_lengths"])
    lines = [
        "# Scoring forwards: fixed rows vs token-budget chunks", "",
        f"Command: `python -m bench.scoring {' '.join(argv)}`", "",
        f"- batch: {r['rows']} rows, padded width {r['width']} (prompt + completion), {r['real_tokens']} real tokens "
        f"({r['real_tokens'] / (r['rows'] * r['width']):.3f} of the padded tensor); completion lengths: median "
        f"{statistics.median(lens):g}, max {lens[-1]}",
        f"- two no-grad calls per batch (old policy, reference model), as TRL runs them at `algo.kl.coef > 0`, "
        f"`trainer.num_iterations > 1`; fixed rows: {r['fixed_rows']} per forward; token budget {r['budget']}",
        "",
        f"| mode | seconds (median) | runs | allocator peak MB | RSS peak above start MB | max abs diff vs {r['reference']} |",
        "|---|---|---|---|---|---|",
    ]
    for m in r["modes"]:
        s = r["seconds"][m]
        lines.append(f"| {m} | {statistics.median(s):.3f} | {', '.join(f'{x:.3f}' for x in s)} | "
                     f"{r['alloc_mb'][m]:.1f} | {r['rss_mb'][m]:.1f} | {r['max_diff'][m]:.2e} |")
    for kind in ("padded", "packed"):
        if f"rows-{kind}" not in r["modes"] or f"chunks-{kind}" not in r["modes"]:
            continue
        a, b = statistics.median(r["seconds"][f"rows-{kind}"]), statistics.median(r["seconds"][f"chunks-{kind}"])
        lines.append(f"\n{kind}: chunks / rows time {b / a:.3f}; allocator peak "
                     f"{r['alloc_mb'][f'chunks-{kind}'] / max(r['alloc_mb'][f'rows-{kind}'], 1e-9):.3f}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:

    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m bench.scoring", description=__doc__.split("\n")[0])
    p.add_argument("--context", type=int, default=None, help="the built-in BPE model widened to N positions")
    p.add_argument("--model", default=None, help="model folder (default: the config's)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    p.add_argument("--length-median", type=float, default=None, help="median completion length (default: max / 4)")
    p.add_argument("--length-sigma", type=float, default=1.0)
    p.add_argument("--prompt-min", type=int, default=24)
    p.add_argument("--prompt-max", type=int, default=48)
    p.add_argument("--token-budget", type=int, default=None,
                   help="tokens per chunk (default: micro_batch_size rows x the padded width)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {','.join(MODES)}")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default="", help="Markdown report path (default: none)")
    opts = p.parse_args(argv)
    r = measure(opts)
    text = markdown(r, argv)
    print(text)
    if opts.out:

        write_text(opts.out, text)
    return r


if __name__ == "__main__":
    main()
