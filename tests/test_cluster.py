"""The cluster path, executed on this host: two "machines" (``hardware.num_machines=2``, ranks 0 and
1 at 127.0.0.1, gloo), the SLURM job script ``mixrl plan --sbatch`` writes, and preemption.

* The SLURM job (2 nodes x 1 process, DDP) runs here with a stand-in ``srun`` on PATH that starts
  the script's per-node command once per node with the variables SLURM sets (``SLURM_NODEID``,
  ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NNODES``, ``SLURM_JOB_NODELIST=127.0.0.1,127.0.0.2``,
  ``SLURM_JOB_ID``) and forwards signals to them as srun does; ``scontrol`` is absent, so the
  script finds machine 0 with ``python -m mixrl.slurm hostnames``. In the middle of step 2 the
  batch shell gets SIGUSR1 (``--signal=B:USR1``): every node stops after step 2 with one
  checkpoint, the script exits 75 and requeues; the same script again (the requeued job,
  ``resume=auto``) trains step 3. The final weights equal, bit for bit, those of one machine
  running both processes (``hardware=cpu-2proc``) uninterrupted: the two-machine rendezvous,
  its checkpoint and its resume change nothing.
* SIGTERM to rank 0's training process only (as a user's ``kill``): both processes stop after the
  same step, the launcher exits 75, ``resume=auto`` ends with the same weights.
* One process: SIGUSR1 in the middle of step 2 -> checkpoint of step 2, exit 75; the same command
  again continues and ends bit for bit equal to an uninterrupted run (the harness of
  ``tests/test_resume.py``).
* FSDP over two machines (``cpu-2proc-fsdp`` with one process per machine, the two ``mixrl train``
  commands started concurrently) ends with the weights of ``cpu-2proc-fsdp`` on one machine.

"In the middle of a step": ``tests/cluster_pause/sitecustomize.py`` (on the runs' PYTHONPATH) makes
step 2's first micro-batch write a marker and sleep; the signal is sent once the marker exists.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_resume import _assert_same_run, _weights
from typer.testing import CliRunner

from mixrl.cli.main import app
from mixrl.errors import PREEMPTED_EXIT
from mixrl.slurm import hostnames

ROOT = Path(__file__).resolve().parents[1]
PAUSE = ROOT / "tests" / "cluster_pause"
TIMEOUT_S = 420
STEPS = ["trainer.max_steps=3", "trainer.save_steps=0", "trainer.save_total_limit=0", "trainer.prompts_per_step=4",
         "algo.num_generations=4", "trainer.micro_batch_size=8", "trainer.eval_size=4",
         "trainer.max_completion_length=16", "data.train_size=32", "logger.progress=false", "logger.samples_per_step=0",
         "hardware.torch_threads=1"]
runner = CliRunner()

# a stand-in for srun: the per-node command once per node, with SLURM's task variables, signals forwarded
FAKE_SRUN = r'''#!{python}
import os, signal, subprocess, sys
args = [a for a in sys.argv[1:] if not a.startswith("--")]
n = int(os.environ["SLURM_NNODES"])
procs = [subprocess.Popen(args, env={{**os.environ, "SLURM_NODEID": str(i), "SLURM_PROCID": str(i), "SLURM_LOCALID": "0",
                                      "SLURM_NTASKS": str(n), "SLURMD_NODENAME": "node%d" % i}}) for i in range(n)]
for s in (signal.SIGTERM, signal.SIGUSR1):
    signal.signal(s, lambda signum, frame: [p.send_signal(signum) for p in procs if p.poll() is None])
codes = [p.wait() for p in procs]
sys.exit(max(codes))
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(pause_dir: Path | None = None, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MIXRL_LAUNCHED")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", WANDB_MODE="disabled",
               OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), str(PAUSE)]))
    if pause_dir is not None:
        pause_dir.mkdir(parents=True, exist_ok=True)
        env.update(STEP_PAUSE_DIR=str(pause_dir), STEP_PAUSE_AT="2", STEP_PAUSE_S="6")
    env.update(extra)
    return env


def _start(argv: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def _train(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    return _start([sys.executable, "-m", "mixrl.cli.main", "train", *args], env, log)


def _wait(proc: subprocess.Popen, log: Path) -> int:
    try:
        return proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"hung past {TIMEOUT_S} s:\n{_tail(log)}")


def _tail(log: Path, n: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:])


def _wait_marker(path: Path, proc: subprocess.Popen, log: Path) -> int:
    t0 = time.time()
    while not path.exists():
        assert proc.poll() is None, f"ended before {path.name}:\n{_tail(log)}"
        assert time.time() - t0 < TIMEOUT_S, f"{path.name} did not appear:\n{_tail(log)}"
        time.sleep(0.05)
    return int(path.read_text())


def _checkpoints(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "trainer").glob("checkpoint-*") if (p / "trainer_state.json").is_file())


@pytest.fixture(scope="module")
def gloo():
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is needed")


@pytest.fixture(scope="module")
def ddp_reference(gloo, tiny_model_path, tmp_path_factory) -> tuple[list[str], Path]:
    """One machine, two processes (hardware=cpu-2proc), 3 steps uninterrupted: (overrides, run dir)."""
    tmp = tmp_path_factory.mktemp("ddp_ref")
    base = [f"model.path={tiny_model_path}", *STEPS]
    run = tmp / "ref"
    rc = _wait(_train(["hardware=cpu-2proc", *base, f"run_dir={run}"], _env(), tmp / "ref.log"), tmp / "ref.log")
    assert rc == 0, _tail(tmp / "ref.log")
    return base, run


# --------------------------------------------------------------------------- SLURM
def test_hostnames_expands_slurm_node_lists():
    assert hostnames("node[01-03,07],gpu5") == ["node01", "node02", "node03", "node07", "gpu5"]
    assert hostnames("a[8-10]b") == ["a8b", "a9b", "a10b"]
    assert hostnames("127.0.0.1,127.0.0.2") == ["127.0.0.1", "127.0.0.2"]


def test_sbatch_script_for_two_nodes_with_a_vllm_server(tmp_path):
    out = tmp_path / "job.sbatch"
    res = runner.invoke(app, ["plan", "hardware=gpu-8x80g-vllm-server", "hardware.num_machines=2", f"run_dir={tmp_path / 'r'}",
                              "--sbatch", str(out)])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --signal=B:USR1@120", "#SBATCH --requeue", 'scontrol show hostnames "$SLURM_JOB_NODELIST"',
                 'hardware.machine_rank="$SLURM_NODEID"', 'hardware.num_machines="$SLURM_NNODES"',
                 'hardware.vllm_server_host="$MIXRL_MAIN_ADDR"', f'if [ "$rc" -eq {PREEMPTED_EXIT} ]', 'scontrol requeue "$SLURM_JOB_ID" ||'):
        assert line in text, line
    assert f"run_dir={tmp_path / 'r'} resume=auto" in text and not (tmp_path / "r").exists()  # nothing created


def test_sbatch_needs_a_shared_run_dir(tmp_path):
    out = tmp_path / "job.sbatch"
    res = runner.invoke(app, ["plan", "hardware=gpu-8x80g", "hardware.num_machines=2", "--sbatch", str(out)])
    assert res.exit_code == 2 and "needs run_dir=PATH" in res.output and not out.exists()


def test_resume_auto_needs_run_dir_and_refuses_a_foreign_directory(tmp_path):
    res = runner.invoke(app, ["train", "resume=auto"])
    assert res.exit_code == 2 and "resume=auto needs run_dir=PATH" in res.output
    (tmp_path / "notes.txt").write_text("mine")
    res = runner.invoke(app, ["train", "resume=auto", f"run_dir={tmp_path}"])
    assert res.exit_code == 2 and "holds no complete checkpoint" in res.output, res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


@pytest.mark.slow
def test_slurm_job_on_two_nodes_preempted_requeued_matches_one_machine(ddp_reference, tmp_path):
    base, ref = ddp_reference
    run, job = tmp_path / "run", tmp_path / "job.sbatch"
    res = runner.invoke(app, ["plan", "hardware=cpu-2proc", "hardware.num_processes=1", "hardware.num_machines=2", *base,
                              f"run_dir={run}", "--sbatch", str(job)])
    assert res.exit_code == 0, res.output
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN.format(python=sys.executable))
    (bin_dir / "srun").chmod(stat.S_IRWXU)
    slurm = dict(SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="127.0.0.1,127.0.0.2", SLURM_NNODES="2", SLURM_JOB_NUM_NODES="2",
                 MIXRL_MAIN_PORT=str(_free_port()), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert shutil.which("scontrol", path=slurm["PATH"]) is None  # the script's fallback: python -m mixrl.slurm hostnames

    log = tmp_path / "job1.log"
    proc = _start(["bash", str(job)], _env(tmp_path / "pause", SLURM_RESTART_COUNT="0", **slurm), log)
    _wait_marker(tmp_path / "pause" / "rank0-step2", proc, log)
    proc.send_signal(signal.SIGUSR1)  # --signal=B:USR1: the batch shell only; it forwards to srun
    rc = _wait(proc, log)
    text = log.read_text()
    assert rc == PREEMPTED_EXIT, _tail(log)
    assert "machine 0 at 127.0.0.1:" in text and "requeueing job 4242" in text
    assert _checkpoints(run) == ["checkpoint-2"] and not (run / "model").exists()
    assert (run / "launch" / "command.sh").is_file() and (run / "launch" / "command-node1.sh").is_file()
    assert {p.name for p in (run / "launch" / "logs").iterdir()} == {"node0", "node1"}

    log2 = tmp_path / "job2.log"  # the requeued job: the same script
    rc = _wait(_start(["bash", str(job)], _env(SLURM_RESTART_COUNT="1", **slurm), log2), log2)
    assert rc == 0, _tail(log2)
    assert "resume=auto: continuing" in log2.read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from_step"] == 2 and summary["steps"] == 3 and "= 2 process(es)" in summary["geometry"]
    _assert_same_run(ref, run)  # bit for bit: weights and per-step metrics


@pytest.mark.slow
def test_sigterm_to_rank0_only_stops_both_processes_at_one_step(ddp_reference, tmp_path):
    base, ref = ddp_reference
    run, log = tmp_path / "run", tmp_path / "first.log"
    args = ["hardware=cpu-2proc", *base, f"run_dir={run}", "resume=auto"]
    proc = _train(args, _env(tmp_path / "pause"), log)
    pid = _wait_marker(tmp_path / "pause" / "rank0-step2", proc, log)
    os.kill(pid, signal.SIGTERM)  # rank 0's training process, not the launcher
    rc = _wait(proc, log)
    assert rc == PREEMPTED_EXIT, _tail(log)
    assert _checkpoints(run) == ["checkpoint-2"]
    log2 = tmp_path / "second.log"
    rc = _wait(_train(args, _env(), log2), log2)
    assert rc == 0, _tail(log2)
    _assert_same_run(ref, run)


@pytest.mark.slow
def test_usr1_in_one_process_saves_exits_75_and_resume_auto_matches(tiny_model_path, tmp_path):
    args = [f"model.path={tiny_model_path}", *STEPS]
    full, run = tmp_path / "full", tmp_path / "run"
    rc = _wait(_train([*args, f"run_dir={full}"], _env(), tmp_path / "full.log"), tmp_path / "full.log")
    assert rc == 0, _tail(tmp_path / "full.log")
    log = tmp_path / "first.log"
    again = [*args, f"run_dir={run}", "resume=auto"]
    proc = _train(again, _env(tmp_path / "pause"), log)
    _wait_marker(tmp_path / "pause" / "rank0-step2", proc, log)
    proc.send_signal(signal.SIGUSR1)
    assert _wait(proc, log) == PREEMPTED_EXIT, _tail(log)
    errors = [ln for ln in log.read_text().splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "SIGUSR1 at step 2" in errors[0] and "resume=auto" in errors[0], errors
    assert _checkpoints(run) == ["checkpoint-2"] and not (run / "FAILED").exists()
    log2 = tmp_path / "second.log"
    assert _wait(_train(again, _env(), log2), log2) == 0, _tail(log2)
    _assert_same_run(full, run)


@pytest.mark.slow
def test_fsdp_on_two_machines_matches_one_machine(gloo, tiny_bpe_model_path, tmp_path):
    base = [f"model.path={tiny_bpe_model_path}", *[s for s in STEPS if not s.startswith("trainer.max_steps")], "trainer.max_steps=2"]
    one = tmp_path / "one"
    rc = _wait(_train(["hardware=cpu-2proc-fsdp", *base, f"run_dir={one}"], _env(), tmp_path / "one.log"), tmp_path / "one.log")
    assert rc == 0, _tail(tmp_path / "one.log")
    two, port = tmp_path / "two", _free_port()
    procs = []
    for rank in (0, 1):  # the multi-node command users run on each machine
        node = ["hardware=cpu-2proc-fsdp", "hardware.num_processes=1", "hardware.num_machines=2", f"hardware.machine_rank={rank}",
                "hardware.main_process_ip=127.0.0.1", f"hardware.main_process_port={port}", *base, f"run_dir={two}"]
        procs.append((_train(node, _env(), tmp_path / f"node{rank}.log"), tmp_path / f"node{rank}.log"))
    for proc, log in procs:
        assert _wait(proc, log) == 0, _tail(log)
    assert json.loads((two / "summary.json").read_text())["sharding"]["processes"] == 2
    a, b = _weights(one), _weights(two)
    diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert diff == 0.0, f"two machines differ from one by {diff}"
