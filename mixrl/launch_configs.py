"""The files and commands a launch generates from the config (:mod:`mixrl.launch`): the DeepSpeed and
accelerate configs, the split of the GPUs between training and a vLLM server, and the server's command."""

from __future__ import annotations

from omegaconf import DictConfig

from mixrl.config.hardware import starts_vllm_server, world_size
from mixrl.trainer.fsdp import fsdp_config


def deepspeed_config(cfg: DictConfig) -> dict:
    """The DeepSpeed JSON for ``hardware.strategy=zero2|zero3`` (``hardware.offload``: optimizer
    state, and for ZeRO-3 the parameters too, in CPU memory). Batch sizes, gradient clipping and
    precision are ``"auto"``: transformers fills them from the trainer's arguments, so the
    geometry is stated once (``mixrl.config.rules.geometry``)."""
    hw = cfg.hardware
    stage = {"zero2": 2, "zero3": 3}[str(hw.strategy)]
    zero: dict = {
        "stage": stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": "auto",
    }
    if stage == 3:
        zero.update(
            stage3_prefetch_bucket_size="auto",
            stage3_param_persistence_threshold="auto",
            stage3_gather_16bit_weights_on_model_save=True,  # model/ is a plain transformers folder
        )
    if hw.offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "zero_optimization": zero,
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def accelerate_config(cfg: DictConfig, deepspeed_file: str | None = None) -> dict:
    """The accelerate config (``accelerate launch --config_file``) for a GPU launch: the keys
    of TRL's ``accelerate_configs/{multi_gpu,zero2,zero3,fsdp2}.yaml`` with this config's
    process count, machines and precision."""
    hw = cfg.hardware
    out: dict = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "downcast_bf16": "no",
        "machine_rank": int(hw.machine_rank),
        "main_training_function": "main",
        "mixed_precision": "bf16" if hw.bf16 else "no",
        "num_machines": int(hw.num_machines),
        "num_processes": world_size(cfg),  # accelerate counts processes over all machines
        "rdzv_backend": "static",
        "same_network": True,
        "tpu_env": [],
        "tpu_use_cluster": False,
        "tpu_use_sudo": False,
        "use_cpu": False,
    }
    if int(hw.num_machines) > 1:
        out["main_process_ip"] = str(hw.main_process_ip)
        out["main_process_port"] = int(hw.main_process_port)
    if hw.strategy == "ddp":
        out["distributed_type"] = "MULTI_GPU" if world_size(cfg) > 1 else "NO"
        out["gpu_ids"] = "all"
    elif hw.strategy in ("zero2", "zero3"):
        out["distributed_type"] = "DEEPSPEED"
        out["deepspeed_config"] = {
            "deepspeed_config_file": deepspeed_file or "deepspeed.json",
            "deepspeed_multinode_launcher": "standard",
            "zero3_init_flag": hw.strategy == "zero3",
        }
        out.pop("mixed_precision")  # with a config file, precision is its "auto" fields (filled from bf16)
    else:  # fsdp: FSDP2, as TRL's fsdp2.yaml
        out["distributed_type"] = "FSDP"
        out["fsdp_config"] = fsdp_config(cfg)  # FULL_STATE_DICT: model/ is a plain transformers folder
    return out


def training_gpus(cfg: DictConfig) -> tuple[list[int], list[int]]:
    """``(training GPU ids, vLLM server GPU ids)`` on this machine: training first, the server after."""
    n, s = int(cfg.hardware.num_processes), int(cfg.hardware.vllm_server_gpus) if starts_vllm_server(cfg) else 0
    return list(range(n)), list(range(n, n + s))


def vllm_server_command(cfg: DictConfig, model_path: str) -> list[str]:
    """``trl vllm-serve`` for server mode: ``vllm_server_gpus / vllm_tensor_parallel_size``
    data-parallel copies of the model, each over ``vllm_tensor_parallel_size`` GPUs."""
    hw = cfg.hardware
    tp = int(hw.vllm_tensor_parallel_size)
    cmd = [
        "trl", "vllm-serve", "--model", model_path,
        "--tensor_parallel_size", str(tp), "--data_parallel_size", str(int(hw.vllm_server_gpus) // tp),
        "--gpu_memory_utilization", str(float(hw.vllm_server_gpu_memory_utilization)),
        "--port", str(int(hw.vllm_server_port)),
    ]
    if hw.vllm_max_model_length:
        cmd += ["--max_model_len", str(int(hw.vllm_max_model_length))]
    if cfg.model.dtype in ("bfloat16", "float16", "float32"):
        cmd += ["--dtype", str(cfg.model.dtype)]
    return cmd
