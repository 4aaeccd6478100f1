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
* trainer side, :func:`mixrl.trainer.trl_vllm.install_client` (in the trainer's package, the one
  place that touches TRL's internals) patches ``VLLMClient.init_communicator`` and
  ``update_named_params`` so that, for a CPU trainer only, the weights are written to a
  safetensors file in a private temporary directory (``/dev/shm`` when there is one) and the
  server is asked to load it; the file is removed once the server answered. Any other device
  keeps TRL's NCCL path untouched.

This module holds the server side only and imports neither TRL nor the trainer: vLLM's factory
imports it by its path (``mixrl.vllm_file_transfer``) inside vLLM's own processes.

The server must see the trainer's files: same machine (``hardware.vllm_server_host=127.0.0.1``),
or a shared filesystem given by ``MIXRL_VLLM_TRANSFER_DIR``. Start it with
``--weight-transfer-config '{"backend": "mixrl_file"}'`` (``mixrl.launch.vllm_server_command``
adds it on CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

BACKEND = "mixrl_file"


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
