"""Peak memory of one training step, measured, beside ``mixrl plan``'s estimate for the same config.

    python -m bench.memory                                  # grpo, chord, teacher (kdrl) on the built-in tiny model
    python -m bench.memory --model builtin:tiny-bpe         # any model.path: a folder, a builtin
    python -m bench.memory --set trainer.micro_batch_size=8 --json mem.json --out mem.md

Each variant (``grpo``; ``chord``: rollouts + expert SFT rows; ``teacher``: ``algo=kdrl``, a
reverse KL to the built-in teacher, whose forward runs once per generation batch) is built the
way ``mixrl train`` builds it and trains ``--steps`` steps (default 2: the first creates the
optimizer state); the last step runs under ``torch.profiler`` with ``profile_memory=True``.
Completions are ``max_completion_length`` tokens long (eos suppressed, ``--lengths fixed``), the
length the plan assumes; ``--lengths sampled`` lets them stop at eos.

Measured (CPU): the **torch-allocator peak**, not RSS. The profiler records every allocation
and free of torch tensors; their running sum over the step, from the step's start, peaks at
``transient``. What was already live when the step began, ``resident``, is counted from the
tensors the trainer holds: parameters, gradients and optimizer state of the policy, the
reference and teacher models' parameters (each storage once). ``measured peak = resident +
transient``. Python objects, the tokenizer, and memory the allocator keeps cached are not in
it (RSS would include them, and on Linux a large ``torch.empty`` that is never touched does not
count in RSS at all, while the allocator peak counts it). On CUDA it is
``torch.cuda.max_memory_allocated`` over the step.

Planned: :func:`mixrl.plan.estimate` for the same config (per process, CPU path: the fused LM
head scores every position) and the prompt width the step really had (the longest tokenized
prompt, chat template included), with its parts, so each can be checked against the measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from bench.report import write_text
from bench.variants import build_mixrl_trainer, compose, lengths_kwargs, run_overrides

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

MB = 1024**2
VARIANTS = {"grpo": "grpo", "chord": "chord", "teacher": "kdrl"}
PLAN_PARTS = ("weights", "gradients", "optimizer", "reference", "teachers", "activations", "lm_head", "generation")


def _storages(tensors) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None and hasattr(t, "untyped_storage"):
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def resident_bytes(trainer) -> int:
    """Bytes of the tensors the trainer holds between steps (each storage once)."""
    tensors = []
    models = [trainer.model] + [m for m in (getattr(trainer, "ref_model", None),) if m is not None]
    models += trainer.parts.teachers.frozen if trainer.parts.teachers is not None else []
    for m in models:
        for p in m.parameters():
            tensors += [p, p.grad]
        tensors += list(m.buffers())
    opt = getattr(trainer, "optimizer", None)
    if opt is not None:
        for state in opt.state.values():
            tensors += [v for v in state.values() if hasattr(v, "untyped_storage")]
    return _storages(tensors)


def _profiled_peak(prof) -> int:
    """The highest running sum of CPU allocations minus frees recorded by ``prof``."""
    import torch  # deferred: torch loads only when something is measured (`--help` and the report stay light)

    events = [e for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
    cur = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        cur += e.nbytes()
        peak = max(peak, cur)
    return peak


def measure(name: str, overrides: list[str], steps: int, device: str, out_dir: Path, lengths: str = "fixed") -> dict:
    """Train ``steps`` steps of one variant; the last one profiled. Returns measured and planned bytes.
    ``lengths``: "fixed" (every completion max_completion_length tokens) or "sampled" (stop at eos)."""
    import torch  # deferred: torch loads only when something is measured (`--help` and the report stay light)
    from transformers import TrainerCallback  # deferred: transformers loads only when a model is built or measured

    from mixrl.plan import default_prompt_tokens, estimate, model_shape  # deferred: imports torch (the config and CLI layers stay light until a run is built)

    if name == "teacher" and not any(o.startswith("teacher") for o in overrides):
        model = next((o.split("=", 1)[1] for o in overrides if o.startswith("model.path=")), "builtin:tiny")
        if model != "builtin:tiny":  # the built-in teacher has the character tokenizer: a frozen copy of the policy instead
            overrides = [*overrides, "teacher=model", f"teacher.source.models=[{model}]"]
    cfg = compose(VARIANTS[name], overrides, steps)
    box: dict = {}

    class Probe(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == steps - 1:
                box["resident"] = resident_bytes(box["trainer"])
                if device == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    box["cuda_base"] = torch.cuda.memory_allocated()
                else:
                    box["prof"] = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
                    box["prof"].__enter__()

        def on_step_end(self, args, state, control, **kwargs):
            if "prof" in box and "transient" not in box:
                box["prof"].__exit__(None, None, None)
                box["transient"] = _profiled_peak(box["prof"])
            elif device == "cuda" and "cuda_base" in box and "transient" not in box:
                torch.cuda.synchronize()
                box["transient"] = torch.cuda.max_memory_allocated() - box["cuda_base"]

    trainer = build_mixrl_trainer(cfg, out_dir / name, [Probe()], generation_kwargs=lengths_kwargs(cfg, lengths))
    box["trainer"] = trainer
    generate = trainer._generate_and_score_completions

    def widest_prompt(inputs):  # the padded prompt width the step trained on (tokenizer and chat template included)
        out = generate(inputs)
        box["prompt_tokens"] = max(box.get("prompt_tokens", 0), int(out["prompt_ids"].shape[1]))
        return out

    trainer._generate_and_score_completions = widest_prompt
    trainer.train()
    shape = model_shape(cfg) if not str(cfg.model.path).startswith("builtin:") else _built_shape(trainer)
    plan = estimate(cfg, shape, prompt_tokens=box.get("prompt_tokens") or default_prompt_tokens(cfg))
    return {
        "variant": name, "algo": str(cfg.algo.name), "model": str(cfg.model.path),
        "measured_peak": box["resident"] + box["transient"], "resident": box["resident"], "transient": box["transient"],
        "planned_peak": plan["peak"], "planned": {k: plan.get(k, 0.0) for k in PLAN_PARTS},
        "planned_phases": {"training": plan["train_phase"], "generation": plan["generation_phase"]},
        "rows_per_micro_batch": plan["rows_per_micro_batch"], "seq_tokens": plan["seq_tokens"],
        "prompt_tokens": box.get("prompt_tokens"),
    }


def _built_shape(trainer):
    """The shape of the model the trainer holds (a builtin model resolves to a cached folder)."""
    from mixrl.plan import _shape  # deferred: imports torch (the config and CLI layers stay light until a run is built)

    conf = trainer.accelerator.unwrap_model(trainer.model).config.to_dict()
    return _shape(conf, "the trained model's config")


def markdown(rows: list[dict], argv: list[str]) -> str:
    lines = [f"# Peak memory per step: measured vs `mixrl plan`\n",
             f"`python -m bench.memory {' '.join(argv)}`\n",
             "| variant | measured peak MB | resident MB | step transient MB | planned peak MB | planned / measured | "
             "planned activations MB | planned LM head MB | planned generation MB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r["planned"]
        lines.append(f"| {r['variant']} ({r['algo']}) | {r['measured_peak'] / MB:.1f} | {r['resident'] / MB:.1f} | "
                     f"{r['transient'] / MB:.1f} | {r['planned_peak'] / MB:.1f} | {r['planned_peak'] / r['measured_peak']:.2f} | "
                     f"{p['activations'] / MB:.1f} | {p['lm_head'] / MB:.1f} | {p['generation'] / MB:.1f} |")
    lines.append("\nmeasured peak = resident (parameters, gradients, optimizer state, reference/teacher weights "
                 "at the step's start) + the torch allocator's highest running total of allocations over the step "
                 "(torch.profiler, profile_memory=True); not RSS.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model.path (a folder or a builtin, e.g. builtin:tiny-bpe); default the config's")
    p.add_argument("--only", default=",".join(VARIANTS), help=f"variants (default {','.join(VARIANTS)})")
    p.add_argument("--steps", type=int, default=2, help="steps per variant, the last one measured (default 2)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--lengths", choices=("fixed", "sampled"), default="fixed",
                   help="fixed (default): every completion is max_completion_length tokens (eos suppressed), the "
                   "length the plan assumes; sampled: completions stop at eos")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    p.add_argument("--out", default="", help="Markdown report (default: none)")
    p.add_argument("--json", default="", help="JSON of every measurement (default: none)")
    opts = p.parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    variants = [v.strip() for v in opts.only.split(",") if v.strip()]
    if any(v not in VARIANTS for v in variants) or opts.steps < 1:
        p.error(f"--only takes {', '.join(VARIANTS)}; --steps >= 1")
    import transformers  # deferred: transformers loads only when a model is built or measured

    transformers.utils.logging.set_verbosity_error()
    overrides = run_overrides(opts.set, opts.model, opts.device)
    tmp = Path(tempfile.mkdtemp(prefix="mixrl-bench-mem-"))
    rows = [measure(v, overrides, opts.steps, opts.device, tmp, opts.lengths) for v in variants]
    text = markdown(rows, argv)
    sys.stdout.write(text)
    if opts.out:
        write_text(opts.out, text)
    if opts.json:
        write_text(opts.json, json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
