"""Weight sync to a vLLM server on CPU, through a file: the ``mixrl_file`` weight-transfer backend.

In server mode TRL 1.16 pushes the trained weights into ``trl vllm-serve`` over vLLM's NCCL
weight-transfer engine: ``VLLMClient.init_communicator`` refuses any device but CUDA
("Weight synchronization runs on vLLM's NCCL weight-transfer engine, which needs a CUDA
device"), so with vLLM's CPU build the server generates but can never be updated.

This module is the CPU replacement, on the same server endpoints and the same client calls:

* server side, :class:`FileWeightTransferEngine`, registered as backend ``mixrl_file`` by
  mixrl's vLLM plugin (:func:`mixrl.vllm_cpu.register`, run in every vLLM process): each
  ``/update_weights`` request names a safetensors file, which every worker reads and loads with
  the model's own ``load_weights`` (the same in-place load as TRL's colocate mode);
* trainer side, :func:`install_client` patches ``VLLMClient.init_communicator`` and
  ``update_named_params`` so that, for a CPU trainer only, the weights are written to a
  safetensors file in a private temporary directory (``/dev/shm`` when there is one) and the
  server is asked to load it; the file is removed once the server answered. Any other device
  keeps TRL's NCCL path untouched.

The server must see the trainer's files: same machine (``hardware.vllm_server_host=127.0.0.1``),
or a shared filesystem given by ``MIXRL_VLLM_TRANSFER_DIR``. Start it with
``--weight-transfer-config '{"backend": "mixrl_file"}'`` (``mixrl.launch.vllm_server_command``
adds it on CPU).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from mixrl.errors import ConfigError

BACKEND = "mixrl_file"
#: set on the patched client methods
PATCHED = "_mixrl_file_transfer"


# --------------------------------------------------------------------------- server side (vLLM workers)
def register_engine() -> None:
    """Register :class:`FileWeightTransferEngine` with vLLM's weight-transfer factory (once)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory  # deferred: vllm is optional (the vllm extras) and loaded only when an engine is used

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, "mixrl.vllm_file_transfer", "FileWeightTransferEngine")


def _engine_classes():
    from vllm.distributed.weight_transfer.base import WeightTransferEngine, WeightTransferInitInfo, WeightTransferUpdateInfo  # deferred: vllm is optional (the vllm extras) and loaded only when an engine is used

    @dataclass
    class FileInitInfo(WeightTransferInitInfo):
        pass

    @dataclass
    class FileUpdateInfo(WeightTransferUpdateInfo):
        path: str = ""

    class FileWeightTransferEngine(WeightTransferEngine[FileInitInfo, FileUpdateInfo]):
        """Loads each update from the safetensors file its request names (in place, like colocate)."""

        init_info_cls = FileInitInfo
        update_info_cls = FileUpdateInfo
        supports_draft_weight_update = False

        def init_transfer_engine(self, init_info) -> None:
            pass  # nothing to connect: every update names its file

        def start_weight_update(self) -> None:
            pass  # in-place load_weights: the engine's weights stay reloadable on CPU (mixrl.vllm_cpu)

        def finish_weight_update(self) -> None:
            pass

        def update_weights(self, update_info: dict) -> None:
            self.receive_weights(self.parse_update_info(update_info))  # no device to synchronize on CPU

        def receive_weights(self, update_info) -> None:
            from safetensors.torch import load_file  # deferred: safetensors is needed only when weights are read or written

            tensors = load_file(update_info.path, device="cpu")
            self.model.load_weights(list(tensors.items()))

        def shutdown(self) -> None:
            pass

    return FileWeightTransferEngine


def __getattr__(name: str):  # vLLM's factory imports the class by name, lazily, inside a vLLM process
    if name == "FileWeightTransferEngine":
        return _engine_classes()
    raise AttributeError(name)


# --------------------------------------------------------------------------- trainer side (TRL's client)
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
