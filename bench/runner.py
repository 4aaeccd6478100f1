"""One run of the step-time benchmark: build every variant on the same model, data and batch
geometry, run them (``interleaved``: in threads that take turns step by step; ``sequential``: one
after the other), and collect the records, memory and profile into the report dict that
:mod:`bench.report` renders. Writes nothing but the trainers' scratch folders (a temporary
directory, removed at the end).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.machine import git_commit, loadavg, machine_info
from bench.probes import lifetime_peak_rss_mb, state_mb
from bench.profiling import render_profile
from bench.records import VariantResult
from bench.timer import StepTimer
from bench.turns import Aborted, Turns
from bench.variants import DESCRIPTIONS, VARIANTS, algo_of, build_variant, compose, lengths_kwargs, run_overrides
from mixrl.config.rehearsal import BUILTIN_MODEL, widened
from mixrl.errors import ConfigError


def run(opts: argparse.Namespace, log: Callable[[str], None]) -> dict:
    """Build, run and measure the variants ``opts.only`` names (``opts``: the CLI's options,
    :func:`bench.throughput.parse_args`); ``log`` gets one line per variant built and, unless
    ``opts.quiet``, per step. Returns the report dict (records as :class:`VariantResult`)."""
    import torch  # deferred: torch loads only when something is measured (`--help` and the report stay light)
    import transformers  # deferred: transformers loads only when a model is built or measured

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        import datasets  # deferred: datasets loads only when a run's data is built

        datasets.disable_progress_bars()
    except ImportError:
        pass
    if opts.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but torch.cuda.is_available() is False")
    if opts.threads:
        torch.set_num_threads(opts.threads)
    variants = [v.strip() for v in opts.only.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise SystemExit(f"error: unknown variant(s) {', '.join(bad)}; choose from {', '.join(VARIANTS)}")
    load_before = loadavg()
    if getattr(opts, "context", None):

        opts.model = str(widened(BUILTIN_MODEL, opts.context))
    overrides = run_overrides(opts.set, opts.model, opts.device)
    W, S = opts.warmup, opts.steps
    profile_steps: dict[int, str] = {}
    if opts.profile_out and "grpo" in variants:
        profile_steps = {W + S + 1: "cprofile", W + S + 2: "torch"}
    turns = Turns(variants, seed=0, interleaved=opts.schedule == "interleaved", device=opts.device)
    participants: dict[str, tuple[StepTimer, Any]] = {}
    from mixrl.config.geometry import geometry  # deferred: imports torch (the config and CLI layers stay light until a run is built)

    geom = geometry(compose("grpo", overrides, 1))  # checks the overrides before any model loads
    variable = opts.lengths == "variable"
    draw = None
    budget_rule = None
    unavailable: dict[str, str] = {}
    if variable:
        from bench.varlen import LengthDraw, base_and_overrides  # deferred: imports torch

        from mixrl.plan import default_prompt_tokens  # deferred: imports torch (the config and CLI layers stay light until a run is built)

        cfg0 = compose("grpo", overrides, 1)
        max_len = int(cfg0.trainer.max_completion_length)
        opts.length_median = opts.length_median or max_len / 4
        # the fixed micro-batch it replaces, at full width: its rows x (the longest prompt + max_completion_length),
        # as `mixrl plan` sizes a micro-batch; any such budget runs at most as many micro-batches (mixrl.core.token_budget)
        prompt_tokens = default_prompt_tokens(cfg0)
        budget_rule = (f"{geom.micro_batch_size} rows x ({prompt_tokens} prompt + {max_len} completion tokens), "
                       "the fixed micro-batch's tokens at full width")
        if opts.token_budget is None:
            opts.token_budget = geom.micro_batch_size * (prompt_tokens + max_len)
        else:
            budget_rule = "--token-budget"
        draw = LengthDraw(opts.length_median, opts.length_sigma, max_len)
        for name in list(variants):
            try:
                compose(algo_of(name), [*overrides, *base_and_overrides(name, opts.token_budget)[1]], 1)
            except ConfigError as e:  # e.g. trainer.padding_free on a checkout without it
                unavailable[name] = str(e).splitlines()[0]
                log(f"{name}: not available ({unavailable[name]})")
        variants = [v for v in variants if v not in unavailable]
        turns = Turns(variants, seed=0, interleaved=opts.schedule == "interleaved", device=opts.device)
    geom_text = geom.describe()
    chord_rows = geometry(compose("chord", overrides, 1)).expert_rows_per_step if "chord" in variants else 0
    tmp = Path(tempfile.mkdtemp(prefix="mixrl-bench-"))  # the trainers' output folders, removed below
    try:
        t_setup = time.perf_counter()
        # the floor first: creating TrainingArguments resets accelerate's shared state, which each
        # trainer built after it sets up again
        for name in sorted(variants, key=lambda v: v != "floor"):
            total = W + S + (len(profile_steps) if name == "grpo" else 0)
            timer = StepTimer(name, turns, opts.device, W, W + S, profile_steps if name == "grpo" else None,
                              log=None if opts.quiet else log,
                              description=DESCRIPTIONS[name] + (", padded rows (trainer.padding_free=false)"
                                                                if variable and name in ("grpo", "chord") else ""))
            extra = base_and_overrides(name, opts.token_budget)[1] if variable else []
            cfg = compose(algo_of(name), [*overrides, *extra], total)
            runner = build_variant(name, cfg, timer, steps=total, device=opts.device, out_dir=tmp / name,
                                   generation_kwargs=lengths_kwargs(cfg, "fixed" if variable else opts.lengths))
            if draw is not None:  # every variant: the same drawn lengths
                from bench.varlen import wrap_generation  # deferred: imports torch

                if name == "floor":
                    runner.lengths = draw
                else:
                    wrap_generation(runner, draw, runner.processing_class.eos_token_id)
                    if algo_of(name) == "chord":  # long expert rows: 3x a drawn rollout length
                        from bench.varlen import stretch_experts  # deferred: imports torch

                        stretch_experts(runner, draw)
            participants[name] = (timer, runner)
            log(f"built {name}: {DESCRIPTIONS[name]}")
        participants = {name: participants[name] for name in variants}
        setup_s = time.perf_counter() - t_setup

        if profile_steps:  # let the profiler register in this (main) thread before a bench thread uses it
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
                torch.zeros(1).add_(1)
        t_run = time.perf_counter()
        run_all(participants, turns)
        run_s = time.perf_counter() - t_run

        results: dict[str, VariantResult] = {}
        for name, (timer, runner) in participants.items():
            res = timer.result
            if name == "floor":
                res.state_mb = state_mb(runner.model, runner.opt)
            else:
                res.state_mb = state_mb(runner.model, runner.optimizer)
                res.generated_tokens = getattr(runner, "mixrl_generated_tokens", None)
            results[name] = res

        profile_text = None
        if profile_steps and "grpo" in participants:
            profile_text = render_profile(participants["grpo"][0], opts)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the trainers' output folders (metrics.jsonl; no checkpoints)

    info = machine_info(opts.device)
    return {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(["python -m bench.throughput", *([shlex.join(opts.argv)] if opts.argv else [])]),
        "commit": git_commit(),
        "machine": info,
        "load_before": load_before,
        "load_after": loadavg(),
        "geometry": geom_text,
        "rollouts_per_step": geom.rollouts_per_step,
        "chord_expert_rows": chord_rows,
        "overrides": overrides,
        "warmup": W,
        "steps": S,
        "schedule": opts.schedule,
        "lengths": opts.lengths,
        "length_distribution": draw.describe() if draw is not None else None,
        "token_budget": opts.token_budget if variable else None,
        "token_budget_rule": budget_rule if variable else None,
        "unavailable": unavailable,
        "rss_reset": turns.rss_reset_ok,
        "process_peak_rss_mb": lifetime_peak_rss_mb(),
        "setup_seconds": setup_s,
        "run_seconds": run_s,
        "results": results,
        "profile_text": profile_text,
    }


def run_all(participants: dict[str, tuple[StepTimer, Any]], turns: Turns) -> None:
    """Train every participant (a timer and its runner): in threads that take turns step by step
    when ``turns.interleaved``, else one after the other. The first failure stops the others
    (they raise :class:`Aborted` at their next turn) and is raised here."""

    def go(name: str) -> None:
        timer, runner = participants[name]
        try:
            runner.train()
        except Aborted:
            pass
        except BaseException as e:  # noqa: BLE001 - reported below
            timer.result.error = f"{type(e).__name__}: {e}"
            turns.abort(e)
            raise
        finally:
            turns.done(name)

    errors: list[BaseException] = []
    if turns.interleaved:
        threads = []
        for name in participants:
            def target(n=name):
                try:
                    go(n)
                except BaseException as e:  # noqa: BLE001
                    errors.append(e)

            th = threading.Thread(target=target, name=f"bench-{name}", daemon=True)
            threads.append(th)
            th.start()
        for th in threads:
            th.join()
    else:
        for name in participants:
            try:
                go(name)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)
                break
    if errors:
        raise errors[0]
