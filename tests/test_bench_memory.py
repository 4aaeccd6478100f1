"""``python -m bench.memory``: one profiled training step per variant, measured peak beside
``mixrl plan``'s estimate for the same config (the plan must be neither far above nor below)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def test_measured_step_peak_is_close_to_the_plan(tiny_model_path, tmp_path):
    from bench.memory import main

    out = tmp_path / "mem.json"
    sets = ["trainer.prompts_per_step=4", "algo.num_generations=4", "trainer.micro_batch_size=16",
            "trainer.max_completion_length=24", "data.train_size=64", "hardware.torch_threads=1"]
    rows = main(["--model", tiny_model_path, "--only", "grpo,chord", "--json", str(out),
                 *[x for s in sets for x in ("--set", s)]])
    assert [r["variant"] for r in rows] == ["grpo", "chord"] and json.loads(out.read_text()) == rows
    for r in rows:
        assert 0 < r["resident"] < r["measured_peak"]
        assert r["rows_per_micro_batch"] >= 16
        # the plan (for the prompt width the step had) within 15 % below / 25 % above the allocator peak
        assert 0.85 <= r["planned_peak"] / r["measured_peak"] <= 1.25, r
        assert r["prompt_tokens"] > 0
    assert rows[1]["measured_peak"] > rows[0]["measured_peak"]  # CHORD's expert rows cost memory
