"""Does the order of a generation call's rows change its work? (issue 51: order rows by expected length)

    python -m bench.request_order --context 512 --set trainer.max_completion_length=256 --length-median 48 \\
        --repeats 2 --out runs/bench/request-order.md

The rows of one generation call (16 prompts x 8, each group's prompt the same, random tokens;
completion lengths of ``bench.varlen.LengthDraw``, each row stopped at its length with eos off, as
``bench.row_stops`` does) are generated

* by transformers' continuous-batching engine (``trainer.generation=continuous``, mixrl's CPU
  settings: at most 32 rows decoded per forward), the requests added in three orders: as TRL
  adds them (``given``: group after group), the groups by their mean length, longest first
  (``groups-longest-first``: the best a per-prompt expected length can do, every row of a group
  sharing its prompt's expectation), and every row by its own length, longest first
  (``rows-longest-first``: an oracle);
* by padded ``generate`` (TRL's default) in the given order and longest first.

Also printed: the decoding forwards a scheduler with 32 slots would run (a row admitted when one
frees, in the order given; the engine's own schedule also chunks prefills). Padded ``generate``
decodes every row until the longest is done, whatever their order: one call's work does not
depend on it (it would only where a generation batch is split into several calls, which neither
TRL nor mixrl does).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.report import write_text
from bench.variants import build_mixrl_trainer, compose, run_overrides
from mixrl.config.rehearsal import BUILTIN_MODEL, widened

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

ORDERS = ("given", "groups-longest-first", "rows-longest-first")


def orders(lengths: list[int], group: int) -> dict[str, list[int]]:
    """Row indices in each order of :data:`ORDERS` (ties in row order)."""
    n = len(lengths)
    mean = [statistics.mean(lengths[g - g % group:g - g % group + group]) for g in range(n)]
    return {"given": list(range(n)),
            "groups-longest-first": sorted(range(n), key=lambda i: (-mean[i], i)),
            "rows-longest-first": sorted(range(n), key=lambda i: (-lengths[i], i))}


def decode_forwards(lengths: list[int], slots: int) -> int:
    """Forwards of a scheduler decoding at most ``slots`` rows at once, rows admitted in list order."""
    queue, active, steps = list(lengths), [], 0
    while queue or active:
        while queue and len(active) < slots:
            active.append(queue.pop(0))
        steps += 1
        active = [a - 1 for a in active if a > 1]
    return steps


def continuous(model, prompts, lengths, order, generation_config, cb_config) -> float:
    """Seconds of one continuous-batching call with the requests added in ``order``."""
    from transformers.generation.continuous_batching.utils import WorkloadHints  # deferred: transformers loads only when something is measured

    hints = WorkloadHints(max_prompt_length=max(map(len, prompts)), max_generated_length=max(lengths),
                          num_requests=len(prompts))
    t = time.perf_counter()
    with model.continuous_batching_context_manager(generation_config=generation_config, continuous_batching_config=cb_config,
                                                   block=True, timeout=5, workload_hints=hints) as manager:
        ids = [manager.add_request(list(prompts[i]), max_new_tokens=int(lengths[i]), eos_token_id=-1) for i in order]
        done = 0
        while done < len(ids):
            out = manager.get_result(timeout=1)
            if out is not None and out.is_finished():
                done += 1
            elif out is None and not manager.is_running():
                raise RuntimeError("the continuous-batching engine stopped before every row was generated")
    return time.perf_counter() - t


def padded(model, prompts, lengths, order, generation_config, pad_id: int) -> float:
    import torch  # deferred: torch loads only when something is measured (`--help` stays light)

    from bench.row_stops import RowLengths  # deferred: imports torch and transformers
    from transformers import StoppingCriteriaList  # deferred: transformers loads only when something is measured

    P = max(map(len, prompts))
    ids = torch.full((len(order), P), pad_id, dtype=torch.long)
    att = torch.zeros_like(ids)
    for r, i in enumerate(order):
        ids[r, P - len(prompts[i]):] = torch.as_tensor(prompts[i])
        att[r, P - len(prompts[i]):] = 1
    stops = StoppingCriteriaList([RowLengths([lengths[i] for i in order], P)])
    t = time.perf_counter()
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=att, generation_config=generation_config, stopping_criteria=stops,
                       min_new_tokens=max(lengths), max_new_tokens=max(lengths))
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> dict:
    import torch  # deferred: torch loads only when something is measured (`--help` stays light)

    from bench.varlen import LengthDraw  # deferred: imports torch

    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m bench.request_order", description=__doc__.split("\n")[0])
    p.add_argument("--context", type=int, default=None)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--length-median", type=float, default=48)
    p.add_argument("--length-sigma", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--calls", type=int, default=1, help="generation calls (different length draws)")
    p.add_argument("--padded", action="store_true", help="also time padded generate")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default="")
    opts = p.parse_args(argv)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    model_path = str(widened(BUILTIN_MODEL, opts.context)) if opts.context else None
    cfg = compose("grpo", [*run_overrides(opts.set, model_path), "trainer.generation=continuous"], 1)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_mixrl_trainer(cfg, Path(tmp), [])
    model = trainer.accelerator.unwrap_model(trainer.model)
    model.eval()
    groups, k = int(cfg.trainer.prompts_per_step), int(cfg.algo.num_generations)
    C = int(cfg.trainer.max_completion_length)
    g = torch.Generator().manual_seed(0)
    vocab = int(model.config.vocab_size)
    prompts = [torch.randint(3, vocab, (int(n),), generator=g).tolist()
               for n in torch.randint(24, 49, (groups,), generator=g)]
    prompts = [q for q in prompts for _ in range(k)]
    lines = ["# Request order in one generation call", "", f"Command: `python -m bench.request_order {' '.join(argv)}`", "",
             f"{groups} prompts x {k} rows; lengths: {LengthDraw(opts.length_median, opts.length_sigma, C).describe()}", "",
             "| call | order | engine | seconds (runs) | decoding forwards, 32 slots (simulated) |", "|---|---|---|---|---|"]
    result = {}
    for call in range(opts.calls):
        lengths = LengthDraw(opts.length_median, opts.length_sigma, C).draw(call, groups * k)
        for _ in range(opts.repeats):
            for name, order in orders(lengths, k).items():
                result.setdefault((call, name, "continuous"), []).append(
                    continuous(model, prompts, lengths, order, trainer.generation_config, trainer.continuous_batching_config))
                if opts.padded and name != "groups-longest-first":
                    result.setdefault((call, name, "padded"), []).append(
                        padded(model, prompts, lengths, order, trainer.generation_config, trainer.processing_class.pad_token_id))
        for name, order in orders(lengths, k).items():
            sim = decode_forwards([lengths[i] for i in order], 32)
            for engine in ("continuous", "padded"):
                if (call, name, engine) in result:
                    s = result[(call, name, engine)]
                    lines.append(f"| {call} | {name} | {engine} | {statistics.median(s):.2f} ({', '.join(f'{x:.2f}' for x in s)}) | "
                                 f"{sim if engine == 'continuous' else max(lengths)} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if opts.out:
        write_text(opts.out, text)
    return {f"{c}/{n}/{e}": v for (c, n, e), v in result.items()}


if __name__ == "__main__":
    main()
