"""GPU checks: run where CUDA is present, skip otherwise (CI is CPU-only).

* one GPU, bf16: a few training steps of the tiny model with each mixing method's recipe;
* vLLM colocated rollouts (``hardware=gpu-1x80g-vllm``) when vLLM is installed;
* two processes through the launcher: DDP, and DeepSpeed ZeRO-2 when DeepSpeed is installed
  (both need 2 GPUs);
* ``python -m bench.throughput --device cuda`` (a short run).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

ROOT = Path(__file__).resolve().parents[1]
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
SHORT = [
    "trainer.max_steps=3", "trainer.prompts_per_step=4", "algo.num_generations=4", "trainer.micro_batch_size=8",
    "trainer.eval_size=16", "trainer.max_completion_length=24", "data.train_size=64", "logger.progress=false",
    "model.dtype=bfloat16",
]
METHOD_RECIPES = ["grpo/arith-tiny", "chord/arith-tiny", "chord/phi-arith-tiny", "luffy/arith-tiny",
                  "luffy/authors-arith-tiny", "mix/arith-tiny", "sft/arith-tiny", "sft_then_rl/arith-tiny"]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MIXRL_LAUNCHED")}
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    return env


def _cli(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mixrl.cli.main", *args], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", METHOD_RECIPES)
def test_one_gpu_bf16_training_with_each_method(recipe, tiny_model_path, tmp_path):
    from rich.console import Console

    from mixrl.config.compose import compose_config, compose_stages
    from mixrl.trainer.run import train_stages

    overrides = [f"recipe={recipe}", "hardware=gpu-1x80g", *SHORT, f"model.path={tiny_model_path}", f"run_dir={tmp_path / 'run'}"]
    cfg = compose_config(overrides)
    result = train_stages(cfg, compose_stages(cfg, overrides), console=Console(quiet=True))
    s = result.summary
    assert s["steps"] >= 3 and s["accuracy_after"] is not None
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(r.get("loss") is None or r["loss"] == r["loss"] for r in rows)  # finite (NaN != NaN)
    model_cfg = json.loads((Path(s["model_dir"]) / "config.json").read_text())
    assert model_cfg.get("dtype", model_cfg.get("torch_dtype")) == "bfloat16"


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (pip install 'mixrl[vllm]')")
def test_vllm_colocate_rollouts(tiny_model_path, tmp_path):
    run_dir = tmp_path / "run"
    proc = _cli(["train", "hardware=gpu-1x80g-vllm", "hardware.vllm_gpu_memory_utilization=0.2", *SHORT,
                 f"model.path={tiny_model_path}", f"run_dir={run_dir}"])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["rollouts"] == 3 * 16


@pytest.mark.slow
@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("hardware", ["gpu-8x80g", "gpu-8x80g-zero2"])
def test_two_gpu_launch(hardware, tiny_model_path, tmp_path):
    """``mixrl train`` launches 2 processes through accelerate (DDP; DeepSpeed ZeRO-2)."""
    if hardware.endswith("zero2") and importlib.util.find_spec("deepspeed") is None:
        pytest.skip("DeepSpeed is not installed (pip install 'mixrl[deepspeed]')")
    run_dir = tmp_path / "run"
    proc = _cli(["train", f"hardware={hardware}", "hardware.num_processes=2", *SHORT,
                 f"model.path={tiny_model_path}", f"run_dir={run_dir}"])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 3 and "= 2 process(es)" in summary["geometry"]
    assert "accelerate.commands.launch" in (run_dir / "launch" / "command.sh").read_text()
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(str(run_dir / "model"))  # ZeRO-2 saves a plain model


@pytest.mark.slow
def test_bench_throughput_on_cuda(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bench.throughput", "--device", "cuda", "--warmup", "1", "--steps", "2",
                           "--out", str(tmp_path / "bench.md"), "--profile-out", ""], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "grpo" in (tmp_path / "bench.md").read_text()
