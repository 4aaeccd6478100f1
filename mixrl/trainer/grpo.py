"""``MixrlGRPOTrainer``: the one place that touches TRL internals.

TRL's ``GRPOTrainer`` generates a group of completions per prompt, scores them, and
optimises a loss. mixrl keeps its generation, scoring, buffering and logging, and
replaces these methods (each listed in ``OVERRIDDEN``; their parent signatures are
pinned by ``tests/test_trl_contract.py``):

* ``_generate_and_score_completions``: runs the injections' hooks around TRL's own
  generation and scoring (``before_generation``, then TRL, then ``after_rewards``,
  the configured ``mixrl.core`` advantage, ``after_advantages``), and adds the provenance
  fields of :mod:`mixrl.sources.rows` (per-row and per-token sources, behaviour log-probs,
  group ids) plus the global token/row counts that normalise every term.
* ``_generate_single_turn``: the ``after_generation`` hook (replace or extend completions
  before they are scored); skips generation when an injection writes every completion.
* ``_calculate_rewards``: keeps the gathered reward matrix of the generation batch.
* ``_compute_loss``: one forward per kind of row (each trimmed to its own completion
  width), then ``mixrl.core.compute_objective``; a controller may set knobs first. TRL's own
  ``importance_sampling_ratio`` is not read: when vLLM generates, the objective's
  engine-mismatch correction (``algo.engine_correction``) recomputes it from the engine's
  log-probs (``sampling_per_token_logps``) and the trainer's (``old_per_token_logps``), and
  ``engine/*`` metrics describe the mismatch once per generation batch.
* ``training_step``: with ``trainer.max_tokens_per_micro_batch`` TRL hands the whole step's rows to one
  call, split here into token-budget micro-batches (:mod:`mixrl.trainer.parts.token_budget`), forward and
  backward each; every step (either way) logs ``batch/padding_fraction`` and ``batch/trained_tokens_per_second``.
* ``_save_checkpoint`` / ``_load_optimizer_and_scheduler``: everything a resumed run needs to
  continue exactly travels with checkpoints: each part that is on, by name, through the writer
  :mod:`mixrl.trainer.state.checkpoint_state`.

* ``get_batch_samples`` (transformers'): async mode reads the next batch's prompts ahead.

Every other TRL private mixrl touches is listed in :mod:`mixrl.trainer.trl_contract`.

Per-token log-probs and entropies (policy, reference, teachers) come from TRL's fused, chunked
LM head, which never builds the ``[tokens, V]`` logits; its tile width is fitted to the
vocabulary (:mod:`mixrl.trainer.lm_head`).

The trainer's other jobs are parts (:mod:`mixrl.trainer.parts`), plain objects held in
``self.parts`` (a :class:`~mixrl.trainer.parts.Parts`; a field that is None is off) and built in
one place (:func:`mixrl.trainer.assembly.build_parts`). Each owns its state, is given the model,
the batch and the step as arguments, and returns results and metrics, which only this class
writes into TRL's ``_metrics``. The class's only base is TRL's ``GRPOTrainer``.

* ``forwards``: every forward over completions; under FSDP / ZeRO-3 every process joins every policy forward.
* ``scoring``: the reward functions on completions other than the rollouts.
* ``injections``: the injections and the :class:`~mixrl.sources.base.InjectContext` they see.
* ``teachers``: teacher models, scoring (``teacher_logp``), sampling.
* ``critic``: ``algo.critic``, PPO's learned critic (values, GAE advantages, its own optimizer step).
* ``remax``: ReMax's greedy-completion reward per prompt (``algo.advantage.name=remax``).
* ``sampler``: the sampler (``cfg.sampler``): which prompts, which groups train.
* ``controller``: when a controller (BAPO, EntroPIC, PALU) steps.
* ``lag``: ``trainer.staleness = k``, the lagged weights (:mod:`mixrl.trainer.generation.lagged_weights`).
* ``async_gen``: ``hardware.vllm_async=true``, generation ahead on a vLLM server (:mod:`mixrl.trainer.generation.async_generation`).
* ``budget``: ``trainer.max_tokens_per_micro_batch``, token-budget micro-batches (:mod:`mixrl.trainer.parts.token_budget`).
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer

from mixrl.core import ADVANTAGES
from mixrl.core.advantages import advantage_needs
from mixrl.core import provenance as prov
from mixrl.core.objective import Objective, compute_objective
from mixrl.core.token_budget import padding_fraction
from mixrl.sources.base import Rollouts
from mixrl.sources.rows import splice_prefixes
from mixrl.trainer import trl_handles
from mixrl.trainer.assembly import build_parts
from mixrl.trainer.generation import engine_sync
from mixrl.trainer.generation.lagged_weights import swapped, trainable
from mixrl.trainer.magnitude import check_step
from mixrl.trainer.parts.answer_ids import answer_ids
from mixrl.trainer.parts.batch_fields import (
    assistant_turn_marks,
    behaviour_is_policy, behaviour_known, engine_mismatch_metrics, global_counts, guided_rows, provenance_fields,
)
from mixrl.trainer.parts.sampler_rounds import Round
from mixrl.trainer.parts.token_budget import forward_tokens
from mixrl.trainer.parts.token_credit import token_credit_inputs
from mixrl.trainer.parts.turn_credit import local_advantages, turn_inputs, turn_metrics
from mixrl.trainer.tool_rows import finished_trajectories
from mixrl.trainer.sample_log import capture_rows
from mixrl.trainer.state import checkpoint_state

OVERRIDDEN = (
    "_generate_single_turn",
    "_calculate_rewards",
    "_generate_and_score_completions",
    "_compute_loss",
    "_get_per_token_logps_and_entropies",
    "training_step",
    "_save_checkpoint",
    "_load_optimizer_and_scheduler",
    "_tool_call_loop",
    "get_batch_samples",
)


class MixrlGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose advantage and loss come from ``mixrl.core`` registries.

    Extra constructor arguments (what the config asked for; each becomes a part, or None: off):
        objective: the :class:`mixrl.core.objective.Objective` built from ``cfg.algo``.
        advantage: ``(name, params, include_offpolicy)`` for ``mixrl.core.ADVANTAGES``.
        injections: ``mixrl.sources`` injections (each holding its source), called in order.
        controller: an optional ``mixrl.core.CONTROLLERS`` instance.
        teacher: the ``teacher`` node's teacher (:mod:`mixrl.sources.teacher`), or None.
        staleness: ``trainer.staleness`` (0: generate with the current weights).
        async_generation: k > 0: the vLLM server generates ahead, rows at most k versions old.
        sampler: an optional :class:`mixrl.sampler.runtime.Sampler` (``sampler_length``: its
            max-completion-length schedule, or None).
        critic: ``algo.critic`` as a dict (a learned critic for ``advantage gae``), or None.
        padding_free: ``trainer.padding_free`` (``auto`` | ``true`` | ``false``): every forward's rows
            packed into one sequence (:mod:`mixrl.trainer.parts.packing`).
        token_budget: ``{"budget", "packed", "scoring_batch_size"}`` (``trainer.max_tokens_per_micro_batch``), or None.
    """

    #: mean |Δ log p| between vLLM and the trainer above which a weight sync is broken (mixrl.trainer.generation.engine_sync)
    vllm_sync_tolerance: float | None = engine_sync.DEFAULT_TOLERANCE
    #: rows of each training batch kept for samples.jsonl (set by SampleLogCallback; 0: none), their texts cut to this many characters
    mixrl_sample_rows: int = 0
    mixrl_sample_chars: int = 1000
    mixrl_samples: list | None = None
    #: the run's config (set by mixrl.trainer.run), recorded in each checkpoint: a resume of an edited config.yaml is refused
    mixrl_config: dict | None = None
    #: the parts (mixrl.trainer.parts.Parts), built once TRL's __init__ has run (mixrl.trainer.assembly.build_parts)
    parts: Any = None

    def __init__(
        self,
        *args,
        objective: Objective,
        advantage: tuple[str, dict, bool],
        injections: list | None = None,
        controller: Any = None,
        teacher: Any = None,
        staleness: int = 0,
        async_generation: int = 0,
        sampler: Any = None,
        sampler_length: Any = None,
        critic: dict | None = None,
        padding_free: str = "false",
        token_budget: dict | None = None,
        shaping: tuple | None = None,
        **kwargs,
    ):
        self.objective = objective
        self.advantage_name, self.advantage_params, self.advantage_include_offpolicy = advantage
        # the run's counters (checkpointed as the "progress" state)
        self.mixrl_rollouts = 0  # on-policy rollouts generated for training, all processes
        self.mixrl_generated_tokens = 0  # completion tokens of those rollouts (padding excluded), all processes
        self._mixrl_step_begin: tuple[int, int] = (-1, 0)  # (global_step, TRL's _step) when the running optimizer step began
        # the generation batch in flight (set and read inside one _generate_and_score_completions)
        self._mixrl_batch_inputs: list[dict] | None = None
        self._mixrl_rollouts: Rollouts | None = None
        self._mixrl_rewards_per_func: torch.Tensor | None = None
        self._mixrl_normalisers: dict[str, tuple[float, float, float]] | None = None
        # the running optimizer step's loss forwards: (real tokens, forward tokens), seconds in training_step, in generation
        self._mixrl_tokens = [0, 0]
        self._mixrl_seconds = [0.0, 0.0]
        self._mixrl_chunk: tuple[int, int] | None = None  # (index, count) of the token-budget micro-batch in flight
        super().__init__(*args, **kwargs)
        self.parts = build_parts(trl_handles.from_trainer(self), objective=objective, advantage=advantage, injections=injections or [],
                                 controller=controller, teacher=teacher, staleness=staleness,
                                 async_generation=async_generation, sampler=sampler, sampler_length=sampler_length,
                                 critic=critic, token_budget=token_budget, shaping=shaping, padding_free=padding_free)
        if self.parts.async_gen is not None:
            self._wrap_vllm_for_async()
        self._mixrl_turn_marks = assistant_turn_marks(self.processing_class) if self.tools else None
        if self.parts.injections:  # appended expert rows read their tool turns with the same marks
            self.parts.injections.use_turn_marks(self._mixrl_turn_marks)
        for model in (self.model, self.ref_model, *(self.parts.teachers.frozen if self.parts.teachers else [])):
            if model is not None:  # decided (true: refused, auto: said) now, not at the first forward
                self.parts.packing.reason(model)

    # ------------------------------------------------------------------ small helpers
    def _log(self, mode: str, metrics: dict) -> None:
        """A part's metrics into TRL's ``_metrics`` (the only writer)."""
        for key, value in metrics.items():
            self._metrics[mode][key].append(value)

    def _context(self):
        """The injections' context as of now (:meth:`mixrl.trainer.parts.injection_context.Injections.context`)."""
        return self.parts.injections.context(
            policy=self.model, global_step=self.state.global_step, micro_step=self._step, trainer_state=self.state,
            log=lambda key, value: self._metrics["train"][key].append(float(value)),
        )

    def _params(self) -> dict[str, torch.Tensor]:
        return trainable(self.accelerator.unwrap_model(self.model))

    # ------------------------------------------------------------------ generation
    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if self._mixrl_rollouts is not None and self.tools:  # TRL's tool loop: a later turn of rows already generated
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        inj = self.parts.injections
        injecting = bool(inj) and self.model.training and self._mixrl_batch_inputs is not None
        ctx = self._context() if injecting else None
        prefixes = inj.generation_prefixes(ctx, self._mixrl_batch_inputs, len(prompt_ids)) if injecting else None
        token_source = None
        if injecting and inj.skips_generation:
            # every completion will be a source's: do not spend time generating rollouts
            completion_ids, logprobs = [[self.processing_class.eos_token_id] for _ in prompt_ids], None
        elif prefixes is not None:
            # each rollout continues from its prefix: the prompts of a group differ, so one
            # completion per prompt (vLLM's server mode would otherwise sample a group from its first prompt)
            completion_ids, logprobs = super()._generate_single_turn(
                [list(p) + list(x) for p, x in zip(prompt_ids, prefixes)], images, multimodal_fields, 1, has_tool_images
            )
            completion_ids, logprobs, token_source = splice_prefixes(
                completion_ids, logprobs, prefixes, max_len=self.max_completion_length,
                prefix_code=prov.code("prefix"), continuation_code=prov.ON_POLICY,
            )
        else:
            completion_ids, logprobs = super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        n = len(completion_ids)
        rollouts = Rollouts(
            list(completion_ids), logprobs, [prov.ON_POLICY] * n, token_source=token_source or [],
            guided=[1 if p else 0 for p in prefixes] if prefixes is not None else [], prompt_ids=prompt_ids,
        )
        if injecting:
            rollouts = inj.after_generation(ctx, self._mixrl_batch_inputs, rollouts)
            if rollouts.prompt_ids is not prompt_ids:  # a row trained under another prompt (plain hinted training)
                prompt_ids[:] = rollouts.prompt_ids  # TRL builds the batch's prompts from this very list
        self._mixrl_rollouts = rollouts
        return rollouts.completion_ids, rollouts.logprobs

    def _tool_call_loop(self, prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields):
        """env=tools: rows an injection wrote (finished expert trajectories) skip TRL's tool loop
        (mixrl.trainer.tool_rows)."""
        rollouts = getattr(self, "_mixrl_rollouts", None)
        finished_trajectories(completions, completion_ids, None if rollouts is None else rollouts.row_source,
                              lambda ids: self.processing_class.decode(ids, skip_special_tokens=True))
        return super()._tool_call_loop(prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields)

    # ------------------------------------------------------------------ rewards
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._mixrl_rewards_per_func = rewards_per_func  # gathered over processes: [N_global, F]
        return rewards_per_func

    # ------------------------------------------------------------------ batch
    def _generate_and_score_completions(self, inputs):
        """One generation batch, in named stages (verl's ``fit()`` reads the same way): gen (with
        the behaviour log-probs under lagged or async weights), provenance, reward, adv (with the
        critic's values), accounting, teacher log-probs, logging, and the normalisers of every term."""
        training = self.model.training
        mode = "train" if training else "eval"
        began = time.perf_counter()
        budget = self.parts.budget
        with budget.scoring_rows(self.args) if budget is not None else contextlib.nullcontext():
            out, inputs, version = self._stage_gen(inputs, training, mode)
        self._stage_provenance(out, version, training, mode)
        rewards, ctx, scored_sources = self._stage_reward(out, inputs, training, mode)
        sources, start = self._stage_adv(out, inputs, rewards, training, mode)
        out = self._stage_accounting(out, inputs, rewards, sources, ctx, training, mode)
        self._stage_teacher(out, inputs, mode)
        self._stage_log(out, rewards, start, scored_sources, training, mode)
        self._mixrl_normalisers = global_counts(out, self.objective, num_processes=self.accelerator.num_processes,
                                                reduce_sum=lambda t: self.accelerator.reduce(t, reduction="sum"))
        if training:
            self._mixrl_seconds[1] += time.perf_counter() - began
        return out

    def _stage_gen(self, inputs, training: bool, mode: str):
        """gen: the sampler's prompts, the injections' rows, TRL's generation and scoring (under
        lagged weights, or through the async pipeline), and the rows' behaviour log-probs.
        Returns the batch, its rows and the policy version that generated it (None: the current)."""
        p = self.parts
        sampling = training and p.sampler is not None
        if sampling:
            inputs, prompt_indices = p.sampler.pick(inputs)
        if training and p.injections:
            inputs = p.injections.before_generation(self._context(), inputs)
        self._mixrl_rollouts = None
        self._mixrl_batch_inputs = inputs
        lagged = training and p.lag is not None
        lag = 0
        try:
            if training and p.async_gen is not None:
                out, version = self._async_generate_and_score(inputs)
            else:
                with p.lag.swapped_in(self._params(), self.state.global_step) if lagged else contextlib.nullcontext(0) as lag:
                    if sampling:
                        out, inputs = self._sampler_rounds(inputs, prompt_indices)
                    else:
                        out = super()._generate_and_score_completions(inputs)
                    if lagged:
                        out["old_per_token_logps"] = p.forwards.behaviour_logps(self.model, out)
                version = int(self.state.global_step) - lag if lagged else None
        finally:
            self._mixrl_batch_inputs = None
        if lagged:
            self._metrics[mode]["staleness"].append(float(lag))
        return out, inputs, version

    def _sampler_rounds(self, inputs, indices):
        """The sampler's rounds (:meth:`mixrl.trainer.parts.sampler_rounds.SamplerRounds.generate`),
        each TRL's generation and scoring, under the length curriculum's max completion length."""
        p = self.parts

        def one_round(rows):
            self._mixrl_batch_inputs = rows
            self._mixrl_rollouts = None  # a new round's first turn (TRL's tool loop skips injections after it)
            out = super(MixrlGRPOTrainer, self)._generate_and_score_completions(rows)
            return Round(out, self._mixrl_rollouts, self._mixrl_rewards_per_func, rows)

        prepare = (lambda rows: p.injections.before_generation(self._context(), rows)) if p.injections else (lambda rows: rows)
        length = p.sampler.length_at(self.state.global_step, self.max_completion_length) if hasattr(self, "generation_config") else None
        if length is not None:
            self._metrics["train"]["sampler/max_completion_length"].append(float(length))
        with self._max_new_tokens(length):
            r = p.sampler.generate(inputs, indices, step=int(self.state.global_step), generate=one_round, prepare=prepare)
        self._mixrl_rollouts, self._mixrl_rewards_per_func = r.rollouts, r.rewards_per_func
        self.mixrl_rollouts += r.extra_rollouts  # the dropped rollouts were paid for too
        self.mixrl_generated_tokens += r.extra_tokens
        self._log("train", r.metrics)
        return r.out, r.rows

    @contextlib.contextmanager
    def _max_new_tokens(self, length: int | None):
        """TRL's generation settings with ``max_new_tokens = length`` for the block (None: unchanged)."""
        if length is None:
            yield
            return
        saved = (self.generation_config.max_new_tokens, dict(self.generation_kwargs))
        self.generation_config.max_new_tokens = length
        self.generation_kwargs["max_new_tokens"] = length
        try:
            yield
        finally:
            self.generation_config.max_new_tokens, self.generation_kwargs = saved[0], saved[1]

    def _check_engine_sync(self, out: dict, mode: str) -> None:
        metrics = engine_sync.check(out, accelerator=self.accelerator, tolerance=self.vllm_sync_tolerance,
                                    step=self.state.global_step,
                                    own_logps=lambda batch: self.parts.forwards.behaviour_logps(self.model, batch))
        self._log(mode, metrics)

    def _stage_provenance(self, out: dict, version: int | None, training: bool, mode: str) -> None:
        """provenance: ``row_source``, ``token_source``, ``behaviour_logp``, ``policy_version``;
        ``engine/*`` metrics, and the weight-sync check when vLLM sampled a training batch."""
        out.update(provenance_fields(out, self._mixrl_rollouts, self._mixrl_turn_marks))
        out.pop("tool_mask", None)  # read into token_source (provenance environment); rows appended later have no entry
        if version is not None:  # the policy version that sampled each row (-1 for rows no policy sampled)
            out["policy_version"] = torch.full_like(out["row_source"], int(version))
        self._log(mode, engine_mismatch_metrics(out, self.objective, mode))
        if training and self.use_vllm:  # vLLM sampled this batch with the weights old_per_token_logps were computed under
            self._check_engine_sync(out, mode)

    def _stage_reward(self, out: dict, inputs, training: bool, mode: str):
        """reward: the weighted rewards, then (training) the injections' and the controller's
        reshaping. Returns the rewards [N_global], the injections' context, and the rows'
        sources as scored (for samples.jsonl)."""
        p = self.parts
        rpf = self._mixrl_rewards_per_func
        rewards = p.scoring.weighted(rpf)
        ctx = self._context()
        ctx.primary_rewards = rpf[:, 0]
        scored_sources = out["row_source"].clone() if training and self.mixrl_sample_rows > 0 else None  # samples.jsonl: rows rewritten after scoring
        if training:
            ctx.batch = out  # an injection may rewrite local rows (refill a group) before advantages
            rewards = p.injections.after_rewards(ctx, inputs, rewards)
            ctx.batch = None
            if p.controller is not None:
                rewards = p.controller.after_rewards(out, rewards, rpf[:, 0])  # PALU's length budget
            if "policy_version" in out:  # rows an injection rewrote (replayed, expert) were not sampled by this run's policy now
                out["policy_version"] = out["policy_version"].masked_fill(out["row_source"] != prov.ON_POLICY, -1)
                if p.async_gen is not None:
                    versions = self.accelerator.gather(out["policy_version"]).tolist()
                    self._log(mode, p.async_gen.batch_metrics(int(self.state.global_step), versions))
        return rewards, ctx, scored_sources

    def _stage_adv(self, out: dict, inputs, rewards: torch.Tensor, training: bool, mode: str):
        """adv: the configured ``mixrl.core`` advantage over the global batch (ReMax's greedy
        baseline and the critic's values when they are on), this process's rows of it.
        Returns the global rows' sources and this process's first global row."""
        p = self.parts
        device = self.accelerator.device
        n_global = rewards.shape[0]
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        sources = self.accelerator.gather(out["row_source"])
        group_ids = torch.arange(n_global, device=device) // num_generations
        include = None if self.advantage_include_offpolicy else behaviour_is_policy(sources)
        estimator = ADVANTAGES.get(self.advantage_name)
        needs = advantage_needs(estimator)
        runtime = turn_inputs(out, inputs, self.accelerator, needs) if "turn_rewards" in needs else {}  # MT-GRPO: each turn's reward
        if "token_credit" in needs:  # CAPO-style per-token credit of the dense rewards (reward=process)
            runtime |= token_credit_inputs(out, self.reward_funcs, self.reward_weights, self.accelerator)
        if "answer_ids" in needs:  # polychromic: each row's final-answer class (mixrl.trainer.parts.answer_ids)
            runtime["answer_ids"] = answer_ids(out, self.processing_class, self.accelerator)
        if "lengths" in needs:  # completion tokens per row (OPO's baseline, REINFORCE++'s token weights)
            runtime["lengths"] = self.accelerator.gather(out["completion_mask"].sum(dim=1).float())
        if "baseline_rewards" in needs:  # ReMax: the reward of each prompt's greedy completion
            runtime["baseline_rewards"], metrics = p.remax.greedy_rewards(self.model_wrapped, self.generation_config, out, inputs, group_ids)
            self._log(mode, metrics)
        advantages = estimator(rewards, group_ids, include=include, **runtime, **self.advantage_params)
        advantages = torch.nan_to_num(advantages, nan=0.0)
        if training and p.shaping is not None:  # algo.shaping: the advantages re-weighted (mixrl.trainer.parts.advantage_shaping)
            advantages, metrics = p.shaping.shape(self.model, out, advantages=advantages, rewards=rewards, group_ids=group_ids, sources=sources,
                                                  include=include, rewards_per_func=self._mixrl_rewards_per_func, rows=inputs,
                                                  knobs=p.controller.knobs() if p.controller is not None else None)
            self._log(mode, metrics)
        if "turn_rewards" in runtime:
            self._log(mode, turn_metrics(rewards, group_ids, runtime, self.advantage_params, include))
        if training and p.sampler is not None:
            advantages, metrics = p.sampler.filter_rows(rewards, advantages)
            self._log("train", metrics)
        n_local = out["completion_ids"].shape[0]
        start = self.accelerator.process_index * n_local
        out["advantages"] = local_advantages(advantages, start, n_local, out["completion_ids"].shape[1])  # per-token: this batch's width
        out["group_id"] = group_ids[start : start + n_local]
        if training and p.critic is not None:  # GAE's per-token advantages from the critic's values
            self._log(mode, p.critic.advantages(out, rewards[start : start + n_local]))
        if training and p.injections:  # what a replay buffer stores with each rollout
            grouped = rewards.view(-1, num_generations)
            out["mixrl_reward"] = rewards[start : start + n_local].float()
            out["mixrl_group_mean"] = grouped.mean(1).repeat_interleave(num_generations)[start : start + n_local].float()
            out["mixrl_group_std"] = grouped.std(1).nan_to_num(0.0).repeat_interleave(num_generations)[start : start + n_local].float()
        return sources, start

    def _stage_accounting(self, out: dict, inputs, rewards, sources, ctx, training: bool, mode: str) -> dict:
        """The policy's own accuracy and reward, the rollout counters, then (training) the
        injections' ``after_advantages``. ``sources``: the global rows' ``row_source``."""
        device = self.accelerator.device
        primary = self._mixrl_rewards_per_func[:, 0]
        on = sources == prov.ON_POLICY
        guided = guided_rows(self._mixrl_rollouts, out["completion_ids"].shape[0], device, self.accelerator.gather)
        free = on & (guided == 0)  # rollouts continued from a prefix or generated with a hint are not the policy's own accuracy
        nan = float("nan")  # TRL's logger drops NaN: no on-policy rows (SFT) logs no accuracy
        correct = self.parts.scoring.correct(primary, inputs, out["completion_ids"], out["completion_mask"], gather=self.accelerator.gather)
        self._metrics[mode]["accuracy"].append(float(correct[free].float().mean()) if correct is not None and free.any() else nan)
        scored = free & ~torch.isnan(self._mixrl_rewards_per_func).all(dim=1)  # a row no reward function scored has no reward
        self._metrics[mode]["reward_on_policy"].append(float(rewards[scored].mean()) if scored.any() else nan)
        if not training:
            return out
        inj = self.parts.injections
        self.mixrl_rollouts += int(on.sum())
        local_on = out["row_source"] == prov.ON_POLICY
        sampled = behaviour_known(out["token_source"]) & out["completion_mask"].bool()  # not prefix tokens
        gen = (sampled.float().sum(dim=1) * local_on.float()).sum()
        self.mixrl_generated_tokens += int(self.accelerator.reduce(gen, reduction="sum"))
        discarded = (self._mixrl_rollouts.discarded_tokens if self._mixrl_rollouts is not None else [])
        if inj.may_generate_more:  # a collective: every process or none
            d = self.accelerator.reduce(torch.tensor([len(discarded), sum(discarded)], device=device, dtype=torch.float32), reduction="sum")
            self.mixrl_rollouts += int(d[0])
            self.mixrl_generated_tokens += int(d[1])
        return inj.after_advantages(ctx, inputs, out)

    def _stage_teacher(self, out: dict, inputs, mode: str) -> None:
        """teacher: ``teacher_logp`` (and SRPO's ``teacher_entropy``) when a term trains on the teachers' log-probs."""
        teachers = self.parts.teachers
        if teachers is not None and teachers.tokens:
            out["teacher_logp"], entropy, metrics = teachers.logps(self.model, out, inputs)
            if entropy is not None:
                out["teacher_entropy"] = entropy
            self._log(mode, metrics)

    def _stage_log(self, out: dict, rewards, start: int, scored_sources, training: bool, mode: str) -> None:
        """The rows of each source, the injections' metrics and a few rows for samples.jsonl
        (mixrl.trainer.callbacks.SampleLogCallback)."""
        self._log_rows_per_source(out, mode)
        if not training:
            return
        self._log(mode, self.parts.injections.metrics())
        if self.mixrl_sample_rows > 0:
            self.mixrl_samples = capture_rows(
                out, tokenizer=self.processing_class, rewards=rewards, rewards_per_func=self._mixrl_rewards_per_func,
                reward_names=list(self.reward_func_names), start=start, n=self.mixrl_sample_rows,
                max_chars=self.mixrl_sample_chars, n_local_scored=out["completion_ids"].shape[0],
                guided=self._mixrl_rollouts.guided if self._mixrl_rollouts is not None else None, scored_sources=scored_sources,
            )

    def _log_rows_per_source(self, out: dict, mode: str) -> None:
        """``<source>/rows``: rows of each selected off-policy source in the global batch."""
        for name in self.objective.selected():
            if name != "on_policy":
                has = (out["token_source"] == prov.code(name)).any(dim=1) if out["token_source"].numel() else out["row_source"] == prov.code(name)
                n_rows = self.accelerator.reduce(has.sum().float(), reduction="sum")
                self._metrics[mode][f"{name}/rows"].append(float(n_rows))

    # ------------------------------------------------------------------ async generation (TRL's vLLM client)
    def _wrap_vllm_for_async(self) -> None:
        """Route TRL's vLLM calls through the async pipeline (server mode, one process)."""
        a = self.parts.async_gen
        self.vllm_generation.generate = lambda prompts, images, num_generations, profiler=None: a.engine_generate(
            prompts, images, num_generations, training=self.model.training, step=self.state.global_step,
            max_steps=self.state.max_steps)
        self.vllm_generation.sync_weights = lambda: a.engine.sync(int(self.state.global_step), training=self.model.training)

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """transformers' batch fetch, through the async part's lookahead of the epoch iterator in
        async mode (the next generation batch's prompts are read ahead; the batches are the same)."""
        if self.parts.async_gen is not None:
            epoch_iterator = self.parts.async_gen.batches(epoch_iterator)
        return super().get_batch_samples(epoch_iterator, num_batches, device)

    def _async_generate_and_score(self, inputs) -> tuple[dict, int]:
        """TRL's generation and scoring in async mode: push the weights first (when the step
        changed), then score under the weights of the version that generated the batch, so that
        ``old_per_token_logps`` (the behaviour log-probs) are that version's."""
        a = self.parts.async_gen.engine
        step = int(self.state.global_step)
        if step != self._last_loaded_step:
            self.vllm_generation.sync_weights()
            self._last_loaded_step = step
        expected = a.expected_version()
        with self._weights_of_version(expected):
            out = super()._generate_and_score_completions(inputs)
            version = a.last_version
            if version != expected:  # the batch in flight was for other prompts (dropped): TRL scored under other weights
                out["old_per_token_logps"] = None
        if out.get("old_per_token_logps") is None:
            with self._weights_of_version(version):
                out["old_per_token_logps"] = self.parts.forwards.behaviour_logps(self.model, out)
        return out, version

    def _weights_of_version(self, version: int):
        """The trainable weights of policy ``version`` swapped in (nothing to do for the current step)."""
        if version == int(self.state.global_step):
            return contextlib.nullcontext()
        return swapped(self._params(), self.parts.async_gen.engine.weights_of(version))

    # ------------------------------------------------------------------ checkpoints
    def _checkpointed(self) -> dict:
        """``{name: Stateful}`` a checkpoint carries: the parts that are on, the run's counters
        (``progress``) and TRL's buffered generation batch (``buffer``)."""
        return {"progress": RunProgress(self), "buffer": BufferedBatch(self), **self.parts.on()}

    def _save_checkpoint(self, model, trial):
        """mixrl's files go into the checkpoint folder *before* TRL writes its own, so a
        checkpoint that looks complete (``trainer_state.json`` is written last) has them even
        when the run is killed right after it (:mod:`mixrl.trainer.state.checkpoint_state`)."""
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        checkpoint_state.save(folder, self._checkpointed(), rank=self.accelerator.process_index,
                              should_save=self.args.should_save)
        super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint:
            checkpoint_state.load(checkpoint, self._checkpointed(), rank=self.accelerator.process_index,
                                  step=int(self.state.global_step), device=self.accelerator.device)

    def micro_step_at_checkpoint(self) -> int:
        """TRL's micro-batch counter ``_step`` as of the end of optimizer step ``global_step``
        (what a run resumed from a checkpoint of this step must continue from). A checkpoint
        written inside the next step (the divergence guard saves before the optimizer step)
        gives the value at that step's start."""
        step, begin = self._mixrl_step_begin
        return begin if step == int(self.state.global_step) else int(self._step)

    # ------------------------------------------------------------------ loss
    def _first_pass(self) -> bool:
        """Is this micro-batch seen for the first time (not a later ``num_iterations`` pass)?"""
        generate_every = self.args.steps_per_generation * self.num_iterations
        return self._step % generate_every < self.args.steps_per_generation

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, pixel_values=None,
                                           image_grid_thw=None, num_images=None, pixel_attention_mask=None,
                                           spatial_shapes=None, num_tiles=None, image_sizes=None, token_type_ids=None,
                                           mm_token_type_ids=None, image_position_ids=None):
        """TRL's per-token log-probs (every forward: the loss's, the old policy's, the reference's,
        the teachers'), on packed rows where ``trainer.padding_free`` applies (:mod:`mixrl.trainer.parts.packing`)."""
        multimodal = dict(pixel_values=pixel_values, image_grid_thw=image_grid_thw, num_images=num_images,
                          pixel_attention_mask=pixel_attention_mask, spatial_shapes=spatial_shapes, num_tiles=num_tiles,
                          image_sizes=image_sizes, token_type_ids=token_type_ids, mm_token_type_ids=mm_token_type_ids,
                          image_position_ids=image_position_ids)
        chunks = self.parts.score_chunks if self.parts is not None else None  # no-grad scoring: token-budget chunks
        if chunks is not None and chunks.takes(aux_loss=compute_aux_loss, multimodal=multimodal):
            return chunks.logps(self._get_per_token_logps_and_entropies, model, input_ids, attention_mask, logits_to_keep,
                                batch_size=batch_size, compute_entropy=compute_entropy)
        padded = lambda ids, att: GRPOTrainer._get_per_token_logps_and_entropies(  # noqa: E731
            self, model, ids, att, logits_to_keep, batch_size, compute_entropy, compute_aux_loss, **multimodal)
        packing = self.parts.packing if self.parts is not None else None  # None: inside TRL's __init__, before the parts
        if (packing is None or compute_aux_loss or any(v is not None for v in multimodal.values())
                or not packing.applies(model)):
            return padded(input_ids, attention_mask)  # MoE aux losses and images: TRL's padded forward
        return packing.logps(model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                             compute_entropy=compute_entropy, autocast=self.accelerator.autocast, padded=padded)

    def _compute_loss(self, model, inputs):
        mode = "train" if self.model.training else "eval"
        p = self.parts
        if mode == "train" and self._mixrl_step_begin[0] != self.state.global_step:
            self._mixrl_step_begin = (int(self.state.global_step), int(self._step))
        logps, entropies = p.forwards.by_row_kind(model, inputs)
        # the micro-batch's place in its optimizer step: TRL's micro-step, or the token-budget micro-batch in flight
        micro, parts = self._mixrl_chunk or (self._step, self.current_gradient_accumulation_steps)
        if mode == "train":
            real, total = forward_tokens(inputs, collective=p.forwards.collective, packed=p.packing.applies(model))
            self._mixrl_tokens[0] += real
            self._mixrl_tokens[1] += total
            if p.controller is not None:
                p.controller.step_start(logps, inputs, micro_step=micro, accumulation=parts)
            if p.injections and self._first_pass():
                # the rollouts' behaviour log-probs, exactly what the policy term divides by
                old = inputs.get("old_per_token_logps")
                old = logps.detach() if old is None else old
                p.injections.after_forward(self._context(), inputs, old)
        knobs = p.controller.knobs() if (p.controller is not None and mode == "train") else None
        loss, metrics = compute_objective(
            self.objective,
            logp=logps,
            mask=inputs["completion_mask"],
            advantages=inputs["advantages"],
            token_source=inputs["token_source"],
            old_logp=inputs.get("old_per_token_logps"),
            behaviour_logp=inputs.get("behaviour_logp"),
            ref_logp=inputs.get("ref_per_token_logps"),
            teacher_logp=inputs.get("teacher_logp"),
            teacher_entropy=inputs.get("teacher_entropy"),
            engine_logp=inputs.get("sampling_per_token_logps"),  # what vLLM reported when it sampled each token
            entropies=entropies,
            step=self.state.global_step,
            normalisers=self._mixrl_normalisers if mode == "train" else None,
            knobs=knobs,
            row_fields={k: v for k, v in inputs.items() if k.startswith(("pair_", "calib_"))} or None,  # pair links, CalibRL's baseline
            turn_ids=inputs.get("turn_id"),  # multi-turn rows: the policy's turns (turn-level losses)
        )
        if mode == "train":
            check_step(self, inputs, metrics)  # an advantage or loss term out of bounds stops the run (mixrl.trainer.magnitude)
            if p.controller is not None:
                last = micro == parts - 1 if self._mixrl_chunk else self.accelerator.sync_gradients
                p.controller.step_end(metrics, sync_gradients=last)
            if p.critic is not None:
                self._log(mode, p.critic.train_step(inputs))
        if p.controller is not None:
            metrics.update(p.controller.metrics())
        # loss/* parts are partial sums over this micro-batch: scale so TRL's mean over
        # micro-batches reports the whole step's value
        parts = parts if mode == "train" else 1
        for key, value in metrics.items():
            self._metrics[mode][key].append(value * parts if key.startswith("loss/") else value)
        return loss


    def training_step(self, model, inputs, num_items_in_batch):
        """TRL's micro-step; with a token budget, the whole step's rows in token-budget micro-batches
        (:meth:`_budget_step`). After an optimizer step's last micro-step, the step's
        ``batch/padding_fraction`` and ``batch/trained_tokens_per_second`` (:meth:`_log_step_tokens`)."""
        began = time.perf_counter()
        if self.parts.budget is None:
            loss = super().training_step(model, inputs, num_items_in_batch)
        else:
            loss = self._budget_step(model, inputs)
        self._mixrl_seconds[0] += time.perf_counter() - began
        if self._step % self.current_gradient_accumulation_steps == 0:
            self._log_step_tokens()
        return loss

    def _budget_step(self, model, inputs) -> torch.Tensor:
        """One optimizer step's rows (TRL's ``_prepare_inputs`` of a one-micro-step step) in token-budget
        micro-batches: forward and backward each (gradients synchronised after the last one only),
        TRL's ``training_step`` bookkeeping once. Returns the step's loss (the micro-batches' sum)."""
        began = time.perf_counter()
        model.train()
        if hasattr(self.optimizer, "train") and callable(self.optimizer.train):
            self.optimizer.train()
        inputs = self._prepare_inputs(inputs)
        chunks = self.parts.budget.chunks(inputs)
        total = None
        try:
            for i, chunk in enumerate(chunks):
                self._mixrl_chunk = (i, len(chunks))
                sync = i == len(chunks) - 1
                with contextlib.nullcontext() if sync else self.accelerator.no_sync(model):
                    with self.compute_loss_context_manager():
                        loss = self.compute_loss(model, chunk)
                    self.accelerator.backward(loss)
                total = loss.detach() if total is None else total + loss.detach()
        finally:
            self._mixrl_chunk = None
        self._step += 1  # TRL's micro-step counter and step time, as GRPOTrainer.training_step keeps them
        self._current_train_step_time += time.perf_counter() - began
        if self._step % self.current_gradient_accumulation_steps == 0:
            self._metrics["train"]["step_time"].append(self._current_train_step_time)
            self._current_train_step_time = 0.0
        return total

    def _log_step_tokens(self) -> None:
        """``batch/padding_fraction`` (padding over all tokens of the step's loss forwards, all
        processes) and ``batch/trained_tokens_per_second`` (their real tokens, all processes, over
        the seconds this process spent in the step's training outside generation and scoring)."""
        counts = torch.tensor(self._mixrl_tokens, dtype=torch.long, device=self.accelerator.device)
        real, total = (int(x) for x in self.accelerator.reduce(counts, reduction="sum"))
        seconds = self._mixrl_seconds[0] - self._mixrl_seconds[1]
        self._metrics["train"]["batch/padding_fraction"].append(padding_fraction(real, total))
        if seconds > 0:
            self._metrics["train"]["batch/trained_tokens_per_second"].append(real / seconds)
        self._mixrl_tokens = [0, 0]
        self._mixrl_seconds = [0.0, 0.0]


class RunProgress:
    """The run's counters as a checkpoint carries them (``Stateful``; TRL glue, so it reads the
    trainer): rollouts and tokens generated, TRL's micro-batch counter ``_step`` (the
    injections' seeded draws read it, and TRL decides from it when to generate; it is not in
    TRL's checkpoint), and the run's config."""

    def __init__(self, trainer: MixrlGRPOTrainer):
        self.trainer = trainer

    def state_dict(self) -> dict:
        t = self.trainer
        return {"rollouts": int(t.mixrl_rollouts), "generated_tokens": int(t.mixrl_generated_tokens),
                "micro_step": int(t.micro_step_at_checkpoint()),
                # the config this checkpoint was trained under (set by mixrl.trainer.run): a resume whose
                # config.yaml was edited since is refused (mixrl.trainer.state.resume.check_trained_config)
                **({"config": t.mixrl_config} if t.mixrl_config is not None else {})}

    def load_state_dict(self, state: dict) -> None:
        t = self.trainer  # the counters themselves are restored by mixrl.trainer.state.resume.load_run_state before training
        t._step = int(state.get("micro_step", int(t.state.global_step) * int(t.args.gradient_accumulation_steps)))


class BufferedBatch:
    """TRL's buffered generation batch and its normalisers, when a checkpoint falls between two
    generations (``num_iterations > 1``): per process (``Stateful``; TRL glue)."""

    def __init__(self, trainer: MixrlGRPOTrainer):
        self.trainer = trainer

    def state_dict(self) -> dict:
        t = self.trainer
        generate_every = t.args.steps_per_generation * t.num_iterations
        if t.micro_step_at_checkpoint() % generate_every and t._buffered_inputs is not None:
            return {"buffered_inputs": t._buffered_inputs,
                    "normalisers": {k: list(v) for k, v in (t._mixrl_normalisers or {}).items()}}
        return {}

    def load_state_dict(self, state: dict) -> None:
        t = self.trainer
        device = t.accelerator.device
        t._buffered_inputs = [{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in b.items()}
                              for b in state["buffered_inputs"]]
        t._mixrl_normalisers = {k: tuple(v) for k, v in state["normalisers"].items()}
