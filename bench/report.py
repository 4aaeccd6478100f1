"""The step-time benchmark's report: summary rows and ratios computed from the records, the Rich
tables printed to the terminal, the Markdown report (``bench.md``) and the JSON of every
measurement; and where a benchmark's files go (:func:`report_file`): a new
``runs/bench/<benchmark>-<UTC time>/`` unless ``--out`` names a folder or a ``.md`` file, so
``docs/results/`` is written only when ``--out`` names it.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.table import Table

from bench.records import VariantResult, fmt, paired_ratio

#: the step-time target of mixrl grpo over plain TRL (ratio (1))
TARGET_OVERHEAD = 1.05


# --------------------------------------------------------------------------- where the files go
def default_out_dir(bench: str, now: datetime | None = None) -> Path:
    """Where a benchmark writes without ``--out``: a new folder per call, like ``mixrl reproduce``'s
    ``runs/reproduce/SUITE-<UTC time>/`` (``runs/`` is ignored by git)."""
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%d-%H%M%S")
    return Path("runs") / "bench" / f"{bench}-{stamp}"


def check_out(out: str | None) -> str | None:
    """The problem with an ``--out`` value, or None: it must be a folder (existing or not) or a ``.md`` file."""
    if out and not out.endswith(".md") and Path(out).exists() and not Path(out).is_dir():
        return f"--out {out} is a file; give a folder for the reports (or a path ending in .md for the Markdown report alone)"
    return None


def report_file(out: str | None, bench: str, filename: str) -> Path | None:
    """The Markdown report's path for ``--out``: None (the default) -> ``default_out_dir(bench)/filename``;
    '' -> None (no report); a path ending in ``.md`` -> that file; any other path -> a folder, ``out/filename``.
    A benchmark's other files (the profile) go beside the report."""
    if out is None:
        return default_out_dir(bench) / filename
    if out == "":
        return None
    return Path(out) if out.endswith(".md") else Path(out) / filename


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path``, making its folder; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --------------------------------------------------------------------------- rows and ratios
def summary_rows(rep: dict) -> list[dict]:
    res: dict[str, VariantResult] = rep["results"]
    cuda = rep["machine"]["device"] == "cuda"
    rows = []
    for name, r in res.items():
        q = r.quantiles()
        row = {
            "variant": name, "what": r.description, "n": len(r.measured()),
            "step_s": r.med("seconds"), "min_s": q[0] if q else None, "p25_s": q[1] if q else None, "p75_s": q[2] if q else None,
            "rollout_s": r.med("rollout_seconds"), "train_s": r.med("train_seconds"), "generate_s": r.med("generate_seconds"),
            "rollout_tokens": r.med("rollout_tokens"), "expert_tokens": r.med("expert_tokens"),
            "rss_peak_mb": r.peak("rss_peak_mb"), "state_mb": r.state_mb,
            "padding_fraction": r.med("padding_fraction"), "tokens_per_s": r.med("trained_tokens_per_second"),
        }
        if cuda:
            row["cuda_peak_mb"] = r.peak("cuda_peak_mb")
        rows.append(row)
    return rows


def ratios(rep: dict) -> dict:
    res: dict[str, VariantResult] = rep["results"]
    g, t, c, f = (res.get(k) for k in ("grpo", "trl", "chord", "floor"))
    out: dict[str, Any] = {}
    if g and t:
        gt, tt = g.med("rollout_tokens"), t.med("rollout_tokens")
        out["grpo_vs_trl"] = {"step": paired_ratio(g, t), "rollout": paired_ratio(g, t, "rollout_seconds"),
                              "train": paired_ratio(g, t, "train_seconds"), "tokens_ratio": (gt / tt) if gt and tt else None,
                              "same_tokens_every_step": [r.rollout_tokens for r in g.records[:len(t.records)]]
                              == [r.rollout_tokens for r in t.records[:len(g.records)]]}
    if c and g:
        rt, et = c.med("rollout_tokens") or 0, c.med("expert_tokens") or 0
        out["chord_vs_grpo"] = {"step": paired_ratio(c, g), "rollout": paired_ratio(c, g, "rollout_seconds"),
                                "train": paired_ratio(c, g, "train_seconds"),
                                "expert_over_rollout_tokens": (et / rt) if rt else None,
                                "rows_ratio": (c.med("rows") / g.med("rows")) if g.med("rows") else None,
                                "trained_tokens_ratio": ((rt + et) / g.med("rollout_tokens")) if g.med("rollout_tokens") else None}
    if g and f:
        gt, ft = g.med("rollout_tokens"), f.med("rollout_tokens")
        out["grpo_vs_floor"] = {"step": paired_ratio(g, f), "rollout": paired_ratio(g, f, "rollout_seconds"),
                                "train": paired_ratio(g, f, "train_seconds"),
                                "tokens_ratio": (gt / ft) if gt and ft else None}
    if t and f:
        out["trl_vs_floor"] = {"step": paired_ratio(t, f)}
    for name in ("prefix", "hint", "replay", "teacher"):  # the cost over grpo against the extra tokens trained and generated
        x = res.get(name)
        if x and g:
            gt = g.med("rollout_tokens")
            out[f"{name}_vs_grpo"] = {
                "step": paired_ratio(x, g), "rollout": paired_ratio(x, g, "rollout_seconds"), "train": paired_ratio(x, g, "train_seconds"),
                "trained_tokens_ratio": (x.med("rollout_tokens") / gt) if gt else None,
                # per step run: grpo runs extra profiling steps, so totals would not compare
                "generated_tokens_ratio": ((x.generated_tokens / len(x.records)) / (g.generated_tokens / len(g.records))
                                           if x.generated_tokens and g.generated_tokens and x.records and g.records else None),
            }
    tcb = res.get("trl-cb")
    for name in ("grpo-budget", "grpo-pf", "grpo-pf-budget", "chord-budget", "chord-pf", "chord-pf-budget"):
        x, base = res.get(name), res.get(name.split("-")[0])  # bench.varlen: a batching against plain TRL and its padded self
        if x and t:
            out[f"{name}_vs_trl"] = {"step": paired_ratio(x, t), "rollout": paired_ratio(x, t, "rollout_seconds"),
                                     "train": paired_ratio(x, t, "train_seconds"),
                                     "vs_padded": paired_ratio(x, base) if base else None,
                                     "vs_trl_cb": paired_ratio(x, tcb) if tcb else None}
    for name in ("trl-cb", "grpo-cb", "grpo-pf-budget-cb"):  # transformers' continuous batching against padded TRL and TRL's own
        x = res.get(name)
        if x and t:
            out[f"{name}_vs_trl"] = {"step": paired_ratio(x, t), "rollout": paired_ratio(x, t, "rollout_seconds"),
                                     "train": paired_ratio(x, t, "train_seconds"),
                                     "vs_trl_cb": paired_ratio(x, tcb) if tcb and name != "trl-cb" else None,
                                     "rollout_share": rollout_share(x), "trl_rollout_share": rollout_share(t)}
    for name in ("grpo-sp", "grpo-pf-budget-sp", "grpo-compact", "grpo-pf-budget-compact"):
        # shared prefill / compact generation against padded TRL and the same variant's plain padded generation
        x, plain = res.get(name), res.get(name.rsplit("-", 1)[0])
        if x and t:
            out[f"{name}_vs_trl"] = {"step": paired_ratio(x, t), "rollout": paired_ratio(x, t, "rollout_seconds"),
                                     "train": paired_ratio(x, t, "train_seconds"),
                                     "vs_plain": paired_ratio(x, plain) if plain else None,
                                     "generate_vs_plain": paired_ratio(x, plain, "generate_seconds") if plain else None,
                                     "vs_trl_cb": paired_ratio(x, tcb) if tcb else None}
    return out


def rollout_share(r: VariantResult) -> float | None:
    """The rollout phase's share of the step: median rollout seconds over median step seconds."""
    step, roll = r.med("seconds"), r.med("rollout_seconds")
    return roll / step if step and roll is not None else None


def _r(d: dict | None, key: str = "paired_median") -> str:
    return fmt(d.get(key) if d else None, ".3f")


def rich_tables(rep: dict):

    rows = summary_rows(rep)
    cuda = rep["machine"]["device"] == "cuda"
    t = Table(title=f"mixrl step-time benchmark ({rep['machine']['device']}, median of {rep['steps']} steps after {rep['warmup']} warm-up, {rep['schedule']})")
    cols = ["variant", "step s", "min s", "IQR s", "rollout s", "train s", "rollout tok", "expert tok", "padding",
            "trained tok/s", "state MB", "RSS peak MB"] + (["CUDA peak MB"] if cuda else [])
    for i, col in enumerate(cols):
        t.add_column(col, justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(r["variant"], fmt(r["step_s"]), fmt(r["min_s"]), f"{fmt(r['p25_s'])}–{fmt(r['p75_s'])}", fmt(r["rollout_s"]),
                  fmt(r["train_s"]), fmt(r["rollout_tokens"], ".0f"), fmt(r["expert_tokens"], ".0f"),
                  fmt(r["padding_fraction"], ".3f"), fmt(r["tokens_per_s"], ".0f"), fmt(r["state_mb"], ".1f"),
                  fmt(r["rss_peak_mb"], ".0f"), *([fmt(r.get("cuda_peak_mb"), ".1f")] if cuda else []))
    t.caption = f"geometry: {rep['geometry']}"
    rt = Table(title="ratios (median over rounds of per-round ratios; min step / min step)")
    for col in ("comparison", "step", "min/min", "rollout phase", "train phase", "note"):
        rt.add_column(col, justify="left" if col in ("comparison", "note") else "right")
    for label, d, note in ratio_lines(rep):
        rt.add_row(label, _r(d.get("step")), _r(d.get("step"), "ratio_of_mins"), _r(d.get("rollout")), _r(d.get("train")), note)
    return t, rt


def ratio_lines(rep: dict) -> list[tuple[str, dict, str]]:
    r = ratios(rep)
    lines = []
    if "grpo_vs_trl" in r:
        d = r["grpo_vs_trl"]
        v = (d["step"] or {}).get("paired_median")
        verdict = "–" if v is None else ("target met" if v <= TARGET_OVERHEAD else "target NOT met")
        lo, hi = (d["step"] or {}).get("paired_min"), (d["step"] or {}).get("paired_max")
        if v is not None and lo and hi and hi / lo > 1.2:
            verdict += f" (noisy: per-round ratios span {lo:.2f}–{hi:.2f}; re-measure on a quiet machine)"
        lines.append(("(1) mixrl grpo / plain TRL", d,
                      f"target ≤ {TARGET_OVERHEAD}: {verdict}; same rollout tokens as TRL at every step: "
                      f"{'yes' if d['same_tokens_every_step'] else 'no'}"))
    if "chord_vs_grpo" in r:
        d = r["chord_vs_grpo"]
        lines.append(("(2) mixrl chord / mixrl grpo", d,
                      f"expert/rollout tokens {fmt(d['expert_over_rollout_tokens'], '.3f')}; trained tokens chord/grpo "
                      f"{fmt(d['trained_tokens_ratio'], '.3f')}; rows (padded to one width) chord/grpo {fmt(d['rows_ratio'], '.3f')}"))
    if "grpo_vs_floor" in r:
        d = r["grpo_vs_floor"]
        lines.append(("(3) mixrl grpo / torch floor", d, f"rollout tokens grpo/floor {fmt(d['tokens_ratio'], '.3f')}"))
    if "trl_vs_floor" in r:
        lines.append(("    plain TRL / torch floor", r["trl_vs_floor"], ""))
    for name, label in (("prefix", "(4) mixrl prefixrl / mixrl grpo"), ("hint", "(5) mixrl guide / mixrl grpo"),
                        ("replay", "(6) mixrl remix / mixrl grpo"), ("teacher", "(7) mixrl kdrl / mixrl grpo")):
        if f"{name}_vs_grpo" in r:
            d = r[f"{name}_vs_grpo"]
            lines.append((label, d, f"trained tokens {fmt(d['trained_tokens_ratio'], '.3f')}; generated tokens (all steps) "
                                    f"{fmt(d['generated_tokens_ratio'], '.3f')}"))
    for name in ("grpo-budget", "grpo-pf", "grpo-pf-budget", "chord-budget", "chord-pf", "chord-pf-budget"):
        if f"{name}_vs_trl" in r:
            d = r[f"{name}_vs_trl"]
            vs = f"; step / TRL with continuous batching: {_r(d.get('vs_trl_cb'))}" if d.get("vs_trl_cb") else ""
            lines.append((f"(8) mixrl {name} / plain TRL", d,
                          f"step / mixrl {name.split('-')[0]} (padded rows): {_r(d.get('vs_padded'))}{vs}"))
    for name in ("trl-cb", "grpo-cb", "grpo-pf-budget-cb"):
        if f"{name}_vs_trl" in r:
            d = r[f"{name}_vs_trl"]
            vs = f"step / TRL with continuous batching: {_r(d.get('vs_trl_cb'))}; " if d.get("vs_trl_cb") else ""
            lines.append((f"(9) {'plain TRL' if name == 'trl-cb' else 'mixrl'} {name} / plain TRL (padded generation)", d,
                          f"{vs}rollout share of the step {fmt(d['rollout_share'], '.2f')} (plain TRL: "
                          f"{fmt(d['trl_rollout_share'], '.2f')})"))
    for name in ("grpo-sp", "grpo-pf-budget-sp", "grpo-compact", "grpo-pf-budget-compact"):
        if f"{name}_vs_trl" in r:
            d = r[f"{name}_vs_trl"]
            vs = f"; step / TRL with continuous batching: {_r(d.get('vs_trl_cb'))}" if d.get("vs_trl_cb") else ""
            plain = "prefill per row" if name.endswith("-sp") else "every row decoded to the end"
            lines.append((f"({10 if name.endswith('-sp') else 11}) mixrl {name} / plain TRL", d,
                          f"step / {name.rsplit('-', 1)[0]} ({plain}): {_r(d.get('vs_plain'))}, generation "
                          f"{_r(d.get('generate_vs_plain'))}{vs}"))
    return lines


def markdown(rep: dict, profile_path: str | None, md_dir: str | Path | None = None) -> str:
    """The Markdown report; ``profile_path``, when given, is linked relative to ``md_dir``
    (the report's folder; default the path as given)."""
    m = rep["machine"]
    cuda = m["device"] == "cuda"
    lines = [
        "# mixrl step-time benchmark",
        "",
        f"Re-measure with `{rep['command']}` (from the repository root; `--help` for the flags).",
        "",
        f"- date: {rep['date']}",
        f"- commit: `{rep['commit']}`",
        f"- machine: {m['cpu']}, {m['cpu_count']} CPUs ({m['affinity']} usable), torch threads {m['torch_threads']}"
        + (f"; GPU {m['gpu']} (CUDA {m['cuda']})" if cuda else ""),
        f"- software: Python {m['python']}, torch {m['torch']}, transformers {m['transformers']}, trl {m['trl']}",
        f"- device: {m['device']}; load average before/after: {rep['load_before']} / {rep['load_after']}",
        f"- geometry: {rep['geometry']}; config overrides: `{' '.join(rep['overrides'])}`",
        f"- steps: {rep['warmup']} warm-up + {rep['steps']} measured per variant, schedule `{rep['schedule']}`; "
        f"setup {rep['setup_seconds']:.0f}s, run {rep['run_seconds']:.0f}s",
    ]
    if rep.get("length_distribution"):
        lines += [f"- completion lengths (`--lengths variable`): {rep['length_distribution']}; "
                  f"token budget of the `*-budget` variants: {rep['token_budget']} tokens per micro-batch"
                  + (f" ({rep['token_budget_rule']})" if rep.get("token_budget_rule") else "")]
    lines += [f"- not available on this checkout: `{name}` ({why})" for name, why in (rep.get("unavailable") or {}).items()]
    lines += [
        "",
        "## Step time",
        "",
    ]
    head = ["variant", "what", "step s (median)", "min s", "IQR s", "rollout s", "train s", "rollout tokens", "expert tokens",
            "padding fraction", "trained tokens/s", "state MB", "RSS peak MB"] + (["CUDA peak MB"] if cuda else [])
    lines += ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for r in summary_rows(rep):
        cells = [f"`{r['variant']}`", r["what"], fmt(r["step_s"]), fmt(r["min_s"]), f"{fmt(r['p25_s'])}–{fmt(r['p75_s'])}",
                 fmt(r["rollout_s"]), fmt(r["train_s"]), fmt(r["rollout_tokens"], ".0f"), fmt(r["expert_tokens"], ".0f"),
                 fmt(r["padding_fraction"], ".3f"), fmt(r["tokens_per_s"], ".0f"), fmt(r["state_mb"], ".1f"), fmt(r["rss_peak_mb"], ".0f")] + ([fmt(r.get("cuda_peak_mb"), ".1f")] if cuda else [])
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "*rollout* = generate + score (+ mixing: `_generate_and_score_completions`), *train* = step − rollout "
        "(forward, backward, optimizer, logging). Tokens are completion tokens per step (medians). *padding fraction*: "
        "padding over all tokens of the step's loss forwards (mixrl: its `batch/padding_fraction`, the forwards as run: "
        "packed, trimmed, in token-budget micro-batches; plain TRL and the floor: every row padded to the step's widest); "
        "*trained tokens/s*: the step's real prompt + completion tokens over its train phase.",
        *rollout_phase_lines(rep),
        "",
        "## Ratios",
        "",
        "Median over rounds of the per-round ratio (round *i* = the *i*-th measured step of each variant; "
        "min–max over rounds in brackets); *min/min*: the ratio of the fastest measured steps, the least disturbed "
        "by background load on a shared machine.",
        "",
        "| comparison | step | min/min | rollout phase | train phase | note |",
        "|---|---:|---:|---:|---:|---|",
    ]

    def cell(d):
        if not d or d.get("paired_median") is None:
            return "–"
        return f"{d['paired_median']:.3f} [{d['paired_min']:.2f}–{d['paired_max']:.2f}]"

    for label, d, note in ratio_lines(rep):
        lines.append(f"| {label.strip()} | {cell(d.get('step'))} | {_r(d.get('step'), 'ratio_of_mins')} | {cell(d.get('rollout'))} "
                     f"| {cell(d.get('train'))} | {note} |")
    rss_note = ("RSS peak = the process's resident-set high-water mark during the variant's measured steps (reset at every "
                "step begin through /proc/self/clear_refs)" if rep["rss_reset"] else
                "RSS peak = the process's lifetime ru_maxrss (resetting the high-water mark was not permitted here), so it only grows")
    lines += [
        "",
        "## Memory",
        "",
        f"- state MB = parameters + optimizer state of the variant's model. {rss_note}; all variants live in one process, "
        f"so it includes the others' resident memory. Process peak RSS: {rep['process_peak_rss_mb']:.0f} MB.",
    ]
    if cuda:
        lines.append("- CUDA peak MB = `torch.cuda.max_memory_allocated()` during the step (reset at every step begin).")
    lines += [
        "- tracemalloc is not used: it sees only Python-heap allocations, not torch tensors, and slows Python code.",
        "",
        "## What is compared",
        "",
        "- `trl`: `trl.GRPOTrainer` with the `GRPOConfig` that `mixrl.trainer.build.grpo_args` builds for `algo=grpo` "
        "(same num_generations, batch, learning rate, max_completion_length, temperature, optimizer) and "
        "`loss_type=\"dapo\"` (PPO-clip, eps 0.2 both sides, summed over all completion tokens of the step and divided by "
        "their number: mixrl's `token-mean`), `scale_rewards=\"group\"`, `beta=0`.",
        "- `grpo`: `MixrlGRPOTrainer`, built from `compose_config([\"algo=grpo\", ...])` as `mixrl train` builds it "
        "(including the metrics.jsonl callback), with `algo.advantage.eps=1e-4` (TRL's constant): both trainers compute "
        "the same loss and, with the same seed, follow the same trajectory (with `--lengths sampled` their per-step "
        "rollout token counts are identical: see the note of ratio (1)).",
        "- `chord`: `MixrlGRPOTrainer` for `algo=chord`: the same rollouts plus expert rows trained with SFT "
        f"({rep['chord_expert_rows']} expert rows per {rep['rollouts_per_step']} rollouts).",
        f"- `floor`: torch + transformers only: `model.generate` for the {rep['rollouts_per_step']} completions (same sampling settings), reward, "
        "group-normalised advantage, forward (`logits_to_keep`) + log-softmax + PPO-clip token-mean + backward per "
        "micro-batch, gradient clipping, the optimizer TRL uses (`Trainer.get_optimizer_cls_and_kwargs`). No entropy, "
        "no metrics. Its prompts are drawn by its own permutation.",
        "- Completion lengths: " + ("`--lengths fixed`: eos is suppressed until `max_completion_length` tokens "
        "(`min_new_tokens`), so every variant generates and trains the same number of tokens every step."
        if rep["lengths"] == "fixed" else "`--lengths variable`: every variant gets the same drawn lengths (see the header): "
        "eos is suppressed and each engine ends a row at its drawn length (`bench/row_stops.py`): padded generation "
        "computes every row until the step's longest is done, continuous batching drops a row when it ends."
        if rep["lengths"] == "variable" else "`--lengths sampled`: completions stop at eos as in training, so the variants' "
        "token counts differ from step to step (see the token columns)."),
        *(["- `*-cb`: the same variant generated by transformers' continuous batching (`trainer.generation=continuous`; "
           "for plain TRL `use_transformers_continuous_batching=True` with the `transformers_continuous_batching_config` "
           "mixrl builds, its CPU KV cache sized from the run: `mixrl.config.generation`)."]
          if any(n.endswith("-cb") for n in rep["results"]) else []),
        *(["- `*-sp`: the same variant generated padded with each group's prompt prefilled once "
           "(`trainer.generation=shared-prefill`, `mixrl/trainer/generation/shared_prefill.py`): the same rows, decoding "
           "steps and random stream as padded generation."]
          if any(n.endswith("-sp") for n in rep["results"]) else []),
        *(["- `*-compact`: the same variant generated padded with the finished rows no longer computed "
           "(`trainer.generation=compact`, `mixrl/trainer/generation/compact.py`): the same rows, sampling calls and "
           "random stream as padded generation, each decoding step run on the rows not yet done."]
          if any(n.endswith("-compact") for n in rep["results"]) else []),
        "- Every variant is timed by the same hooks: a `TrainerCallback` (`on_step_begin` → `on_step_end`, CUDA "
        "synchronised) for the trainers, the same `begin`/`end` calls in the floor's loop.",
    ]
    if rep["schedule"] == "interleaved":
        lines.append("- Interleaved schedule: the variants run in threads that take turns step by step (one runs at a "
                     "time, each with its own RNG stream), so background load changes hit every variant alike.")
    if profile_path:
        lines += ["", f"Profile of one mixrl grpo step (cProfile by cumulative time, mixrl's own functions, torch.profiler "
                      f"operators): [`{profile_path}`]({os.path.relpath(profile_path, md_dir) if md_dir is not None else profile_path})."]
    lines += ["", "<details><summary>per-step seconds (measured steps)</summary>", ""]
    for name, r in rep["results"].items():
        lines.append(f"- `{name}`: " + ", ".join(f"{x.seconds:.3f}" for x in r.measured()))
    lines += ["", "</details>", ""]
    return "\n".join(lines)


def rollout_phase_lines(rep: dict) -> list[str]:
    """The rollout phase of each variant split into its generation and the rest (medians over the measured steps)."""
    rows = [r for r in summary_rows(rep) if r.get("generate_s")]
    if not rows:
        return []
    lines = ["", "## Rollout phase", "",
             "| variant | rollout s | generate s | scoring + reward + mixing s | generate / rollout | rollout / step |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        roll, gen, step = r["rollout_s"], r["generate_s"], r["step_s"]
        lines.append(f"| `{r['variant']}` | {fmt(roll)} | {fmt(gen)} | {fmt(roll - gen if roll is not None else None)} "
                     f"| {fmt(gen / roll if roll else None, '.2f')} | {fmt(roll / step if roll and step else None, '.2f')} |")
    lines += ["", "*generate*: the rollout's generation calls (`_generate_single_turn`; the floor's `model.generate`), "
              "including decoding its ids into rows; the rest: decoding to text, the no-grad scoring forwards (old/reference "
              "log-probs, where the run needs them), the reward, advantages and mixing."]
    return lines


def to_json(rep: dict) -> dict:
    d = {k: v for k, v in rep.items() if k not in ("results", "profile_text")}
    d["results"] = {k: asdict(v) for k, v in rep["results"].items()}
    d["summary"] = summary_rows(rep)
    d["ratios"] = ratios(rep)
    return d
