"""Real two-process DDP on CPU (``torchrun --nproc_per_node 2``, gloo) against one process.

LUFFY (group injection): with 3 prompts x 4 generations = 12 rows and 2 processes of 6
rows, group 1 (rows 4..7) straddles the processes. Every group must get exactly ``k``
expert rows, in its last ``k`` slots, holding that group's own prompt's expert solution;
``k = 3`` puts the straddling group's expert rows on both processes. Row sources,
advantages and each row's contribution to the step objective must equal the 1-process
run's, and so must the all-reduced gradient.

CHORD (auxiliary expert rows): the gradient of one step, hence the balance mu between
the RL and the SFT term, must not change with the number of processes (1, 2) or with
gradient accumulation (1 or 2 micro-batches per process).

The step runs through ``trainer.train()`` (TRL's shuffling, splitting, ``no_sync``
accumulation and DDP all-reduce); ``tests/ddp_worker.py`` makes rollouts a fixed
function of prompt and slot and records what each row did (see its docstring). A third
launch runs the real CLI, ``torchrun --nproc_per_node 2 -m mixrl.cli.main train``, for one
step. The launches run at the same time to keep the wall-clock down.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
WORKER = HERE / "ddp_worker.py"
TIMEOUT_S = 420  # per launch; a loaded 2-core machine needs ~30-60 s
RTOL = 1e-5

# (world size, cases): ALGO:MICRO_BATCH_SIZE[:EXPERTS_PER_GROUP]; 12 rollouts per step
LAUNCHES = {
    1: ["luffy:12", "luffy:12:3", "chord:12", "chord:6", "grpo:12"],
    2: ["luffy:6", "luffy:3:3", "chord:6", "chord:3", "grpo:6::40"],
}


# the real CLI under torchrun: GRPO, 2 prompts x 2 generations, one step, no evaluation
CLI_OVERRIDES = [
    "hardware.num_processes=2", "trainer.prompts_per_step=2", "algo.num_generations=2", "trainer.max_steps=1",
    "trainer.eval_size=0", "trainer.max_completion_length=8", "data.train_size=8", "logger.progress=false",
]


def _worker_module():
    spec = importlib.util.spec_from_file_location("ddp_worker", WORKER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _gloo_unavailable() -> str | None:
    import torch.distributed as dist

    if not dist.is_available():
        return "torch.distributed is not available in this torch build"
    if not dist.is_gloo_available():
        return "torch.distributed has no gloo backend (needed for DDP on CPU)"
    return None


def _launch(cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "w") as f:  # the child keeps its own handle
        return subprocess.Popen(cmd, env=env, cwd=HERE.parent, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def _wait(proc: subprocess.Popen) -> int | str:
    """Exit status, or "timeout" after killing torchrun and its workers (its process group)."""
    try:
        return proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return "timeout"


@pytest.fixture(scope="module")
def ddp_runs(tiny_model_path, tmp_path_factory) -> Path:
    """Runs the worker with 1 and with 2 processes, and the CLI with 2 (all at once); returns
    the output folder (worker JSON/gradients, ``cli.log``, ``cli.rc``, ``cli-run/``)."""
    reason = _gloo_unavailable()
    if reason:
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("ddp")
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", WANDB_MODE="disabled",
        OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [str(HERE.parent), env.get("PYTHONPATH")])),
    )
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cli = _launch(
        [*torchrun, "--nproc_per_node=2", "-m", "mixrl.cli.main", "train", *CLI_OVERRIDES,
         f"model.path={tiny_model_path}", f"run_dir={out / 'cli-run'}"],
        env, out / "cli.log",
    )
    procs = {}
    for world, cases in LAUNCHES.items():
        cmd = [*torchrun, f"--nproc_per_node={world}", str(WORKER), "--model", tiny_model_path, "--out", str(out)]
        for case in cases:
            cmd += ["--case", case]
        procs[world] = _launch(cmd, env, out / f"w{world}.log")
    failures = []
    for world, proc in procs.items():
        rc = _wait(proc)
        if rc != 0:
            tail = "\n".join((out / f"w{world}.log").read_text().splitlines()[-40:])
            failures.append(f"torchrun --nproc_per_node {world} failed ({rc}):\n{tail}")
    (out / "cli.rc").write_text(str(_wait(cli)))
    assert not failures, "\n\n".join(failures)
    return out


def _load(out: Path, name: str) -> tuple[dict, torch.Tensor]:
    return json.loads((out / f"{name}.json").read_text()), torch.load(out / f"{name}.grad.pt")


def _assert_run_consistent(run: dict, grad: torch.Tensor) -> None:
    """Within one run: each micro-batch loss is the sum of its rows, all ranks hold the same
    gradient, and the normalisers are the same on every rank."""
    for mb in run["micro_batches"]:
        assert mb["sum_rows"] == pytest.approx(mb["loss"], rel=RTOL, abs=1e-7), (run["name"], mb)
    assert len(run["micro_batches"]) == run["world"] * run["grad_accum"]
    assert all(n == pytest.approx(run["grad_norms"][0], rel=1e-9) for n in run["grad_norms"]), run["grad_norms"]
    assert float(grad.norm()) == pytest.approx(run["grad_norms"][0], rel=1e-9)
    assert all(n == run["normalisers"][0] for n in run["normalisers"])


def _assert_same_step(ref: tuple[dict, torch.Tensor], other: tuple[dict, torch.Tensor]) -> None:
    """Same rows (source, advantage, text), same per-row contributions, same gradient."""
    (a, ga), (b, gb) = ref, other
    assert [r["gid"] for r in a["rows"]] == [r["gid"] for r in b["rows"]], b["name"]
    for ra, rb in zip(a["rows"], b["rows"]):
        where = f"{b['name']} row {ra['gid']}"
        assert (rb["prompt"], rb["completion"], rb["source"]) == (ra["prompt"], ra["completion"], ra["source"]), where
        assert rb["advantage"] == pytest.approx(ra["advantage"], rel=RTOL, abs=1e-6), where
        assert rb["contribution"] == pytest.approx(ra["contribution"], rel=RTOL, abs=1e-7), where
    total_a = sum(r["contribution"] for r in a["rows"])
    assert sum(r["contribution"] for r in b["rows"]) == pytest.approx(total_a, rel=RTOL, abs=1e-7), b["name"]
    rel = float((gb - ga).norm() / ga.norm())
    assert ga.norm() > 0 and rel < RTOL, f"{b['name']}: gradient differs from {a['name']} by {rel:.2e} (relative)"


# --------------------------------------------------------------------------- LUFFY
@pytest.mark.slow
@pytest.mark.parametrize("name", ["luffy-w1-m12", "luffy-w2-m6", "luffy-k3-w1-m12", "luffy-k3-w2-m3"])
def test_luffy_every_group_gets_k_expert_rows_by_global_index(ddp_runs, name):
    run, grad = _load(ddp_runs, name)
    _assert_run_consistent(run, grad)
    fixed_completion = _worker_module().fixed_completion
    G, k, W = run["num_generations"], run["experts_per_group"], run["world"]
    rows = run["rows"]
    assert [r["gid"] for r in rows] == list(range(12)) and k == (3 if "-k3-" in name else 1)
    assert [r["rank"] for r in rows] == [i * W // 12 for i in range(12)]  # row i lives on rank i // (12 / W)
    groups = [rows[g * G : (g + 1) * G] for g in range(len(rows) // G)]
    for g, group in enumerate(groups):
        prompt = group[0]["prompt"]
        assert all(r["prompt"] == prompt for r in group), f"group {g} mixes prompts: TRL's row layout changed"
        sources = [r["source"] for r in group]
        assert sources == [0] * (G - k) + [1] * k, f"{name}: group {g} (rows {g * G}..{g * G + G - 1}) sources {sources}"
        for slot, r in enumerate(group):
            if slot >= G - k:  # the expert's solution of this group's own prompt
                assert r["completion"] in run["experts"][prompt], (name, g, slot, r["completion"])
            else:
                assert r["completion"] == fixed_completion(prompt, slot), (name, g, slot)
        if W > 1 and g == 1:  # the straddling group: rows on both ranks, and with k = 3 expert rows on both
            assert {r["rank"] for r in group} == {0, 1}
            if k == 3:
                assert {r["rank"] for r in group if r["source"] == 1} == {0, 1}
    assert any(r["advantage"] != 0 for r in rows), "degenerate test data: every advantage is zero"


@pytest.mark.slow
@pytest.mark.parametrize(("ref", "other"), [("luffy-w1-m12", "luffy-w2-m6"), ("luffy-k3-w1-m12", "luffy-k3-w2-m3")])
def test_luffy_two_processes_match_one_process(ddp_runs, ref, other):
    """Row sources, advantages, per-row losses and the reduced gradient of the 2-process
    step (1 or 2 micro-batches per process) equal those of one process on the same rows."""
    a, b = _load(ddp_runs, ref), _load(ddp_runs, other)
    _assert_run_consistent(*a)
    _assert_run_consistent(*b)
    assert (a[0]["world"], b[0]["world"]) == (1, 2)
    _assert_same_step(a, b)


# --------------------------------------------------------------------------- token budget
@pytest.mark.slow
def test_token_budget_two_processes_match_one_process(ddp_runs):
    """``trainer.max_tokens_per_micro_batch=40`` over 2 processes (6 rows each, several micro-batches
    of varied row counts, as many on both ranks) against one process with one micro-batch of 12
    rows: the same rows, per-row losses and reduced gradient (relative 1e-5, float32)."""
    a, b = _load(ddp_runs, "grpo-w1-m12"), _load(ddp_runs, "grpo-w2-m6-b40")
    counts = [sum(1 for mb in b[0]["micro_batches"] if mb["rank"] == r) for r in (0, 1)]
    assert counts[0] == counts[1] > 1, counts  # split, and as many micro-batches on every rank
    for mb in b[0]["micro_batches"]:
        assert mb["sum_rows"] == pytest.approx(mb["loss"], rel=RTOL, abs=1e-7), mb
    assert b[0]["grad_norms"][0] == pytest.approx(b[0]["grad_norms"][1], rel=1e-9)
    _assert_same_step(a, b)


# --------------------------------------------------------------------------- CHORD
@pytest.mark.slow
@pytest.mark.parametrize("other", ["chord-w1-m6", "chord-w2-m6", "chord-w2-m3"])
def test_chord_balance_independent_of_processes_and_accumulation(ddp_runs, other):
    """CHORD's step gradient (hence the RL/SFT balance mu) with 1 process and one
    micro-batch equals that with gradient accumulation 2, with 2 processes, and with both."""
    a, b = _load(ddp_runs, "chord-w1-m12"), _load(ddp_runs, other)
    _assert_run_consistent(*a)
    _assert_run_consistent(*b)
    assert a[0]["grad_accum"] == 1 and (b[0]["world"], b[0]["grad_accum"]) != (1, 1)
    rows = a[0]["rows"]
    assert sum(r["source"] == 1 for r in rows) == 4 and sum(r["source"] == 0 for r in rows) == 12
    assert all(r["advantage"] == 0 for r in rows if r["source"] == 1)
    assert all(r["completion"] in a[0]["experts"][r["prompt"]] for r in rows if r["source"] == 1)
    if b[0]["world"] == 2:  # the expert rows really are split over both processes
        assert {r["rank"] for r in b[0]["rows"] if r["source"] == 1} == {0, 1}
    _assert_same_step(a, b)


# --------------------------------------------------------------------------- launching
@pytest.mark.slow
def test_cli_train_runs_under_torchrun_two_processes(ddp_runs):
    """``torchrun --nproc_per_node 2 -m mixrl.cli.main train hardware.num_processes=2 ...``
    trains one step and writes one run directory (summary.json, model/)."""
    rc = (ddp_runs / "cli.rc").read_text()
    log = "\n".join((ddp_runs / "cli.log").read_text().splitlines()[-30:])
    assert rc == "0", f"the CLI under torchrun failed ({rc}):\n{log}"
    run_dir = ddp_runs / "cli-run"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 1 and (run_dir / "model").is_dir()


def test_num_processes_is_checked_against_world_size(monkeypatch):
    from mixrl.config.compose import compose_config
    from mixrl.errors import ConfigError

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="num_processes"):
        compose_config(["hardware.num_processes=1"])
