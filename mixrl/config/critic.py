"""Checks of ``algo.critic`` (PPO's learned critic, :mod:`mixrl.trainer.parts.critic`) and its advantage.

``algo.critic`` keys: ``lr`` (its AdamW's learning rate, > 0), ``value_clip`` (PPO's value
clipping, > 0, or null for none), ``max_grad_norm`` (> 0, or null), ``weight_decay`` (>= 0).
The critic and ``algo.advantage.name=gae`` go together; the critic runs on one process, on the
full model (no LoRA), without a sampler, and with an injection that writes its rows before
scoring (rows appended after the advantages would have no values).
"""

from __future__ import annotations

from omegaconf import DictConfig

from mixrl.config.sampler import sampler_active
from mixrl.core import VALUE_LOSSES
from mixrl.errors import ConfigError
from mixrl.sources import INJECTIONS

CRITIC_KEYS = {"lr": "> 0", "value_clip": "> 0 or null", "max_grad_norm": "> 0 or null", "weight_decay": ">= 0"}


def _number(key: str, value, *, nullable: bool, strict: bool) -> None:
    if value is None and nullable:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (value <= 0 if strict else value < 0):
        raise ConfigError(f"algo.critic.{key}={value} is out of range: it must be {CRITIC_KEYS[key]}")


def check_critic(cfg: DictConfig) -> None:
    """One-line errors for a critic that cannot run as configured."""
    critic = cfg.algo.get("critic")
    gae = cfg.algo.advantage.get("name") == "gae"
    if critic is None:
        if gae:
            raise ConfigError("algo.advantage.name=gae needs a learned critic: set algo.critic (algo=ppo has one)")
        return
    if not gae:
        raise ConfigError(f"algo.critic is set but algo.advantage.name={cfg.algo.advantage.get('name')}; the critic's values are "
                          "used by the gae advantage only: set algo.advantage.name=gae or algo.critic=null")
    for key in critic:
        if key not in CRITIC_KEYS:
            raise ConfigError(f"unknown key 'algo.critic.{key}'; algo.critic takes: {', '.join(CRITIC_KEYS)}")
    _number("lr", critic.get("lr", 1e-5), nullable=False, strict=True)
    _number("value_clip", critic.get("value_clip", 0.2), nullable=True, strict=True)
    _number("max_grad_norm", critic.get("max_grad_norm", 1.0), nullable=True, strict=True)
    _number("weight_decay", critic.get("weight_decay", 0.0), nullable=False, strict=False)
    if int(cfg.hardware.num_processes) * int(cfg.hardware.get("num_machines", 1) or 1) > 1:
        raise ConfigError("algo.critic runs on one process (its gradients are not averaged over processes); "
                          "set hardware.num_processes=1")
    if bool(cfg.model.lora.get("enabled", False)):
        raise ConfigError("algo.critic with model.lora.enabled=true is not supported: the critic copies the full policy")
    if sampler_active(cfg):
        raise ConfigError("algo.critic with a sampler is not supported (a dropped row's advantage is per row); use sampler=none")
    inject = cfg.algo.inject.get("name", "none")
    appends = INJECTIONS.get(inject).appends_rows_after_advantages or bool(cfg.algo.inject.get("train_reflections"))
    if appends:  # refine with train_reflections appends the policy's reflections
        raise ConfigError(f"algo.critic with algo.inject.name={inject}: that injection adds rows after the advantages, "
                          "which get no values; use an injection that writes rows before scoring (group_replace)")


#: the critic's loss (``mixrl.core.gae.VALUE_LOSSES``)
VALUE_LOSS = "clipped_mse"


def critic_description(cfg: DictConfig) -> str | None:
    """What ``mixrl explain`` says of the critic (None without one)."""
    critic = cfg.algo.get("critic")
    if critic is None:
        return None
    clip = critic.get("value_clip", 0.2)
    loss = VALUE_LOSSES.formula(VALUE_LOSS, {"clip": clip})
    return (f"learned V(s_t): a copy of the policy's backbone (its weights at the start) + a scalar head (zero-initialised); "
            f"its own AdamW, lr {critic.get('lr', 1e-5):g}, weight decay {critic.get('weight_decay', 0.0):g}, max grad norm "
            f"{critic.get('max_grad_norm', 1.0)}; each micro-batch one step on {VALUE_LOSS}: {loss}, over on_policy tokens only; "
            "V of every completion token (off-policy rows too) is computed once per generation batch, after the rewards, "
            "and feeds the GAE advantage; token rewards: the row's reward on its last token plus any dense (per-token) reward")
