"""TRL's vLLM objects made to work with vLLM's CPU build (the trainer's side of it).

vLLM's own side lives outside the trainer, because it runs inside vLLM's processes, which load
neither TRL nor the trainer: :mod:`mixrl.vllm_cpu` (the vLLM plugin: the CPU build's weights kept
reloadable, the CPU server's command) and :mod:`mixrl.vllm_file_transfer` (the ``mixrl_file``
weight-transfer backend the CPU server loads each update with). This module holds what replaces
public TRL objects for a CPU run, each listed in :mod:`mixrl.trainer.trl_contract`:

* :func:`install_client`: TRL's ``VLLMClient.init_communicator`` / ``update_named_params`` (server
  mode), so that a CPU trainer writes its weights to a safetensors file in a private temporary
  directory (:func:`transfer_dir`) and asks the server to load it, through TRL's own endpoints;
  the file is removed once the server answered. Any other device keeps TRL's NCCL path untouched.
* :func:`colocated_engine_dtype`: TRL's ``vllm.LLM`` (colocate mode), while TRL builds it, so that
  the engine runs in the trainer's dtype, eagerly.

:func:`mixrl.trainer.build.trainer_from_config` installs both on CPU (``_colocated_engine``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from mixrl.errors import ConfigError
from mixrl.vllm_file_transfer import BACKEND

#: set on the patched client methods
PATCHED = "_mixrl_file_transfer"


# --------------------------------------------------------------------------- server mode: TRL's client
def transfer_dir() -> Path:
    """Where the trainer writes the weight files: ``MIXRL_VLLM_TRANSFER_DIR``, else /dev/shm (memory), else /tmp."""
    base = os.environ.get("MIXRL_VLLM_TRANSFER_DIR") or ("/dev/shm" if os.path.isdir("/dev/shm") else None)
    return Path(tempfile.mkdtemp(prefix="mixrl-vllm-weights-", dir=base))


def install_client() -> None:
    """Patch TRL's ``VLLMClient`` so that a CPU trainer syncs weights through files (idempotent)."""
    from trl.generation.vllm_client import VLLMClient  # deferred: trl imports transformers; the light commands (--help, config show, plan) never load it

    if getattr(VLLMClient.init_communicator, PATCHED, False):
        return
    nccl_init, nccl_update = VLLMClient.init_communicator, VLLMClient.update_named_params

    def init_communicator(self, device=0):
        if isinstance(device, int) or torch.device(device).type != "cpu":
            return nccl_init(self, device)
        config = self.get_server_info().get("weight_transfer_config") or {}
        if config.get("backend") != BACKEND:
            raise ConfigError(
                f"the vLLM server at {self.base_url} has weight-transfer backend {config.get('backend')!r}, but a CPU trainer "
                f"syncs weights through files: start it with --weight-transfer-config '{{\"backend\": \"{BACKEND}\"}}' "
                "(python -m mixrl.vllm_cpu does)"
            )
        self._post(f"{self.base_url}/init_weight_transfer_engine", json={"init_info": {}})
        self._mixrl_dir = transfer_dir()
        atexit.register(shutil.rmtree, self._mixrl_dir, True)  # the (empty) folder goes with the trainer
        self.communicator = None

    def update_named_params(self, metadata, named_params):
        folder = getattr(self, "_mixrl_dir", None)
        if folder is None:
            return nccl_update(self, metadata, named_params)
        from safetensors.torch import save_file  # deferred: safetensors is needed only when weights are read or written

        path = folder / "update.safetensors"
        save_file({name: t.detach().to("cpu").contiguous() for name, t in named_params}, str(path))
        try:
            if not self._updating_weights:
                self._start_weight_update()
            with ThreadPoolExecutor(max_workers=1) as pool:  # the same request TRL makes, here naming the file
                pool.submit(self._post, f"{self.base_url}/update_weights", json={"update_info": {"path": str(path)}}).result()
            if not self._updating_weights:
                self._finish_weight_update()
        finally:
            path.unlink(missing_ok=True)

    for fn in (init_communicator, update_named_params):
        setattr(fn, PATCHED, True)
    VLLMClient.init_communicator = init_communicator
    VLLMClient.update_named_params = update_named_params


# --------------------------------------------------------------------------- colocate mode: TRL's engine
@contextlib.contextmanager
def colocated_engine_dtype(dtype: str):
    """While TRL builds its colocated ``vllm.LLM`` (inside ``GRPOTrainer.__init__``), give it
    ``dtype``: TRL 1.16 passes none, and vLLM's ``auto`` downcasts float32 checkpoints to
    bfloat16, which on CPU (where the trainer runs float32) makes the engine sample from a
    perturbed policy. It also runs the engine eagerly (``enforce_eager``, as the CPU server of
    :func:`mixrl.vllm_cpu.serve_command` and the CPU benchmark engine do): TRL asks for none, and
    vLLM's CPU build would otherwise spend about half a minute compiling the model graph
    (``torch.compile`` with inductor) at every engine start, more than a CPU run's few steps gain
    from it. Restores TRL's module afterwards."""
    from trl.generation import vllm_generation  # deferred: trl imports transformers; the light commands (--help, config show, plan) never load it

    original = vllm_generation.LLM

    def llm(*args, **kwargs):
        kwargs.setdefault("dtype", dtype)
        kwargs.setdefault("enforce_eager", True)
        return original(*args, **kwargs)

    vllm_generation.LLM = llm
    try:
        yield
    finally:
        vllm_generation.LLM = original
