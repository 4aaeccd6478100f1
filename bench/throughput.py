"""Step-time benchmark of mixrl against plain TRL and a bare torch + transformers floor.

    python -m bench.throughput                       # CPU, 3 warm-up + 10 measured steps per variant
    python -m bench.throughput --device cuda         # the same on a GPU
    python -m bench.throughput --warmup 1 --steps 1  # smoke run

One run builds four variants on the same model (the built-in tiny model unless ``--model``),
data (``builtin:arith``) and batch geometry (the default config: 16 prompts x 8 generations,
one micro-batch, 32 new tokens; ``--set KEY=VALUE`` overrides any config value for all):

``trl``    plain ``trl.GRPOTrainer``, with the GRPOConfig that mixrl builds for ``algo=grpo``
           (``mixrl.trainer.build.grpo_args``) and ``loss_type="dapo"``: PPO-clip (eps 0.2 both
           sides) averaged over every completion token of the step, like mixrl's ``token-mean``.
``grpo``   ``MixrlGRPOTrainer`` for ``algo=grpo`` (with the ``metrics.jsonl`` callback that
           ``mixrl train`` adds); its advantage eps is set to TRL's 1e-4 (same numbers).
``chord``  ``MixrlGRPOTrainer`` for ``algo=chord`` (the grpo rollouts + expert rows trained with SFT).
``prefix`` ``algo=prefixrl``: every rollout continues from a prefix of the expert solution (``--only``).
``hint``   ``algo=guide``: failed groups are generated again with a hint (``--only``).
``replay`` ``algo=remix``: replayed past rollouts trained beside the fresh ones (``--only``).
``teacher`` ``algo=kdrl``: GRPO + a reverse KL to the built-in teacher, scored once per batch (``--only``).
``floor``  bare torch + transformers doing the same work: ``model.generate`` for the group,
           reward, group-normalised advantage, one forward + backward over prompt + completion
           with the same PPO-clip token-mean loss, gradient clipping, the same optimizer step.

``--lengths fixed`` (default) suppresses eos until ``max_completion_length`` tokens, so every
variant generates and trains the same number of tokens every step whatever its weights (the
variants' weights drift apart after their first update, and completion lengths with them);
``--lengths sampled`` keeps the training behaviour (stop at eos).

Every variant is timed by the same ``TrainerCallback`` hooks (``on_step_begin`` ->
``on_step_end``; CUDA synchronised) and its rollout phase (generate + score + mixing:
``_generate_and_score_completions``) by a wrapper of that method. With
``--schedule interleaved`` (default) the variants take turns step by step (each in its own
thread, exactly one running at a time, each with its own RNG stream), so a change of
background load hits all of them alike and ratios are taken per round; ``sequential`` runs
one variant after the other. Reported: medians over the measured steps, ratios
(mixrl/TRL, chord/grpo against the ratio of trained tokens, mixrl/floor), memory, and a
cProfile + torch.profiler breakdown of one extra mixrl grpo step (``--profile-out``).
Results: a Rich table on the terminal, and files in one folder: ``bench.md`` (the Markdown
report) and ``profile.txt``, in a new ``runs/bench/throughput-<UTC time>/`` unless ``--out DIR``
names another; ``docs/results/`` is written only when named (``--out docs/results``, how the
committed report is made). ``--json PATH`` adds every measurement as JSON.

The work is split by job: :mod:`bench.variants` (building each variant), :mod:`bench.turns`
(turn taking), :mod:`bench.timer` (the timing hook), :mod:`bench.probes` (memory),
:mod:`bench.runner` (one run), :mod:`bench.profiling` and :mod:`bench.report` (the outputs); this
module is the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from bench.machine import REPO, git_commit, loadavg, machine_info  # noqa: E402
from bench.records import StepRecord, VariantResult, fmt, paired_ratio  # noqa: E402
from bench.report import (TARGET_OVERHEAD, check_out, markdown, ratio_lines, ratios, report_file,  # noqa: E402
                          rich_tables, summary_rows, to_json, write_text)
from bench.runner import run  # noqa: E402
from bench.timer import StepTimer  # noqa: E402
from bench.turns import Aborted, Turns  # noqa: E402
from bench.variants import (ALGO, DEFAULT_VARIANTS, VARLEN_VARIANTS, DESCRIPTIONS, VARIANTS, FloorLoop, build_mixrl_trainer,  # noqa: E402
                            build_trl_trainer, compose, fixed_lengths)
from mixrl.errors import ConfigError, DataError  # noqa: E402
from rich.console import Console  # noqa: E402

#: the names this module had before the split, importable from here as before
__all__ = ["ALGO", "DEFAULT_VARIANTS", "DESCRIPTIONS", "REPO", "TARGET_OVERHEAD", "VARIANTS", "Aborted", "FloorLoop",
           "StepRecord", "StepTimer", "Turns", "VariantResult", "build_mixrl_trainer", "build_trl_trainer", "compose",
           "fixed_lengths", "fmt", "git_commit", "loadavg", "machine_info", "main", "markdown", "paired_ratio",
           "parse_args", "ratio_lines", "ratios", "rich_tables", "run", "summary_rows", "to_json"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options; also resolves where the files go: ``opts.out`` (the Markdown report) and
    ``opts.profile_out`` (the profile), each a path or '' for none. Bad values exit 2 with one
    line, before anything is built or written."""
    p = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="files: bench.md and profile.txt go to one folder, a new runs/bench/throughput-<UTC time>/\n"
                                "unless --out DIR names another; docs/results/ is written only when named:\n"
                                "    python -m bench.throughput --steps 20 --quiet --out docs/results")
    p.add_argument("--warmup", type=int, default=3, help="warm-up steps per variant (not measured; default 3)")
    p.add_argument("--steps", type=int, default=10, help="measured steps per variant (default 10)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--only", default=None,
                   help=f"variants to run (default {','.join(DEFAULT_VARIANTS)}; with --lengths variable {','.join(VARLEN_VARIANTS)}; "
                   f"also: {', '.join(v for v in VARIANTS if v not in DEFAULT_VARIANTS)})")
    p.add_argument("--schedule", choices=("interleaved", "sequential"), default="interleaved",
                   help="interleaved (default): variants take turns step by step; sequential: one after the other")
    p.add_argument("--lengths", choices=("fixed", "sampled", "variable"), default="fixed",
                   help="fixed (default): every completion is max_completion_length tokens (eos suppressed), the same "
                   "work in every variant and step; sampled: completions stop at eos, as in training; variable: "
                   "lengths drawn from a lognormal (--length-median, --length-sigma), the same for every variant (bench.varlen)")
    p.add_argument("--length-median", type=float, default=None,
                   help="--lengths variable: median completion length in tokens (default: max_completion_length / 4)")
    p.add_argument("--length-sigma", type=float, default=1.0, help="--lengths variable: lognormal sigma in log space (default 1.0)")
    p.add_argument("--token-budget", type=int, default=None,
                   help="--lengths variable: trainer.max_tokens_per_micro_batch of the *-budget variants "
                   "(default: the fixed micro-batch's tokens at full width, trainer.micro_batch_size rows (null: the "
                   "step's) x (the longest prompt + max_completion_length), as mixrl plan sizes a micro-batch)")
    p.add_argument("--model", default=None, help="model folder (default: the built-in tiny model, mixrl.models.tiny.warm_start())")
    p.add_argument("--context", type=int, default=None, metavar="N",
                   help="the built-in BPE model (builtin:tiny-bpe) with its context widened 128 -> N positions "
                   "(rotary positions, the same weights; mixrl.config.rehearsal.widened), for completions longer than "
                   "its 128 positions allow; instead of --model")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every variant, e.g. --set trainer.prompts_per_step=4 (repeatable)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="folder for bench.md and profile.txt (default: a new runs/bench/throughput-<UTC time>/; "
                   "'--out docs/results' updates the committed report); a path ending in .md names the Markdown "
                   "report itself, the profile going beside it (NAME-profile.txt unless it is bench.md); '' writes no report")
    p.add_argument("--profile-out", default=None, metavar="PATH",
                   help="profile of one mixrl grpo step (default: beside the report, profile.txt or NAME-profile.txt; '' to skip)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write every measurement as JSON")
    p.add_argument("--quiet", action="store_true", help="no per-step lines")
    opts = p.parse_args(argv)
    opts.argv = list(sys.argv[1:] if argv is None else argv)
    if opts.only is None:
        opts.only = ",".join(VARLEN_VARIANTS if opts.lengths == "variable" else DEFAULT_VARIANTS)
    if opts.warmup < 0 or opts.steps < 1:
        p.error("--warmup must be >= 0 and --steps >= 1")
    bad = [v for v in (x.strip() for x in opts.only.split(",")) if v and v not in VARIANTS]
    if bad:
        p.error(f"unknown variant(s) {', '.join(bad)} in --only; choose from {', '.join(VARIANTS)}")
    cb = [v for v in (x.strip() for x in opts.only.split(",")) if v.endswith("-cb")]
    if cb and opts.lengths != "variable":
        p.error(f"{', '.join(cb)} (continuous batching) need --lengths variable: its engine stops each row at its drawn length")
    sp = [v for v in (x.strip() for x in opts.only.split(",")) if v.endswith(("-sp", "-compact"))]
    if sp and opts.lengths != "variable":
        p.error(f"{', '.join(sp)} (shared prefill, compact) need --lengths variable, the run that applies a variant's engine suffix")
    if not any(x.strip() for x in opts.only.split(",")):
        p.error(f"--only names no variant; choose from {', '.join(VARIANTS)}")
    if opts.context is not None and (opts.model is not None or opts.context < 128):
        p.error("--context N names the built-in BPE model widened to N >= 128 positions; give it or --model, not both")
    problem = check_out(opts.out)
    if problem:
        p.error(problem)
    md = report_file(opts.out, "throughput", "bench.md")
    if opts.profile_out is None:  # beside the report; a report of another name (bench-varlen.md) gets its own
        opts.profile_out = (str(md.parent / ("profile.txt" if md.name == "bench.md" else f"{md.stem}-profile.txt"))
                            if md is not None else "")
    opts.out = str(md) if md is not None else ""
    return opts


def main(argv: list[str] | None = None) -> dict:

    opts = parse_args(argv)
    out, err = Console(width=None if sys.stdout.isatty() else 160), Console(stderr=True)

    try:
        rep = run(opts, log=lambda s: err.print(s, highlight=False))
    except (ConfigError, DataError) as e:  # a bad --set or --model: one line, exit 2, no report written
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    table, rtable = rich_tables(rep)
    out.print(table)
    out.print(rtable)
    if opts.profile_out and rep["profile_text"]:
        out.print(f"wrote {write_text(opts.profile_out, rep['profile_text'])}")
    if opts.out:
        md_dir = Path(opts.out).parent
        out.print(f"wrote {write_text(opts.out, markdown(rep, opts.profile_out or None, md_dir))}")
    if opts.json:
        out.print(f"wrote {write_text(opts.json, json.dumps(to_json(rep), indent=2, default=str))}")
    return rep


if __name__ == "__main__":
    main()
