"""The weight sync to vLLM, checked after every sync: the engine's log-probs against the trainer's.

With ``hardware.use_vllm=true`` TRL pushes the trained weights into vLLM whenever the optimizer
step changed since the last generation, then vLLM samples the next batch and reports the
log-prob of every token it sampled. Right after a sync the engine and the trainer hold the
same weights, so the trainer's own log-probs of those tokens (TRL's ``old_per_token_logps``,
or one no-grad forward when TRL did not compute them) must agree with vLLM's up to numerics
(kernels, and the dtype when the engine runs in another one). A sync that did not take (a
weight the engine did not load, a packed copy left stale, a server that ignored the update)
leaves vLLM sampling from older weights, and the disagreement grows with every step.

:func:`check` measures the disagreement on the tokens the policy sampled (rows and tokens of
source ``on_policy``: not the prefix tokens of a guided rollout, not an injected source's rows)
of every training generation batch (a batch with no such token, e.g. every group regenerated
with a hint in the prompt, is not checked), logs ``vllm_sync/logp_diff_mean`` and
``/logp_diff_max``, and raises :class:`EngineSyncError` when the mean absolute difference per token exceeds
``hardware.vllm_sync_tolerance`` (null: :func:`default_tolerance`; ``inf``: logged only).

Measured on CPU (vLLM 0.30 CPU build, the tiny model, float32 on both sides, colocate): mean
|Δ log p| 3e-7 per token (max 3e-6) after a correct sync; with the sync disabled, one step
later 3e-2 at learning rate 5e-5 and 3.1 at 1e-2 (CHORD).
"""

from __future__ import annotations

import torch

from mixrl.core import provenance as prov
from mixrl.errors import RunStopped

#: mean |Δ log p| per sampled token above which a sync is taken as broken, by default:
#: on CPU, where engine and trainer both run float32, a correct sync agrees to 3e-7 and weights one
#: optimizer step stale (CHORD, learning rate 5e-5, the tiny model) disagree by 3e-2 (vLLM left in
#: bfloat16 against a float32 trainer: 3e-3); on GPUs both run bf16 with different kernels, where
#: a correct sync is reported to disagree by up to ~1e-2 (not measured here: no GPU vLLM).
CPU_TOLERANCE = 1e-3
GPU_TOLERANCE = 0.05
DEFAULT_TOLERANCE = GPU_TOLERANCE


def default_tolerance(device: str, engine_dtype: str | None = None) -> float:
    """``hardware.vllm_sync_tolerance=null``: CPU_TOLERANCE when the engine runs in float32 on CPU
    (``engine_dtype`` None: a server mixrl did not start, documented to run ``--dtype float32``),
    GPU_TOLERANCE otherwise."""
    if device == "cpu" and engine_dtype in (None, "float32"):
        return CPU_TOLERANCE
    return GPU_TOLERANCE


class EngineSyncError(RunStopped):
    """vLLM generated from other weights than the trainer's after a weight sync."""


def disagreement(engine_logps: torch.Tensor, trainer_logps: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tensor([sum of |Δ log p|, token count]), max |Δ log p|)`` over the tokens of ``mask``
    where the engine reported a log-prob (NaN where it did not)."""
    delta = (trainer_logps.float() - engine_logps.float()).abs()
    keep = mask.bool() & ~torch.isnan(delta)
    d = delta[keep]
    stats = torch.stack([d.sum(), torch.tensor(float(d.numel()), device=d.device)])
    return stats, (d.max() if d.numel() else torch.zeros((), device=d.device))


def check(out: dict, *, accelerator, tolerance: float | None, step: int, own_logps) -> dict[str, float]:
    """Compare vLLM's log-probs with the trainer's on this generation batch's sampled tokens
    (all processes together); raise :class:`EngineSyncError` above ``tolerance``. ``own_logps``:
    ``batch -> [B, T]`` the trainer's log-probs under the weights that generated it (used when
    TRL did not compute them). Returns the metrics ``vllm_sync/logp_diff_mean`` and ``/max``
    (empty when the batch has no sampled token, e.g. SFT-only)."""
    engine = out.get("sampling_per_token_logps")
    if engine is None:
        raise EngineSyncError(
            "vLLM generated this batch but reported no log-probs, so the weight sync cannot be checked; "
            "this TRL/vLLM pair is not supported by mixrl (TRL 1.16 with vLLM 0.22-0.31 is)"
        )
    own = out.get("old_per_token_logps")
    if own is None:
        own = own_logps(out)
    mask = out["completion_mask"].bool() & (out["token_source"] == prov.ON_POLICY)
    stats, local_max = disagreement(engine, own, mask)
    stats = accelerator.reduce(stats, reduction="sum")
    worst = float(accelerator.gather(local_max.reshape(1)).max())
    total, count = float(stats[0]), float(stats[1])
    if count == 0:
        return {}
    mean = total / count
    tol = tolerance
    if tol is not None and not mean <= float(tol):  # NaN fails too
        raise EngineSyncError(
            f"vLLM's log-probs disagree with the trainer's right after the weight sync of step {step}: "
            f"mean |Δ log p| = {mean:.3g} per sampled token (max {worst:.3g}, {int(count)} tokens) > "
            f"hardware.vllm_sync_tolerance={tol}: vLLM is generating from other weights than the ones trained "
            "(a sync that did not take) or in another dtype (start a server with --dtype of the trainer, e.g. float32 on CPU), "
            "so the run stopped instead of training on those samples"
        )
    return {"vllm_sync/logp_diff_mean": mean, "vllm_sync/logp_diff_max": worst}
