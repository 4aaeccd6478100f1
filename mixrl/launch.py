"""Start the processes a ``hardware`` config asks for, on the engines users already trust.

``mixrl train`` calls :func:`needs_launch`; when the config asks for more than one process
(``hardware.num_processes`` per machine x ``hardware.num_machines``), for a sharding
strategy (``hardware.strategy``: ``zero2``, ``zero3``, ``fsdp``) or for a vLLM server started
beside training (``hardware.vllm_mode=server`` with ``hardware.vllm_server_gpus`` > 0),
it re-invokes ``python -m mixrl.cli.main train`` with the same overrides (plus the run
directory it chose) under a launcher:

* ``device=cpu``: ``python -m torch.distributed.run`` (gloo; DDP, or FSDP2 with ``strategy=fsdp``:
  :mod:`mixrl.trainer.fsdp`; DeepSpeed needs GPUs);
* ``device=cuda``: ``python -m accelerate.commands.launch --config_file RUN_DIR/launch/accelerate.yaml``
  with a generated accelerate config (``MULTI_GPU`` for DDP, ``DEEPSPEED`` with a generated
  ``deepspeed.json`` for ZeRO-2/3, ``FSDP`` for FSDP2), the same files as TRL's
  ``accelerate_configs/`` with this config's sizes.

Every launch writes ``RUN_DIR/launch/``: ``command.sh`` (the exact command, re-runnable),
``accelerate.yaml`` / ``deepspeed.json`` when used, ``vllm-server.sh`` in server mode; the
command is also printed. The launched processes see ``WORLD_SIZE`` and do not launch again.
On CPU each process's own output is kept in ``RUN_DIR/launch/logs/<run id>/attempt_0/<rank>/``
(``stdout.log``, ``stderr.log``: torchrun's ``--log-dir --redirects 3 --tee 3``; the console
shows the same lines prefixed ``[rank<r>]``), so a process that dies leaves its own last words,
not only torchrun's summary of its exit.

Multi-node: run the same ``mixrl train`` on every machine with ``hardware.num_machines=N
hardware.machine_rank=R hardware.main_process_ip=<machine 0> run_dir=<a path shared by all>``
(``hardware.main_process_port`` defaults to 29500): each machine's launcher starts its
``num_processes`` with torchrun's (CPU) or accelerate's static rendezvous at machine 0; machine
0 checks and creates the run directory, machine R records ``launch/command-node<R>.sh`` and its
processes' logs under ``launch/logs/node<R>/``. ``mixrl plan --sbatch FILE`` writes the SLURM job
that runs it (:mod:`mixrl.slurm`).

SIGTERM and SIGUSR1 sent to a launcher are forwarded to its training processes
(:func:`forward_signal`); a run they stopped after a checkpoint exits with
:data:`mixrl.errors.PREEMPTED_EXIT` (75) on every machine.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml
from omegaconf import DictConfig
from rich.console import Console

from mixrl.config.hardware import starts_vllm_server
from mixrl.errors import PREEMPTED_EXIT, ConfigError
from mixrl.launch_configs import (  # noqa: F401  (deepspeed_config: re-exported)
    accelerate_config,
    deepspeed_config,
    training_gpus,
    vllm_server_command,
)
from mixrl.trainer.build import prepare_inputs, resolve_model_path
from mixrl.trainer.run import PREEMPTED_MARKER, quiet_libraries
from mixrl.trainer.state.rundir import HELD_ENV, RunDirLock, check_new_run_dir, default_run_dir

LAUNCH_DIR = "launch"
CLI = ["-m", "mixrl.cli.main", "train"]


def check_launch_environment(cfg: DictConfig) -> None:
    """Enough GPUs on this machine for the launch; raises ConfigError."""
    hw = cfg.hardware
    if hw.device == "cuda":
        need = int(hw.num_processes) + (int(hw.vllm_server_gpus) if starts_vllm_server(cfg) else 0)
        have = torch.cuda.device_count()
        if have < need:
            raise ConfigError(
                f"hardware={hw.name} needs {need} GPU(s) on this machine ({hw.num_processes} training"
                + (f" + {hw.vllm_server_gpus} vLLM server" if starts_vllm_server(cfg) else "")
                + f"), but torch sees {have}; lower hardware.num_processes or use a bigger machine"
            )


# --------------------------------------------------------------------------- the plan
@dataclass
class LaunchPlan:
    """Everything one launch runs and records (nothing is started by building it)."""

    run_dir: Path
    argv: list[str]  # the training launch
    env: dict[str, str] = field(default_factory=dict)  # set on top of os.environ
    files: dict[str, str] = field(default_factory=dict)  # name -> text, written under RUN_DIR/launch/
    server_argv: list[str] | None = None  # `trl vllm-serve`, started first (server mode)
    server_env: dict[str, str] = field(default_factory=dict)

    def shell(self) -> str:
        """The training command as one shell line (with its environment variables)."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (env + " " if env else "") + shlex.join(self.argv)

    def server_shell(self) -> str | None:
        if self.server_argv is None:
            return None
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.server_env.items())
        return (env + " " if env else "") + shlex.join(self.server_argv)


def _child_overrides(overrides: list[str], run_dir: Path) -> list[str]:
    kept = [o for o in overrides if not o.lstrip("+~").startswith("run_dir=")]
    return [*kept, f"run_dir={run_dir}"]


def plan_launch(cfg: DictConfig, overrides: list[str], run_dir: Path, *, python: str | None = None,
                model_path: str | None = None) -> LaunchPlan:
    """The launch of ``mixrl train <overrides>`` for ``cfg`` into ``run_dir`` (files not written yet)."""
    hw = cfg.hardware
    py = python or sys.executable
    launch_dir = Path(run_dir) / LAUNCH_DIR
    child = [*CLI, *(_child_overrides(overrides, run_dir) if not cfg.get("resume") else overrides)]
    files: dict[str, str] = {}
    env = {"MIXRL_LAUNCHED": "1"}
    if hw.device == "cpu":
        argv = [py, "-m", "torch.distributed.run", f"--nproc_per_node={int(hw.num_processes)}"]
        if int(hw.num_machines) > 1:
            argv += [f"--nnodes={int(hw.num_machines)}", f"--node_rank={int(hw.machine_rank)}",
                     f"--master_addr={hw.main_process_ip}", f"--master_port={int(hw.main_process_port)}"]
        else:
            argv += ["--standalone"]
        # each process's own stdout and stderr (a C++ abort message too: redirected at the file
        # descriptor) in RUN_DIR/launch/logs/<run id>/attempt_0/<rank>/{stdout,stderr}.log, and on
        # the console with a [rank<r>] prefix
        logs = launch_dir / "logs" / (f"node{int(hw.machine_rank)}" if int(hw.num_machines) > 1 else "")
        argv += [f"--log-dir={logs}", "--redirects=3", "--tee=3"]
        argv += child
        env["OMP_NUM_THREADS"] = str(int(hw.torch_threads or 1))
        env[ELASTIC_SIGNALS] = "SIGINT,SIGHUP,SIGQUIT"  # not SIGTERM: see run_plan
        env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = "[rank${rank}] "
    else:
        ds_file = None
        if hw.strategy in ("zero2", "zero3"):
            if hw.deepspeed:  # the user's own DeepSpeed JSON
                ds_file = str(Path(hw.deepspeed).absolute())
            else:
                ds_file = str(launch_dir / "deepspeed.json")
                files["deepspeed.json"] = json.dumps(deepspeed_config(cfg), indent=2) + "\n"
        acc_file = launch_dir / "accelerate.yaml"
        files["accelerate.yaml"] = yaml.safe_dump(accelerate_config(cfg, ds_file), sort_keys=True)
        argv = [py, "-m", "accelerate.commands.launch", "--config_file", str(acc_file), *child]
        env[ELASTIC_SIGNALS] = "SIGINT,SIGHUP,SIGQUIT"  # accelerate's multi-GPU launch is torch elastic's too
        train_ids, server_ids = training_gpus(cfg)
        if server_ids:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, train_ids))
    plan = LaunchPlan(Path(run_dir), argv, env, files)
    if starts_vllm_server(cfg):
        _, server_ids = training_gpus(cfg)
        plan.server_argv = vllm_server_command(cfg, model_path or str(cfg.model.path))
        plan.server_env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, server_ids))}
        files["vllm-server.sh"] = "#!/bin/sh\n" + plan.server_shell() + "\n"
    files[command_file(cfg)] = (
        "#!/bin/sh\n# written by `mixrl train` (mixrl.launch): the exact command it ran\n"
        + (f"# vLLM server started first: {plan.server_shell()}\n" if plan.server_argv else "")
        + f"cd {shlex.quote(os.getcwd())}\n{plan.shell()}\n"
    )
    return plan


def command_file(cfg: DictConfig) -> str:
    """``command.sh``; on machine R>0 of a multi-node run ``command-node<R>.sh`` (the run directory is shared)."""
    rank = int(cfg.hardware.machine_rank)
    return f"command-node{rank}.sh" if rank > 0 else "command.sh"


def launch_run_dir(cfg: DictConfig) -> Path:
    """The run directory a launch records into and passes to every process (chosen here, so
    that every process and every machine uses the same one)."""
    if cfg.get("resume"):
        return Path(cfg.resume)
    if cfg.run_dir:
        return Path(cfg.run_dir)
    if int(cfg.hardware.num_machines) > 1:
        raise ConfigError(
            f"hardware.num_machines={cfg.hardware.num_machines}: set run_dir=PATH, the same path on every machine "
            "(a shared file system), so that all machines write one run"
        )
    return default_run_dir(cfg)


def write_plan(plan: LaunchPlan, *, new_run: bool = True, say=print) -> Path:
    """Write the plan's files under ``RUN_DIR/launch/`` (a new run's directory stays otherwise
    empty; an existing run is refused first, exactly as ``mixrl train`` would)."""
    launch_dir = plan.run_dir / LAUNCH_DIR
    if new_run:
        check_new_run_dir(plan.run_dir, say)
    launch_dir.mkdir(parents=True, exist_ok=True)
    for name, text in plan.files.items():
        path = launch_dir / name
        path.write_text(text)
        if name.endswith(".sh"):
            path.chmod(0o755)
    return launch_dir


def _stop(proc: subprocess.Popen | None, sig=signal.SIGTERM, wait_s: float = 30.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=wait_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def worker_pids(pid: int) -> list[int]:
    """The processes ``pid`` (torchrun, accelerate) started: its children, read from ``/proc``
    (torchrun starts each worker in a session of its own, so a signal to its process group misses
    them). Empty where there is no ``/proc``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:  # field 4 of /proc/PID/stat, after "pid (comm) state"
            found.append(int(stat.parent.name))
    return sorted(found)


def forward_signal(proc: subprocess.Popen, signum: int) -> None:
    """Send ``signum`` to the launched training processes themselves, not to torchrun: torchrun
    answers SIGTERM by stopping its workers with a 30 s deadline, too short for a step and a
    checkpoint; the workers instead finish their step, agree, save and exit
    (:class:`mixrl.trainer.guards.InterruptGuard`)."""
    pids = worker_pids(proc.pid)
    for pid in pids or [proc.pid]:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


#: what a launcher forwards to the processes it started (a scheduler's preemption and warning signals)
FORWARDED = (signal.SIGTERM, signal.SIGUSR1)
#: the signals torch elastic (torchrun, accelerate's multi-GPU launch) stops its workers on, with a 30 s
#: deadline: SIGTERM is left out, so that a scheduler that signals every process of a job (SLURM's
#: cgroup) does not have torchrun kill the workers while they finish a step and save
ELASTIC_SIGNALS = "TORCHELASTIC_SIGNALS_TO_HANDLE"


def _ignore_forwarded() -> None:
    """In the launcher's child (torchrun, accelerate) before exec: SIGTERM and SIGUSR1 ignored, which
    exec keeps (and the workers inherit until their interrupt guard installs its handlers): the
    training processes get these signals themselves (from the scheduler, or :func:`forward_signal`),
    finish the step and save; torchrun then ends when they exit."""
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_IGN)


def run_plan(plan: LaunchPlan, say=print, *, new_run: bool = True, lock_held: bool = False, machine_rank: int = 0) -> int:
    """Write the plan's files, print the command, run it (and the vLLM server) and return its exit status.
    ``lock_held``: this process holds the run directory's lock for the launched processes
    (:mod:`mixrl.trainer.state.rundir`), which then do not take it themselves. SIGTERM and SIGUSR1
    are forwarded to the training processes (:func:`forward_signal`); when they stopped on one
    after a checkpoint (they leave ``launch/preempted-node<machine_rank>``) the status is
    :data:`mixrl.errors.PREEMPTED_EXIT`, whatever torchrun reports."""
    launch_dir = write_plan(plan, new_run=new_run, say=say)
    marker = launch_dir / PREEMPTED_MARKER.format(machine=machine_rank)
    marker.unlink(missing_ok=True)  # a previous attempt's
    held = {HELD_ENV: os.path.realpath(plan.run_dir)} if lock_held else {}
    server = None
    if plan.server_argv is not None:
        say(f"starting the vLLM server: {plan.server_shell()}")
        log = open(launch_dir / "vllm-server.log", "w")  # noqa: SIM115 - the server keeps it
        server = subprocess.Popen(plan.server_argv, env={**os.environ, **plan.server_env}, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    say(f"launching: {plan.shell()}")
    say(f"(recorded in {launch_dir / ('command.sh' if machine_rank == 0 else f'command-node{machine_rank}.sh')})")
    proc = subprocess.Popen(plan.argv, env={**os.environ, **plan.env, **held}, start_new_session=True,
                            preexec_fn=_ignore_forwarded)
    old_handlers = {}
    if threading.current_thread() is threading.main_thread():
        for sig in FORWARDED:
            old_handlers[sig] = signal.signal(sig, lambda signum, frame: forward_signal(proc, signum))
    try:
        rc = proc.wait()
    except KeyboardInterrupt:  # forward Ctrl-C: the processes save a checkpoint and stop
        os.killpg(proc.pid, signal.SIGINT)
        try:
            rc = proc.wait(timeout=600)
        except KeyboardInterrupt:
            _stop(proc, signal.SIGKILL)
            rc = 130
    finally:
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        _stop(server)
    if rc != 0 and marker.is_file():
        rc = PREEMPTED_EXIT
        marker.unlink(missing_ok=True)
    (launch_dir / "exit_status").write_text(f"{rc}\n{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    return rc


def launch(cfg: DictConfig, overrides: list[str], say=print) -> int:
    """Check this machine, the run's data, reward and model (as ``mixrl train`` does in one
    process: :func:`mixrl.trainer.run.prepare_inputs`), then plan, record and run one launched
    ``mixrl train``; returns its exit status. Nothing is created before the checks pass."""
    check_launch_environment(cfg)
    run_dir = launch_run_dir(cfg)
    lock = RunDirLock()
    if cfg.get("resume") and int(cfg.hardware.machine_rank) == 0:
        lock.acquire(run_dir)  # a resume of a run in use is refused before anything loads or launch/ is rewritten
    try:
        quiet_libraries()
        prepare_inputs(cfg, Console(stderr=True))
        model_path = None
        if starts_vllm_server(cfg):
            model_path = resolve_model_path(cfg, progress=False)
        plan = plan_launch(cfg, overrides, run_dir, model_path=model_path)
        # machine 0 checks (and creates) a new run's directory; the others join it, which machine 0 may have written already
        new_run = not cfg.get("resume") and int(cfg.hardware.machine_rank) == 0
        return run_plan(plan, say=say, new_run=new_run, lock_held=lock.fd is not None,
                        machine_rank=int(cfg.hardware.machine_rank))
    finally:
        lock.release()
