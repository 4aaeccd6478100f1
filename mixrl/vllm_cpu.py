"""vLLM's CPU build made able to take new weights every step (a vLLM general plugin).

Training with vLLM generation pushes the trained weights into the engine after every
optimizer step (TRL: ``load_weights`` in colocate mode, ``update_named_params`` through the
server in server mode). On GPUs the engine's linear layers read their ``weight`` parameter at
every call, so the new values are used at once. vLLM's CPU build (0.30) does not: after the
checkpoint loads, ``UnquantizedLinearMethod.process_weights_after_loading`` repacks every linear
weight for oneDNN (or AMX) and *replaces* the parameter by an empty one, losing its
``weight_loader``; the next ``load_weights`` then fails with ``AttributeError: 'Parameter'
object has no attribute 'weight_loader'``. The (tied) output projection keeps its parameter but
multiplies by a packed copy made at load time, so a sync would leave it silently stale.

:func:`register` (declared in pyproject as a ``vllm.general_plugins`` entry point, which vLLM
runs in every one of its processes: the trainer's in colocate mode, the server's API, engine
and worker processes in server mode) replaces, on the CPU platform only, those two
``process_weights_after_loading`` methods by ones that keep the parameter and multiply with
``torch.nn.functional.linear`` on its live value, and registers the ``mixrl_file`` weight-transfer
backend that server mode on CPU needs (:mod:`mixrl.vllm_file_transfer`). The price is vLLM's slower generic GEMM on
CPU (no prepacked oneDNN weights), which only CPU runs pay. Nothing changes on GPUs.
``MIXRL_VLLM_CPU_PACKED_WEIGHTS=1`` turns the plugin off (vLLM's packed, non-reloadable weights).

The trainer's side, which replaces TRL's objects (the colocated engine built in the trainer's
dtype, eagerly; TRL's server client syncing weights through files), is
:mod:`mixrl.trainer.trl_vllm`: only the trainer's package touches TRL, and this module, run in
vLLM's processes, imports neither TRL nor the trainer.

mixrl also checks after every sync that the engine's log-probs agree with the trainer's
(mixrl.trainer.generation.engine_sync), so a build where this patch no longer takes fails loudly.
"""

from __future__ import annotations

import os
import argparse
import json
import sys

import torch.nn.functional as F

from mixrl.vllm_file_transfer import BACKEND, register_engine

#: set on the patched methods, so that tests and a second registration can see the patch in place
PATCHED = "_mixrl_reloadable_on_cpu"


def register() -> None:
    """vLLM general-plugin entry point: patch the CPU platform's weight packing (no-op elsewhere)."""
    if os.environ.get("MIXRL_VLLM_CPU_PACKED_WEIGHTS") == "1":
        return
    from vllm.platforms import current_platform  # deferred: vllm is optional (the vllm extras) and loaded only when an engine is used

    if not current_platform.is_cpu():
        return
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod  # deferred: vllm is optional (the vllm extras) and loaded only when an engine is used
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod  # deferred: vllm is optional (the vllm extras) and loaded only when an engine is used

    def keep_weight(self, layer) -> None:
        # vLLM's CPU GEMM dispatch calls layer.cpu_linear(x, layer.weight, bias): with the plain
        # linear the live parameter is used, and the parameter (with its weight_loader) stays
        layer.cpu_linear = F.linear

    setattr(keep_weight, PATCHED, True)
    for cls in (UnquantizedLinearMethod, UnquantizedEmbeddingMethod):
        if not getattr(cls.process_weights_after_loading, PATCHED, False):
            cls.process_weights_after_loading = keep_weight

    register_engine()  # server mode on CPU: weights come through files (mixrl.vllm_file_transfer)


def patched() -> bool:
    """True when :func:`register` has patched vLLM in this process (CPU platform only)."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod  # deferred: vllm is optional (the vllm extras) and loaded only when an engine is used

    return bool(getattr(UnquantizedLinearMethod.process_weights_after_loading, PATCHED, False))


def engine_dtype(model_dtype: str, model_path: str) -> str:
    """The dtype a CPU vLLM engine must run in to sample from the trainer's exact policy: the
    trainer's (``model.dtype``, or the checkpoint's own when it is ``auto``, float32 when the
    checkpoint names none). vLLM's own ``auto`` would run a float32 checkpoint in bfloat16."""
    if model_dtype and model_dtype != "auto":
        return str(model_dtype)
    from transformers import AutoConfig  # deferred: transformers is heavy; the light commands (--help, config show, plan) never load it

    dtype = getattr(AutoConfig.from_pretrained(model_path), "dtype", None)
    return str(dtype).removeprefix("torch.") if dtype is not None else "float32"


# --------------------------------------------------------------------------- the server, on CPU
def serve_command(model: str, *, host: str = "127.0.0.1", port: int = 8000, dtype: str = "float32",
                  max_model_len: int | None = None, python: str | None = None) -> list[str]:
    """The vLLM server a CPU trainer in ``hardware.vllm_mode=server`` talks to: what ``trl
    vllm-serve`` runs (vLLM's OpenAI server with ``processed_logprobs`` and no log-prob cap, its
    dev-mode weight endpoints), with the ``mixrl_file`` weight-transfer backend instead of NCCL
    (mixrl.vllm_file_transfer), eager mode, and the trainer's dtype. It starts vLLM's server
    module directly: ``vllm serve`` and ``trl vllm-serve`` (which runs it) stop at start-up with
    the CPU build 0.30, whose CLI asks for the version of a package named ``vllm``
    (``PackageNotFoundError``; the CPU build's package is ``vllm-cpu``)."""
    cmd = [
        python or sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
        "--host", host, "--port", str(port), "--dtype", dtype, "--enforce-eager",
        "--weight-transfer-config", json.dumps({"backend": BACKEND}),
        "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1",
    ]
    return cmd + (["--max-model-len", str(max_model_len)] if max_model_len else [])


def main(argv: list[str] | None = None) -> None:
    """``python -m mixrl.vllm_cpu --model DIR [--port 8000] [--host H] [--dtype float32] [--max-model-len N]``:
    run the CPU vLLM server for ``hardware.vllm_mode=server`` (replaces this process)."""
    p = argparse.ArgumentParser(prog="python -m mixrl.vllm_cpu", description=main.__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-model-len", type=int, default=None)
    a = p.parse_args(argv)
    cmd = serve_command(a.model, host=a.host, port=a.port, dtype=a.dtype, max_model_len=a.max_model_len)
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1")  # the weight-update endpoints live behind vLLM's dev mode
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache (unset, vLLM takes a share of the machine's memory)
    print(" ".join(cmd), file=sys.stderr, flush=True)
    os.execve(cmd[0], cmd, env)


if __name__ == "__main__":
    main()
