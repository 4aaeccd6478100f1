"""FSDP2 settings, shared by the GPU launch and by FSDP on CPU (gloo).

On GPUs, ``mixrl.launch`` writes them into the generated accelerate config
(``fsdp_config`` of TRL's ``accelerate_configs/fsdp2.yaml``) and ``accelerate launch`` turns
them into accelerate's FSDP plugin.

On CPU (``hardware=cpu-2proc-fsdp``: ``device=cpu``, ``strategy=fsdp``), the processes are
started by ``torch.distributed.run`` (gloo) and the same settings reach the trainer as
transformers' ``fsdp`` / ``fsdp_config`` training arguments (:func:`training_args`). PyTorch's
``fully_shard`` itself runs on CPU with gloo (torch 2.13's gloo has the collectives FSDP2
uses: ``all_gather_into_tensor``, ``reduce_scatter_tensor``), but accelerate 1.15 never
enables its FSDP plugin on CPU: ``AcceleratorState`` switches ``distributed_type`` to
``FSDP`` only from a GPU-like type (``MULTI_GPU``, ``MULTI_XPU``, ...); with ``MULTI_CPU`` it
drops the plugin without a word and wraps the model in DDP. :func:`enable_on_cpu` adds
``MULTI_CPU`` to that switch, so that the run goes through accelerate's own FSDP2 path
(``fsdp2_prepare_model``: ``fully_shard`` per decoder layer, full state dict gathered
for saving), the code that runs on GPUs.
"""

from __future__ import annotations

from omegaconf import DictConfig


def fsdp_config(cfg: DictConfig) -> dict:
    """The ``fsdp_config`` keys of an accelerate config for ``hardware.strategy=fsdp`` (FSDP2,
    as TRL's ``fsdp2.yaml``); ``model/`` is saved from a full state dict, a plain transformers folder."""
    hw = cfg.hardware
    return {
        "fsdp_activation_checkpointing": False,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_cpu_ram_efficient_loading": True,
        "fsdp_offload_params": bool(hw.offload),
        "fsdp_reshard_after_forward": True,
        "fsdp_state_dict_type": "FULL_STATE_DICT",
        "fsdp_version": 2,
    }


def on_cpu(cfg: DictConfig) -> bool:
    """FSDP in processes started by ``torch.distributed.run`` on CPU (gloo)."""
    return cfg.hardware.strategy == "fsdp" and cfg.hardware.device == "cpu"


def training_args(cfg: DictConfig) -> dict:
    """Extra ``GRPOConfig`` fields: transformers' ``fsdp`` / ``fsdp_config`` for FSDP on CPU
    (installs :func:`enable_on_cpu`); nothing otherwise (GPU launches get FSDP from accelerate's config)."""
    if not on_cpu(cfg):
        return {}
    enable_on_cpu()
    settings = {k.removeprefix("fsdp_"): v for k, v in fsdp_config(cfg).items()}
    settings.pop("offload_params")
    settings["cpu_offload"] = False  # the parameters are in CPU memory already
    return {"fsdp": True, "fsdp_config": settings}


def enable_on_cpu() -> None:
    """Let accelerate's FSDP plugin through on ``MULTI_CPU`` (see the module docstring).
    Idempotent; changes nothing for a state created without an FSDP plugin."""
    from accelerate.state import AcceleratorState, PartialState  # deferred: accelerate is heavy; only a distributed run needs it
    from accelerate.utils import DistributedType  # deferred: accelerate is heavy; only a distributed run needs it

    init = AcceleratorState.__init__
    if getattr(init, "_mixrl_cpu_fsdp", False):
        return

    def __init__(self, *args, fsdp_plugin=None, **kwargs):
        init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.fsdp_plugin = fsdp_plugin
            # as accelerate does for GPUs: the shared PartialState too, which every later AcceleratorState() copies
            self.distributed_type = PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    __init__._mixrl_cpu_fsdp = True
    AcceleratorState.__init__ = __init__
