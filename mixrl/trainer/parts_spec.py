"""What the config asks of the trainer, named once: :class:`PartsSpec`.

:func:`mixrl.trainer.build.trainer_from_config` fills one spec from the config and hands it to
:class:`~mixrl.trainer.grpo.MixrlGRPOTrainer` as its one mixrl keyword (``spec=``); every other
keyword is TRL's. The trainer keeps it (``trainer.spec``, read only) and, once TRL's ``__init__``
has run, passes it to :func:`mixrl.trainer.assembly.build_parts`, which builds each part from its
fields (None / 0: that part is off). What the trainer itself reads of the config is here too (the
weight-sync tolerance, the magnitude bounds, the generation engine, the run's config that each
checkpoint records, where sample rows go, an environment's episodes), so nothing outside the trainer's own code sets an
attribute on it after construction.

The spec is frozen: a field is given at construction and never reassigned. No TRL, no
transformers: ``mixrl plan`` imports :mod:`mixrl.trainer.build`, which imports this module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mixrl.trainer.generation.engine_sync import DEFAULT_TOLERANCE
from mixrl.trainer.magnitude import MagnitudeBounds
from mixrl.trainer.sample_log import SampleTap


@dataclass(frozen=True)
class PartsSpec:
    """The trainer's parts and settings as the config asked for them."""

    objective: Any  # the mixrl.core.objective.Objective built from cfg.algo
    advantage: tuple[str, dict, bool]  # (name, params, include_offpolicy) for mixrl.core.ADVANTAGES
    shaping: tuple | None = None  # algo.shaping: (name, params, offpolicy) of the post-advantage stage, or None
    injections: tuple = ()  # mixrl.sources injections (each holding its source), called in order
    controller: Any = None  # a mixrl.core.CONTROLLERS instance (algo.controller), or None
    teacher: Any = None  # the teacher node's teacher (mixrl.sources.teacher), or None
    staleness: int = 0  # trainer.staleness (0: generate with the current weights)
    async_generation: int = 0  # hardware.vllm_async: k > 0, the vLLM server generates ahead, rows at most k versions old
    sampler: Any = None  # a mixrl.sampler.runtime.Sampler (cfg.sampler), or None
    sampler_length: Any = None  # the sampler's max-completion-length schedule, or None
    critic: dict | None = None  # algo.critic as a dict (a learned critic for advantage gae), or None
    padding_free: str = "false"  # trainer.padding_free resolved: auto | true | false (mixrl.trainer.parts.packing)
    token_budget: dict | None = None  # {"budget", "packed", "scoring_batch_size"} (trainer.max_tokens_per_micro_batch), or None
    # what the trainer reads itself
    sync_tolerance: float | None = DEFAULT_TOLERANCE  # mean |Δ log p| vLLM vs trainer above which a weight sync is broken
    magnitude: MagnitudeBounds = field(default_factory=MagnitudeBounds)  # trainer.max_abs_advantage / max_abs_loss
    generation: str = "padded"  # trainer.generation resolved: shared-prefill and continuous wrap the policy's generation
    config: dict | None = None  # mixrl train: the run's config, recorded in each checkpoint (an edited config.yaml is refused on resume)
    samples: SampleTap | None = None  # mixrl train: rows of each training batch kept for samples.jsonl (logger.samples_per_step > 0)
    episodes: Callable | None = None  # env=<environment>: mixrl.trainer.env_rollout.episode_rollouts (TRL's rollout_func, wrapped)
