"""A SLURM job for a ``hardware`` config: ``mixrl plan <overrides> --sbatch FILE`` writes it.

The job is the multi-node command of :mod:`mixrl.launch` run once per node: ``--nodes`` =
``hardware.num_machines``, one task per node (``--ntasks-per-node=1``), each task ``mixrl train``
itself, which starts that node's ``hardware.num_processes`` processes with torchrun or accelerate
(``--gpus-per-node`` = those plus ``hardware.vllm_server_gpus`` in server mode: machine 0's
launcher starts ``trl vllm-serve`` on its spare GPUs, as on one machine, and every node's
processes reach it at machine 0's address, ``hardware.vllm_server_host``). The rendezvous comes
from SLURM's variables, read on each node:

* machine 0's address: the first host of ``SLURM_JOB_NODELIST`` (``scontrol show hostnames``;
  where ``scontrol`` is missing, :func:`hostnames`, ``python -m mixrl.slurm hostnames``), unless
  ``MIXRL_MAIN_ADDR`` is set (another interface's name or address);
* the port: ``MIXRL_MAIN_PORT`` if set, else ``20000 + SLURM_JOB_ID % 20000`` (two jobs sharing
  a node do not collide; a requeued job keeps its id, so its port);
* ``hardware.num_machines=$SLURM_NNODES``, ``hardware.machine_rank=$SLURM_NODEID``.

Preemption: ``--signal=B:USR1@120`` sends SIGUSR1 to the batch shell 120 s before the time limit;
the script forwards it (and SIGTERM, which SLURM sends at preemption) to ``srun``, which forwards
it to every node's ``mixrl train``, which forwards it to its training processes
(:func:`mixrl.launch.forward_signal`). They finish the current step, agree to stop after it, save
a checkpoint and exit with :data:`mixrl.errors.PREEMPTED_EXIT` (75); on that status the script
runs ``scontrol requeue $SLURM_JOB_ID`` (``--requeue``) and the requeued job runs the same
command, which continues the run (``resume=auto``) from its newest complete checkpoint.
``run_dir`` must be a path every node sees (a shared file system).
"""

from __future__ import annotations

import os
import re
import shlex
import sys

from omegaconf import DictConfig

from mixrl.errors import PREEMPTED_EXIT, ConfigError

#: seconds between SLURM's warning signal and the job's end (``--signal=B:USR1@WARN_S``): a step and a checkpoint must fit
WARN_S = 120


def hostnames(nodelist: str) -> list[str]:
    """The hosts of a SLURM node list, as ``scontrol show hostnames`` prints them:
    ``node[01-03,07],gpu5`` -> ``node01 node02 node03 node07 gpu5`` (zero padding kept)."""
    out: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", nodelist.strip()):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not m:
            out.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            if not hi:
                out.append(f"{prefix}{lo}{suffix}")
                continue
            width = len(lo) if lo.startswith("0") else 0
            out.extend(f"{prefix}{i:0{width}d}{suffix}" for i in range(int(lo), int(hi) + 1))
    return out


def _train_overrides(overrides: list[str], run_dir: str) -> list[str]:
    """The user's overrides for every node: without the per-node keys (the script sets them from
    SLURM's variables) and without run_dir / resume, which come last: ``resume=auto``."""
    per_node = ("hardware.num_machines=", "hardware.machine_rank=", "hardware.main_process_ip=",
                "hardware.main_process_port=", "run_dir=", "resume=")
    kept = [o for o in overrides if not o.lstrip("+~").startswith(per_node)]
    return [*kept, f"run_dir={run_dir}", "resume=auto"]


def gpus_per_node(cfg: DictConfig) -> int:
    """GPUs each node is given: its training processes, plus the vLLM server's on every node
    (SLURM gives all nodes the same; only machine 0 starts the server)."""
    hw = cfg.hardware
    server = int(hw.vllm_server_gpus) if (hw.use_vllm and hw.vllm_mode == "server") else 0
    return int(hw.num_processes) + server


def sbatch_script(cfg: DictConfig, overrides: list[str], *, python: str | None = None, cwd: str | None = None) -> str:
    """The sbatch script of ``mixrl train <overrides>`` on ``hardware.num_machines`` nodes (see the
    module docstring). ``run_dir`` is required: the path every node (and a requeued job) shares."""
    hw = cfg.hardware
    if not cfg.get("run_dir"):
        raise ConfigError("mixrl plan --sbatch needs run_dir=PATH: a path on a file system every node sees "
                          "(the run's checkpoints, which a requeued job continues from)")
    run_dir = os.path.abspath(str(cfg.run_dir))
    py = python or sys.executable
    nodes = int(hw.num_machines)
    server = bool(hw.use_vllm) and hw.vllm_mode == "server" and int(hw.vllm_server_gpus) > 0
    node_args = ['hardware.num_machines="$SLURM_NNODES"', 'hardware.machine_rank="$SLURM_NODEID"',
                 'hardware.main_process_ip="$MIXRL_MAIN_ADDR"', 'hardware.main_process_port="$MIXRL_MAIN_PORT"']
    if server:
        node_args.append('hardware.vllm_server_host="$MIXRL_MAIN_ADDR"')  # the server runs on machine 0
    node_cmd = 'exec "$MIXRL_PYTHON" -m mixrl.cli.main train "$@" ' + " ".join(node_args)
    train_args = _train_overrides(overrides, run_dir)
    from mixrl.config.trust import run_code  # deferred: only a script for a config that names code needs it

    if run_code(cfg, run_dir):  # plugins, a reward file: the requeued job's resume runs them, as the one who planned it asked
        train_args.append("--trust-run-code")
    train = " ".join(shlex.quote(o) for o in train_args)
    lines = [
        "#!/bin/bash",
        f"# written by `mixrl plan --sbatch` (mixrl/slurm.py): hardware={hw.name}, {nodes} node(s) x "
        f"{int(hw.num_processes)} training process(es){' + ' + str(int(hw.vllm_server_gpus)) + ' vLLM server GPU(s) on node 0' if server else ''}",
        f"# submit: sbatch {{this file}}; preempted or near its time limit it checkpoints, exits {PREEMPTED_EXIT} and requeues itself",
        f"#SBATCH --job-name=mixrl-{cfg.algo.name}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if hw.device == "cuda":
        lines.append(f"#SBATCH --gpus-per-node={gpus_per_node(cfg)}")
    lines += [
        f"#SBATCH --signal=B:USR1@{WARN_S}",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        "",
        "set -u",
        f"cd {shlex.quote(cwd or os.getcwd())}",
        f"export MIXRL_PYTHON=${{MIXRL_PYTHON:-{shlex.quote(py)}}}",
        "# the rendezvous: machine 0 is the allocation's first node",
        'if [ -z "${MIXRL_MAIN_ADDR:-}" ]; then',
        "  if command -v scontrol >/dev/null 2>&1; then",
        '    MIXRL_MAIN_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "  else",
        '    MIXRL_MAIN_ADDR=$("$MIXRL_PYTHON" -m mixrl.slurm hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "  fi",
        "fi",
        "export MIXRL_MAIN_ADDR",
        'export MIXRL_MAIN_PORT=${MIXRL_MAIN_PORT:-$((20000 + SLURM_JOB_ID % 20000))}',
        'echo "mixrl: job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_NNODES node(s), machine 0 at $MIXRL_MAIN_ADDR:$MIXRL_MAIN_PORT"',
        "",
        "# SLURM's warning (USR1) and preemption (TERM) signals go to every node's mixrl train, which",
        "# forwards them to its training processes: they finish the step, save a checkpoint and exit "
        f"{PREEMPTED_EXIT}",
        "forward() { echo \"mixrl: SIG$1 at $(date -u +%H:%M:%S): stopping after this step\"; kill -\"$1\" \"$SRUN_PID\" 2>/dev/null; }",
        "trap 'forward USR1' USR1",
        "trap 'forward TERM' TERM",
        "",
        "# one task per node: the multi-node `mixrl train` (mixrl/launch.py) with this node's rank",
        f"srun --ntasks-per-node=1 --kill-on-bad-exit=0 bash -c {shlex.quote(node_cmd)} mixrl-node \\",
        f"  {train} &",
        "SRUN_PID=$!",
        "while :; do",
        '  wait "$SRUN_PID"; rc=$?',
        '  kill -0 "$SRUN_PID" 2>/dev/null || break  # wait returned for a trapped signal: srun still runs',
        "done",
        f'if [ "$rc" -eq {PREEMPTED_EXIT} ]; then',
        '  echo "mixrl: stopped after a checkpoint; requeueing job $SLURM_JOB_ID (it continues from that checkpoint)"',
        '  scontrol requeue "$SLURM_JOB_ID" || echo "mixrl: scontrol requeue failed; submit this script again (it continues the run)"',
        "fi",
        'exit "$rc"',
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m mixrl.slurm hostnames NODELIST``: one host a line (``scontrol show hostnames``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] != "hostnames":
        print("usage: python -m mixrl.slurm hostnames NODELIST", file=sys.stderr)
        return 2
    try:
        print("\n".join(hostnames(args[1])), flush=True)
    except BrokenPipeError:  # `| head -n 1` closed the pipe after the first host: that one is all it needs
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
