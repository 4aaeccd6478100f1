"""mixrl's engine-mismatch correction equals TRL's vLLM importance-sampling correction.

TRL's own ``GRPOTrainer`` and mixrl's ``algo=grpo`` train one step on the same batch whose
rollouts carry engine log-probs, as they do when vLLM generates, without vLLM: both
trainers are told ``use_vllm`` after they are built (so TRL takes its vLLM branches in
``_generate_and_score_completions`` and ``_compute_loss``), and
``trl.GRPOTrainer._generate_single_turn`` (what vLLM generation returns through) is replaced
by fixed completions (``tests/ddp_worker.fixed_completion``) with fake engine log-probs: the
trainer's own log-probs plus a known per-token perturbation (large enough that some rows
or tokens fall outside [C_min, C_max]; one token without a log-prob, as vLLM reports NaN).
The loss and the whole gradient must agree to 1e-6; with mixrl's correction turned off
they must not (so the comparison can fail).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.conftest import FAST
from tests.ddp_worker import fixed_completion


def _perturbation(row: int, t: int) -> float:
    """engine log-prob - trainer log-prob of token t of rollout ``row``: a per-row drift
    (-0.15 .. +0.15 per token) plus a wiggle, so sequence ratios span ~e^-3 .. e^3."""
    return 0.075 * ((row % 5) - 2) + 0.05 * math.sin(1.3 * t + row)


def _patch_generation(calls: list):
    import trl

    def generate(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        tok = self.processing_class
        dev = self.accelerator.device
        completions, logprobs = [], []
        for i, ids in enumerate(prompt_ids):
            prompt = tok.decode(ids, skip_special_tokens=True)
            c = list(tok(text=fixed_completion(prompt, i % num_generations), add_special_tokens=False)["input_ids"])
            c.append(tok.eos_token_id)
            full = torch.tensor([list(ids) + c], device=dev)
            with torch.no_grad():
                lp, _, _ = self._get_per_token_logps_and_entropies(self.model, full, torch.ones_like(full), len(c))
            row = [float(x) + _perturbation(i, t) for t, x in enumerate(lp[0].tolist())]
            if i == 3:
                row[0] = None  # vLLM reports a NaN log-prob as None
            completions.append(c)
            logprobs.append(row)
        calls.append(len(prompt_ids))
        return completions, logprobs

    trl.GRPOTrainer._generate_single_turn = generate


def _one_step(trainer) -> tuple[float, torch.Tensor, list[dict]]:
    """Train one optimizer step; the loss of its one micro-batch and the accumulated gradient."""
    from transformers import TrainerCallback

    grads: list[torch.Tensor] = []

    class Grab(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            grads.append(torch.cat([
                (p.grad if p.grad is not None else torch.zeros_like(p)).detach().flatten().double().cpu()
                for _, p in kwargs["model"].named_parameters() if p.requires_grad
            ]))

    losses: list[float] = []
    compute = trainer._compute_loss

    def recording(*a, **k):
        loss = compute(*a, **k)
        losses.append(float(loss.detach()))
        return loss

    trainer._compute_loss = recording
    trainer.add_callback(Grab())
    trainer.use_vllm = True  # TRL's vLLM branches, without a vLLM engine (generation is patched)
    trainer.train()
    assert len(losses) == 1 and len(grads) == 1
    return losses[0], grads[0], [r for r in trainer.state.log_history if "train_runtime" not in r]


def _cfg(tiny_model_path, run_dir: Path, extra: list[str]):
    from mixrl.config.compose import compose_config

    return compose_config([
        *FAST, "algo=grpo", "algo.advantage.eps=1e-4", "trainer.max_steps=1", "trainer.micro_batch_size=16",
        f"model.path={tiny_model_path}", f"run_dir={run_dir}", *extra,
    ])


def _mixrl(cfg, out_dir: Path):
    from omegaconf import OmegaConf

    from mixrl.config.builders import build_objective
    from mixrl.trainer import build
    from mixrl.trainer.callbacks import MetricsJsonlCallback

    # the fake engine log-probs differ from the trainer's on purpose (a known perturbation), which the
    # weight-sync check (mixrl.trainer.generation.engine_sync) would rightly stop as a broken sync: log only
    cfg = OmegaConf.merge(cfg, {"hardware": {"vllm_sync_tolerance": float("inf")}})
    trainer = build.trainer_from_config(
        cfg, run_dir=out_dir, callbacks=[MetricsJsonlCallback(out_dir / "metrics.jsonl")],  # as mixrl train writes it
    )
    assert trainer.spec.sync_tolerance == float("inf")
    # the objective mixrl builds when vLLM generates (the trainer was built with vLLM off)
    vllm_cfg = OmegaConf.merge(cfg, {"hardware": {"use_vllm": True}})
    trainer.objective = build_objective(vllm_cfg)
    return trainer


def _trl(cfg, out_dir: Path):
    """Plain ``trl.GRPOTrainer`` with the GRPOConfig mixrl builds (as bench/variants.py's ``trl``
    variant: ``dapo`` = token-mean over the step's tokens, eps 0.2 both sides, group-scaled rewards)."""
    from transformers import PrinterCallback
    from trl import GRPOTrainer

    from mixrl.trainer import build

    model_path = build.resolve_model_path(cfg, progress=False)
    funcs, weights = build.build_reward_funcs(cfg)
    args = build.grpo_args(cfg, out_dir)
    args.reward_weights = weights
    args.loss_type = "dapo"
    args.epsilon = args.epsilon_high = 0.2
    args.scale_rewards = "group"
    trainer = GRPOTrainer(model=model_path, reward_funcs=funcs, args=args, train_dataset=build.load_train_rows(cfg),
                          processing_class=build.load_tokenizer(model_path, cfg))
    trainer.remove_callback(PrinterCallback)
    return trainer


def _run(kind: str, cfg, out_dir: Path):
    import trl
    from transformers import set_seed

    original = trl.GRPOTrainer._generate_single_turn
    calls: list = []
    try:
        _patch_generation(calls)
        torch.set_num_threads(1)
        set_seed(int(cfg.seed))
        trainer = (_mixrl if kind == "mixrl" else _trl)(cfg, out_dir)
        result = _one_step(trainer)
    finally:
        trl.GRPOTrainer._generate_single_turn = original
    assert calls, "the patched generation was not used"
    return result, trainer


def _last(history: list[dict], key: str) -> float:
    values = [r[key] for r in history if key in r]
    assert values, f"{key} was not logged"
    return float(values[-1])


@pytest.mark.parametrize("mode,bounds", [
    ("sequence_mask", []),  # TRL's defaults: C_max 3, no C_min
    ("token_truncate", ["algo.engine_correction.c_min=0.9", "algo.engine_correction.c_max=1.1"]),
    ("token_mask", ["algo.engine_correction.c_min=0.9", "algo.engine_correction.c_max=1.1"]),
    ("sequence_truncate", ["algo.engine_correction.c_min=0.5", "algo.engine_correction.c_max=2"]),
])
def test_mixrl_grpo_equals_trl_with_engine_logprobs(tiny_model_path, tmp_path, mode, bounds):
    cfg = _cfg(tiny_model_path, tmp_path / "run", [f"algo.engine_correction.mode={mode}", *bounds])
    (trl_loss, trl_grad, trl_log), trl_trainer = _run("trl", cfg, tmp_path / "trl")
    (mix_loss, mix_grad, mix_log), mix_trainer = _run("mixrl", cfg, tmp_path / "mixrl")
    assert trl_trainer.vllm_importance_sampling_mode == mode and mix_trainer.objective.engine_correction.mode == mode

    # mixrl's and TRL's computations of one batch: they differ by up to 9e-7 on one CPU, and the difference
    # moves by up to 4e-7 between kernel sets (`make tolerances`, avx2 vs default), where 1e-6 left a margin under 2x
    assert mix_loss == pytest.approx(trl_loss, abs=1e-5)
    scale = float(trl_grad.abs().max())
    assert scale > 1e-4  # a real gradient
    assert float((mix_grad - trl_grad).abs().max()) <= 1e-5 * max(1.0, scale)  # measured up to 1.5e-7, moving 9e-8

    # the batch really is corrected: some rows (tokens) are outside [C_min, C_max]
    frac = _last(mix_log, "engine/masked_frac" if mode.endswith("mask") else "engine/truncated_frac")
    assert 0.0 < frac < 1.0
    # mixrl's mismatch metrics agree with TRL's own on the same batch
    assert _last(mix_log, "engine/logp_diff/mean") == pytest.approx(_last(trl_log, "sampling/sampling_logp_difference/mean"), abs=1e-5)
    assert _last(mix_log, "engine/logp_diff/max") == pytest.approx(_last(trl_log, "sampling/sampling_logp_difference/max"), abs=1e-5)
    assert _last(mix_log, "engine/ratio/min") <= _last(mix_log, "engine/ratio/median") <= _last(mix_log, "engine/ratio/max")
    # ... and reach metrics.jsonl (the trackers get the same log dict)
    import json

    row = json.loads((tmp_path / "mixrl" / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["engine/logp_diff/mean"] == pytest.approx(_last(mix_log, "engine/logp_diff/mean"))
    assert {"engine/ratio/p05", "engine/ratio/p95"} <= set(row)

    if mode == "sequence_mask":  # the comparison can fail: without the correction mixrl trains something else
        off = _cfg(tiny_model_path, tmp_path / "run_off", ["algo.engine_correction.enabled=false"])
        (off_loss, off_grad, _), off_trainer = _run("mixrl", off, tmp_path / "mixrl_off")
        assert off_trainer.objective.engine_correction is None
        assert abs(off_loss - trl_loss) > 1e-4 or float((off_grad - trl_grad).abs().max()) > 1e-4 * scale
        assert float((off_grad - trl_grad).abs().max()) > 1e-3 * scale
