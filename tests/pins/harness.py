"""Trainer-level pin harness: build the trainer as ``mixrl.trainer.run.train`` does, train a
step (or two), and summarise what the objective did.

``run_one_step(overrides, model_path, out_dir) -> dict`` composes ``overrides`` plus
``model.path=<model_path>`` and ``run_dir=<out_dir>/run``, builds the trainer with the
assembly ``run.train`` uses (``mixrl.trainer.build.trainer_from_config``), runs ``trainer.train()``
for ``trainer.max_steps`` optimizer steps (one, or two for ``trainer.num_iterations=2``:
TRL then reuses one generation batch for two optimizer steps) and returns::

    {"losses":  [float per call of trainer._compute_loss, in call order],
     "metrics": [{numeric key: value} per logged step, from trainer.state.log_history],
     "grads":   [{"numel", "norm", "proj": [4 floats]} per optimizer step]}

``grads`` summarises the gradient seen at ``on_pre_optimizer_step`` (after accumulation;
clipping is off in the pinned overrides): the global L2 norm and the projections onto 4
fixed random vectors (``torch.Generator().manual_seed(0)``, float64 normal, over the
concatenation of every trainable parameter's flattened gradient in ``named_parameters``
order; a missing gradient counts as zeros).

No sampling: ``trl.GRPOTrainer._generate_single_turn`` (which mixrl's override calls
for rollouts) is replaced by a fixed function of the prompt and the rollout's slot in its
group (``fixed_completion``, the trick of ``tests/ddp_worker.py``).

Only APIs meant to survive the objective refactor are used: ``compose_config``,
``mixrl.trainer.build.trainer_from_config``, ``trainer._compute_loss`` and
``trl.GRPOTrainer._generate_single_turn``.
"""

from __future__ import annotations

import math
import os
import re
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")

import torch  # noqa: E402

NUM_PROJECTIONS = 4
#: log_history keys that are not a function of the computation (wall-clock)
_VOLATILE = re.compile(r"(time|runtime|per_second|flos)", re.IGNORECASE)


# the unsampled rollouts of the two-process test (tests/ddp_worker.py): the same completions here
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ddp_worker import fixed_completion, patch_generation  # noqa: E402,F401


_PROJ_CACHE: dict[int, torch.Tensor] = {}


def _projection_vectors(numel: int) -> torch.Tensor:
    if numel not in _PROJ_CACHE:
        g = torch.Generator().manual_seed(0)
        _PROJ_CACHE[numel] = torch.randn(NUM_PROJECTIONS, numel, generator=g, dtype=torch.float64)
    return _PROJ_CACHE[numel]


def grad_summary(model) -> dict:
    grads = [
        (p.grad if p.grad is not None else torch.zeros_like(p)).detach().flatten().double().cpu()
        for _, p in model.named_parameters()
        if p.requires_grad
    ]
    flat = torch.cat(grads)
    proj = _projection_vectors(flat.numel()) @ flat
    return {"numel": int(flat.numel()), "norm": float(flat.norm()), "proj": [float(x) for x in proj]}


def _numeric(row: dict) -> dict:
    out = {}
    for k, v in row.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or _VOLATILE.search(k):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            continue
        out[k] = float(v)
    return out


def run_one_step(overrides: list[str], model_path: str, out_dir, completion=None) -> dict:
    """Build the trainer as ``run.train`` does, train ``trainer.max_steps`` steps, summarise.
    TRL's generation is patched for the call only (later tests sample as usual): rollouts are
    ``fixed_completion`` (the first 21 cases), or ``completion(prompt text, slot)`` when given
    (``rollouts.tolerant_completion``: prompts with a hint or a prefix)."""
    import trl

    original = trl.GRPOTrainer._generate_single_turn
    try:
        return _run_one_step(overrides, model_path, out_dir, completion)
    finally:
        trl.GRPOTrainer._generate_single_turn = original


def _run_one_step(overrides: list[str], model_path: str, out_dir, completion=None) -> dict:
    from transformers import TrainerCallback

    from mixrl.config.compose import compose_config
    from mixrl.trainer import build

    if completion is None:
        patch_generation()
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from rollouts import patch_generation_with

        patch_generation_with(completion)
    out_dir = Path(out_dir)
    cfg = compose_config([*overrides, f"model.path={model_path}", f"run_dir={out_dir / 'run'}"])
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)

    grads: list[dict] = []

    class GradSummary(TrainerCallback):  # after accumulation, before the optimizer step
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            grads.append(grad_summary(kwargs["model"]))

    trainer = build.trainer_from_config(cfg, callbacks=[GradSummary()])  # seed, threads and inputs as mixrl train
    losses: list[float] = []
    compute_loss = trainer._compute_loss  # the bound method

    def recording_compute_loss(*args, **kwargs):
        loss = compute_loss(*args, **kwargs)
        losses.append(float(loss.detach()))
        return loss

    trainer._compute_loss = recording_compute_loss
    trainer.train()
    metrics = [_numeric(row) for row in trainer.state.log_history if "train_runtime" not in row]
    return {"losses": losses, "metrics": metrics, "grads": grads, "steps": int(trainer.state.global_step)}
