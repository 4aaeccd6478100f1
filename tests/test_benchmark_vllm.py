"""``mixrl eval MODEL benchmarks=... benchmarks.backend=vllm``: vLLM's offline engine (the CPU
build here) generates the benchmark samples. Run in .venv-vllm (``make test-vllm``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "benchmarks"


def _eval(model: str, tmp_path: Path, backend: str, out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "mixrl.cli.main", "eval", model, "benchmarks=[arith,amc23]", f"benchmarks.backend={backend}",
           f"benchmarks.source_dir={FIXTURES}", f"benchmarks.cache_dir={tmp_path / backend}", "trainer.eval_size=32",
           "benchmarks.amc23.protocol.samples=4", "benchmarks.amc23.protocol.max_new_tokens=8", "hardware.torch_threads=1",
           "logger.progress=false", "--out", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "paper:" not in proc.stdout and "avg@k [95% CI]" in proc.stdout
    return json.loads(out.read_text())


@pytest.mark.vllm
def test_vllm_generates_the_benchmarks_and_greedy_agrees_with_hf(tiny_model_path, tmp_path):
    v = _eval(tiny_model_path, tmp_path, "vllm", tmp_path / "vllm.json")
    h = _eval(tiny_model_path, tmp_path, "hf", tmp_path / "hf.json")
    assert v["backend"] == "vllm" and h["backend"] == "hf"
    (va, vm), (ha, hm) = v["benchmarks"], h["benchmarks"]
    assert va["backend"] == "vllm" and va["generated"] == 32 and vm["generated"] == 2 * 4
    # greedy on the same float32 weights: the same completions up to kernel ties
    vs = {r["problem"]: r["completion"] for r in map(json.loads, Path(va["samples_file"]).read_text().splitlines())}
    hs = {r["problem"]: r["completion"] for r in map(json.loads, Path(ha["samples_file"]).read_text().splitlines())}
    assert sum(vs[i] == hs[i] for i in range(32)) >= 30
    assert abs(va["metrics"]["avg@1"]["value"] - ha["metrics"]["avg@1"]["value"]) <= 2 / 32
    assert set(vm["metrics"]) == {"avg@4", "pass@4", "maj@4"}
