"""The reference reset: ``algo.kl.reset_every = N`` makes the reference model a copy of the policy every
N optimizer steps (an *iteration*), as iterated self-play and on-policy preference methods do: SPIN
("Self-Play Fine-Tuning Converts Weak Language Models to Strong Language Models", arXiv 2401.01335),
whose opponent p_theta_t is the previous iteration's model, and DNO ("Direct Nash Optimization", arXiv
2404.03715), whose reference at iteration t is pi_t.

It runs through TRL's own ``sync_ref_model`` (``SyncRefModelCallback``: at the end of every optimizer
step whose number is a multiple of ``ref_model_sync_steps``, ``ref <- (1 - alpha) ref + alpha policy``)
with alpha = 1, so the reference becomes the policy exactly. ``0`` (the default) keeps the reference
frozen. Limits: TRL refuses it with a LoRA adapter (the reference is the adapter-less base model
there), and the reference's weights are not checkpointed: a resumed run starts again from the
initial reference until its next reset.
"""

from __future__ import annotations

from omegaconf import DictConfig

from mixrl.errors import ConfigError


def reset_every(cfg: DictConfig) -> int:
    """``algo.kl.reset_every`` (0: a frozen reference)."""
    return int(cfg.algo.kl.get("reset_every", 0) or 0)


def check_ref_reset(cfg: DictConfig) -> None:
    """One-line errors for a reference reset that cannot run as configured."""
    value = cfg.algo.kl.get("reset_every", 0)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"algo.kl.reset_every={value} must be a whole number of optimizer steps >= 0 (0: a frozen reference)")
    if not value:
        return
    if bool(cfg.model.get("lora", {}).get("enabled", False)):
        raise ConfigError("algo.kl.reset_every needs a full reference model, but with model.lora.enabled=true the reference is "
                          "the adapter-less base model (TRL cannot sync it); set algo.kl.reset_every=0 or model.lora.enabled=false")
    if not float(cfg.algo.kl.get("coef", 0.0)) and not _reads_reference(cfg):
        raise ConfigError("algo.kl.reset_every is set but nothing reads the reference model (algo.kl.coef=0 and no term "
                          "reads ref_logp); set algo.kl.reset_every=0")


def _reads_reference(cfg: DictConfig) -> bool:
    from mixrl.config.builders import build_objective  # deferred: builders import the component registries
    from mixrl.core.terms import term_needs  # deferred: as above

    return any("ref_logp" in term_needs(t.kind) for t in build_objective(cfg).terms)


def describe_ref_reset(cfg: DictConfig) -> str | None:
    """The ``reference`` row of ``mixrl explain`` (None: a frozen reference)."""
    n = reset_every(cfg)
    if not n:
        return None
    return (f"pi_ref <- pi_theta after every {n}th optimizer step (algo.kl.reset_every={n}; TRL's sync_ref_model, alpha 1): "
            "each iteration's reference is the policy at its start; frozen before the first reset")


def ref_reset_args(cfg: DictConfig) -> dict:
    """TRL ``GRPOConfig`` arguments for the reset (none when the reference stays frozen)."""
    n = reset_every(cfg)
    return {"sync_ref_model": True, "ref_model_mixup_alpha": 1.0, "ref_model_sync_steps": n} if n else {}
