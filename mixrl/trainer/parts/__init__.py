"""The trainer's parts: plain objects that :class:`mixrl.trainer.grpo.MixrlGRPOTrainer` holds in ``self.parts``.

Each part owns its state, is given what it needs (its config node and long-lived objects at
construction; the model as it is now, the batch and the step as call arguments), returns results
and a metrics dict (only the trainer writes TRL's ``_metrics``), never holds the trainer, and is
``Stateful`` (``state_dict()`` / ``load_state_dict()``, working right after construction; the
checkpoint writer :mod:`mixrl.trainer.state.checkpoint_state` saves each under its own name). None of
these modules imports TRL: what they need of it arrives as a callable. They are all built in one
place, :func:`mixrl.trainer.assembly.build_parts`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from mixrl.trainer.generation.async_generation import AsyncPipeline
from mixrl.trainer.generation.lagged_weights import LaggedWeights
from mixrl.trainer.parts.advantage_shaping import AdvantageShaping
from mixrl.trainer.parts.controller_steps import ControllerSteps
from mixrl.trainer.parts.critic import Critic
from mixrl.trainer.parts.forwards import Forwards
from mixrl.trainer.parts.injection_context import Injections
from mixrl.trainer.parts.packing import Packing
from mixrl.trainer.parts.remax_baseline import RemaxBaseline
from mixrl.trainer.parts.sampler_rounds import SamplerRounds
from mixrl.trainer.parts.scoring import Scoring
from mixrl.trainer.parts.scoring_chunks import ScoringChunks
from mixrl.trainer.parts.teacher import Teachers
from mixrl.trainer.parts.token_budget import TokenBudget


@dataclass
class Parts:
    """One field per part; ``None``: that part is off for this run."""

    forwards: Forwards  # every forward of a model over completions, and the sharding rule (always on)
    scoring: Scoring  # the run's reward functions on completions other than the rollouts (always on)
    injections: Injections  # the configured injections and their context (always on; may hold none)
    packing: Packing  # padding-free forwards (trainer.padding_free; always on, mode false: padded; no state)
    teachers: Teachers | None = None  # teacher models (teacher.*)
    critic: Critic | None = None  # PPO's learned critic (algo.critic)
    remax: RemaxBaseline | None = None  # ReMax's greedy baseline (an advantage that needs baseline_rewards)
    sampler: SamplerRounds | None = None  # which prompts, which groups train (sampler.*)
    controller: ControllerSteps | None = None  # BAPO, EntroPIC, PALU (algo.controller)
    lag: LaggedWeights | None = None  # the weights of k steps ago for generation (trainer.staleness)
    async_gen: AsyncPipeline | None = None  # generation ahead on a vLLM server (hardware.vllm_async)
    budget: TokenBudget | None = None  # token-budget micro-batches (trainer.max_tokens_per_micro_batch)
    score_chunks: ScoringChunks | None = None  # the no-grad scoring forwards in token-budget chunks (the same budget)
    shaping: AdvantageShaping | None = None  # the post-advantage stage (algo.shaping)

    def on(self) -> dict[str, Any]:
        """``{name: part}`` of the parts that are on, in field order."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
