"""``reward=model`` (the built-in tiny reward model) under two processes (``hardware=cpu-2proc``: each
process loads its own frozen copy and scores its own rows): it trains 2 steps and logs the reward model's
score every step. Under vLLM generation: tests/test_vllm_cpu.py (``make test-vllm``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN = ["trainer.max_steps=2", "trainer.prompts_per_step=4", "algo.num_generations=4", "trainer.eval_size=8",
       "trainer.max_completion_length=24", "data.train_size=64", "logger.progress=false", "hardware.torch_threads=1",
       "reward=model"]


@pytest.fixture(scope="module")
def tiny_rm(tmp_path_factory) -> str:
    from mixrl.models.tiny_rm import build_tiny_rm

    return str(build_tiny_rm(tmp_path_factory.mktemp("tiny-rm"), steps=20))


def _train(tmp_path: Path, *overrides: str) -> Path:
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MIXRL_LAUNCHED")}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "mixrl.cli.main", "train", *RUN, *overrides, f"run_dir={run_dir}"],
                          env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return run_dir


def _scores(run_dir: Path) -> list[float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r["reward_model/score"] for r in rows if "reward_model/score" in r]


@pytest.mark.slow
def test_the_reward_model_scores_under_two_processes(tiny_model_path, tiny_rm, tmp_path):
    run = _train(tmp_path, "hardware=cpu-2proc", f"model.path={tiny_model_path}", f"reward.params.path={tiny_rm}")
    scores = _scores(run)
    assert len(scores) == 2 and all(0 < s < 1 for s in scores)
    assert json.loads((run / "summary.json").read_text())["steps"] == 2


# under vLLM generation (hardware=cpu-vllm): tests/test_vllm_cpu.py::test_colocate_grpo_three_steps_scored_by_the_reward_model
# (one engine start for both the colocate GRPO run and the reward model's scores)
