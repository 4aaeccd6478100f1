"""``algo.shaping``: the post-advantage stage's config (:mod:`mixrl.core.advantage_shaping`).

``algo.shaping`` is null (no shaping) or ``{name, offpolicy, <the shaping's parameters>}``; its
component check (names, types, ranges) is :mod:`mixrl.config.components`'s, ``offpolicy`` being the
key every shaping shares (:data:`SHAPING_KEYS`). :func:`check_shaping` adds the rules that cross
sections (a run of :func:`mixrl.config.rules.validate_rules`); :func:`shaping_spec` is what the
trainer is given; :func:`shaping_reads_ref` tells TRL to compute the reference model's log-probs.
"""

from __future__ import annotations

from omegaconf import DictConfig

from mixrl.config.builders import component
from mixrl.config.components import SHAPING_KEYS  # noqa: F401  (offpolicy: the key every shaping section shares)
from mixrl.core import CONTROLLERS
from mixrl.core.advantage_shaping import ACE_GATES, PSR_NSR_MODES, SHAPINGS, shaping_needs
from mixrl.errors import ConfigError

#: advantages that give one value per token: a shaping re-weights one value per row
_PER_TOKEN = ("gae", "capo")
#: string parameters and their choices
_CHOICES = {("psr_nsr", "mode"): PSR_NSR_MODES, ("ace", "gate"): ACE_GATES}


def shaping_spec(cfg: DictConfig) -> tuple[str, dict, bool] | None:
    """``(name, params, offpolicy)`` of ``algo.shaping``, or None when there is none (null or ``none``)."""
    name, params = component(cfg.algo.get("shaping"))
    if name in (None, "none"):
        return None
    offpolicy = bool(params.pop("offpolicy", False))
    return name, params, offpolicy


def shaping_reads_ref(cfg: DictConfig) -> bool:
    """Does the configured shaping read the reference model's log-probs (ACE's confidence shift)?"""
    spec = shaping_spec(cfg)
    return spec is not None and "ref_logp" in shaping_needs(SHAPINGS.get(spec[0]))


def check_shaping(cfg: DictConfig) -> None:
    """One-line ConfigErrors for a shaping that cannot run with the rest of the config."""
    spec = shaping_spec(cfg)
    ctrl, _ = component(cfg.algo.get("controller"))
    sets = [k for k in (getattr(CONTROLLERS.get(ctrl), "knob_names", ()) if ctrl else ()) if k.startswith("shaping.")]
    if sets and (spec is None or sets[0].split(".", 1)[1] not in SHAPINGS.params(spec[0])):
        raise ConfigError(f"algo.controller={ctrl} sets algo.{sets[0]}, but algo.shaping is "
                          f"{spec[0] if spec else 'null'}; set algo.shaping.name=sign_weight")
    if spec is None:
        return
    name, params, _ = spec
    node = cfg.algo.shaping
    if "offpolicy" in node and not isinstance(node.offpolicy, bool):
        raise ConfigError(f"algo.shaping.offpolicy={node.offpolicy!r} must be true (shape off-policy rows too) or false (rollouts only)")
    for (shaping, key), choices in _CHOICES.items():
        if name == shaping and key in params and params[key] not in choices:
            raise ConfigError(f"algo.shaping.{key}={params[key]!r}: shaping {name} takes {' | '.join(choices)}; "
                              f"set algo.shaping.{key} to one of them")
    adv = str(cfg.algo.advantage.name)
    if adv in _PER_TOKEN or cfg.algo.get("critic") is not None:
        raise ConfigError(f"algo.shaping={name} re-weights one advantage per row, but advantage {adv} gives one per token; "
                          "use a per-row advantage (grpo, dr_grpo, rloo, ...) or algo.shaping=null")
