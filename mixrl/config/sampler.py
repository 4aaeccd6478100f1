"""The ``sampler`` group's cross-field rules, and whether a config has a sampler at all.

A sampler that picks in data order, keeps every group, filters no rows, generates one round and
leaves the completion length alone is no sampler (:func:`sampler_active` is False): the trainer
installs nothing and runs exactly as without the group, and ``mixrl config show`` leaves the
``sampler`` section out (:func:`without_inactive_sampler`), so such configs print as before.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from mixrl.errors import ConfigError
from mixrl.sampler.runtime import Sampler


def sampler_active(cfg: DictConfig) -> bool:
    """Does the config's sampler change anything?"""
    s = cfg.get("sampler")
    if s is None:
        return False
    routed = cfg.algo.inject.get("prompts") == "hard"  # a guided injection routes on the sampler's history
    return (s.pick.name != "data" or s.keep.name != "all" or bool(s.rows) or int(s.max_rounds) != 1
            or s.get("length") is not None or routed)


def without_inactive_sampler(cfg: DictConfig) -> DictConfig:
    """``cfg`` without its ``sampler`` section when that sampler is :func:`sampler_active`-inactive
    and named ``none``, and without ``algo.critic`` when it is null (a copy; ``cfg`` itself is left as it is)."""
    if cfg.get("algo") is not None and "critic" in cfg.algo and cfg.algo.critic is None:  # no critic: print as before it existed
        cfg = OmegaConf.create(OmegaConf.to_container(cfg))
        del cfg.algo["critic"]
    s = cfg.get("sampler")
    if s is None or sampler_active(cfg) or s.get("name") != "none":
        return cfg
    return OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k != "sampler"])


def check_sampler(cfg: DictConfig) -> None:
    """One-line errors for samplers that cannot run as configured."""
    s = cfg.get("sampler")
    if s is None:
        return
    if int(s.max_rounds) < 1:
        raise ConfigError(f"sampler.max_rounds={s.max_rounds} is out of range: generation rounds per step need >= 1; set sampler.max_rounds >= 1")
    if not 0.0 <= float(s.decay) <= 1.0:
        raise ConfigError(f"sampler.decay={s.decay} is out of range: the per-update decay of a prompt's counts is in [0, 1]; set sampler.decay in [0, 1]")
    if not 0.0 <= float(s.get("hard_below", 0.2)) <= 1.0:
        raise ConfigError(f"sampler.hard_below={s.hard_below} is out of range: an accuracy in [0, 1]; set sampler.hard_below in [0, 1]")
    if int(s.max_rounds) > 1 and s.keep.name == "all":
        raise ConfigError(f"sampler.max_rounds={s.max_rounds} generates more only when a group filter drops groups, "
                          "but sampler.keep.name=all keeps every group; set sampler.keep.name (e.g. nonzero_variance) or sampler.max_rounds=1")
    for where in ("pick", "keep"):
        node = s.get(where)
        if node is not None and "lo" in node and "hi" in node and float(node.lo) > float(node.hi):
            raise ConfigError(f"sampler.{where}.lo={node.lo} is above sampler.{where}.hi={node.hi}; set lo <= hi")
    if s.arms_column is not None and s.pick.name != "bandit":
        raise ConfigError(f"sampler.arms_column={s.arms_column} names the bandit's arms, but sampler.pick.name={s.pick.name}; "
                          "set sampler.pick.name=bandit or sampler.arms_column=null")
    _check_length(cfg)
    if not sampler_active(cfg):
        return
    hw = cfg.hardware
    world = int(hw.num_processes) * int(hw.get("num_machines", 1) or 1)
    if world > 1:
        raise ConfigError(f"sampler={s.name} runs on one training process for now (here {world}): its kept groups and picked "
                          "prompts are not yet redistributed across processes; set hardware.num_processes=1 or sampler=none")
    if hw.get("vllm_async", False):
        raise ConfigError(f"sampler={s.name} chooses each step's prompts from the rollouts just scored, but hardware.vllm_async=true "
                          "sends them a step ahead; set hardware.vllm_async=false or sampler=none")
    if s.get("length") is not None and hw.use_vllm:
        raise ConfigError("sampler.length changes the completion length per step, which mixrl sets only for transformers "
                          "generation; set hardware.use_vllm=false or sampler.length=null")


def _check_length(cfg: DictConfig) -> None:
    """``sampler.length`` stays in [1, trainer.max_completion_length] at every step: the
    generation's length is the schedule's value at the step, and TRL's buffers hold at most
    ``trainer.max_completion_length`` tokens, so a value outside would be clipped without a word."""
    from mixrl.config.builders import check_steps, plain  # deferred: config.builders imports the registries, which import this module's users
    from mixrl.core.schedules import resolve_schedule

    spec = cfg.sampler.get("length")
    if spec is None:
        return
    fn = resolve_schedule(plain(spec))
    cap = int(cfg.trainer.max_completion_length)
    values = [(int(round(fn(step))), step) for step in check_steps(cfg)]
    shown = "{" + OmegaConf.to_yaml(spec).strip().replace("\n", ", ") + "}" if isinstance(spec, DictConfig) else spec
    high, low = max(v for v, _ in values), min(v for v, _ in values)
    at_high, at_low = (next(step for v, step in values if v == x) for x in (high, low))  # the first step it is reached
    if high > cap:
        raise ConfigError(
            f"sampler.length={shown} reaches {high} tokens (step {at_high}), above trainer.max_completion_length={cap}, "
            f"which caps every completion; keep the schedule at or below {cap}, or set trainer.max_completion_length={high}"
        )
    if low < 1:
        raise ConfigError(f"sampler.length={shown} gives {low} tokens at step {at_low}; a completion needs at least 1 token; "
                          "keep the schedule at 1 or more")


def build_sampler(cfg: DictConfig, train_ds=None):
    """``(Sampler, length schedule)`` of the config, or ``(None, None)`` without an active one.
    ``train_ds``: the training rows (read for ``sampler.arms_column``)."""
    if not sampler_active(cfg):
        return None, None

    s = cfg.sampler
    arms = None
    if s.arms_column is not None:
        if train_ds is not None and s.arms_column not in train_ds.column_names:
            raise ConfigError(f"sampler.arms_column={s.arms_column} is not a column of the training data "
                              f"(columns: {', '.join(train_ds.column_names)}); set sampler.arms_column to one of them or null")
        arms = [str(v) for v in train_ds[s.arms_column]] if train_ds is not None else None
    spec = lambda node: OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node  # noqa: E731
    sampler = Sampler(pick=spec(s.pick), keep=spec(s.keep), rows=spec(s.rows), max_rounds=int(s.max_rounds),
                      decay=float(s.decay), seed=int(cfg.seed), arms=arms, hard_below=float(s.get("hard_below", 0.2)))
    return sampler, spec(s.get("length"))
