"""``MixrlGRPOTrainer``: TRL's ``GRPOTrainer``, subclassed once (only ``mixrl/trainer/`` touches TRL internals).

TRL's ``GRPOTrainer`` generates a group of completions per prompt, scores them, and
optimises a loss. mixrl keeps its generation, scoring, buffering and logging, and
replaces these methods (each listed in ``OVERRIDDEN``; their parent signatures are
pinned by ``tests/test_trl_contract.py``). Each is a few lines here; the work is in the
TRL glue of :mod:`mixrl.trainer.trl_hooks`, one module per job (named after each hook):

* ``_generate_and_score_completions``: one generation batch in named stages, around TRL's own
  generation and scoring: gen (the sampler's rounds, the injections' ``before_generation``,
  lagged or async weights; :mod:`~mixrl.trainer.trl_hooks.generation`), then provenance, reward
  (``after_rewards``), adv (the configured ``mixrl.core`` advantage), accounting
  (``after_advantages``), teacher, log (:mod:`~mixrl.trainer.trl_hooks.scoring`): the provenance
  fields of :mod:`mixrl.sources.rows` (per-row and per-token sources, behaviour log-probs, group
  ids) plus the global token/row counts that normalise every term.
* ``_generate_single_turn``: the ``after_generation`` hook (replace or extend completions
  before they are scored); skips generation when an injection writes every completion
  (:func:`~mixrl.trainer.trl_hooks.generation.single_turn`).
* ``_calculate_rewards``: keeps the gathered reward matrix of the generation batch.
* ``_tool_call_loop``: rows an injection wrote (finished expert trajectories) skip TRL's tool loop.
* ``_compute_loss``: one forward per kind of row (each trimmed to its own completion
  width), then ``mixrl.core.compute_objective``; a controller may set knobs first
  (:func:`~mixrl.trainer.trl_hooks.loss.compute_loss`). TRL's own ``importance_sampling_ratio``
  is not read: when vLLM generates, the objective's engine-mismatch correction
  (``algo.engine_correction``) recomputes it from the engine's log-probs
  (``sampling_per_token_logps``) and the trainer's (``old_per_token_logps``), and ``engine/*``
  metrics describe the mismatch once per generation batch.
* ``_get_per_token_logps_and_entropies``: TRL's per-token log-probs on packed rows where
  ``trainer.padding_free`` applies (:mod:`mixrl.trainer.parts.packing`).
* ``training_step``: with ``trainer.max_tokens_per_micro_batch`` TRL hands the whole step's rows to one
  call, split into token-budget micro-batches (:mod:`mixrl.trainer.parts.token_budget`), forward and
  backward each (:func:`~mixrl.trainer.trl_hooks.loss.budget_step`); every step (either way) logs
  ``batch/padding_fraction`` and ``batch/trained_tokens_per_second``.
* ``_save_checkpoint`` / ``_load_optimizer_and_scheduler``: everything a resumed run needs to
  continue exactly travels with checkpoints: each part that is on, by name, the run's counters and
  TRL's buffered batch (:mod:`~mixrl.trainer.trl_hooks.checkpoints`), through the writer
  :mod:`mixrl.trainer.state.checkpoint_state`.
* ``get_batch_samples`` (transformers'): async mode reads the next batch's prompts ahead
  (``hardware.vllm_async``: TRL's vLLM client routed through the pipeline by
  :mod:`~mixrl.trainer.trl_hooks.async_vllm`).

Every other TRL private mixrl touches is listed in :mod:`mixrl.trainer.trl_contract`.

Per-token log-probs and entropies (policy, reference, teachers) come from TRL's fused, chunked
LM head, which never builds the ``[tokens, V]`` logits; its tile width is fitted to the
vocabulary (:mod:`mixrl.trainer.lm_head`).

The trainer's other jobs are parts (:mod:`mixrl.trainer.parts`), plain objects held in
``self.parts`` (a :class:`~mixrl.trainer.parts.Parts`; a field that is None is off) and built in
one place (:func:`mixrl.trainer.assembly.build_parts`). Each owns its state, is given the model,
the batch and the step as arguments, and returns results and metrics, which only this class
and its glue write into TRL's ``_metrics``. The class's only base is TRL's ``GRPOTrainer``.

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
import time
from typing import Any

import torch
from trl import GRPOTrainer

from mixrl.trainer import trl_handles
from mixrl.trainer.assembly import build_parts, wrap_generation
from mixrl.trainer.generation import engine_sync
from mixrl.trainer.generation.lagged_weights import trainable
from mixrl.trainer.in_flight import BatchInFlight, StepTally
from mixrl.trainer.parts.batch_fields import assistant_turn_marks, global_counts
from mixrl.trainer.parts_spec import PartsSpec
from mixrl.trainer.tool_rows import finished_trajectories
from mixrl.trainer.trl_hooks import async_vllm, checkpoints, generation, loss, scoring

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

    Its one constructor argument beyond TRL's: ``spec``, a :class:`~mixrl.trainer.parts_spec.PartsSpec`
    (what the config asked for; each part it names is built, or None: off), kept as ``self.spec``.
    """

    #: the parts (mixrl.trainer.parts.Parts), built once TRL's __init__ has run (mixrl.trainer.assembly.build_parts)
    parts: Any = None

    def __init__(self, *args, spec: PartsSpec, **kwargs):
        self.spec = spec  # read only: nothing sets the trainer's settings after construction
        self.objective = spec.objective
        self.advantage_name, self.advantage_params, self.advantage_include_offpolicy = spec.advantage
        # the run's counters (checkpointed as the "progress" state)
        self.mixrl_rollouts = 0  # on-policy rollouts generated for training, all processes
        self.mixrl_generated_tokens = 0  # completion tokens of those rollouts (padding excluded), all processes
        # what one TRL hook hands the next (mixrl.trainer.in_flight): the generation batch being built, the optimizer step's tallies
        self.batch_in_flight = BatchInFlight()
        self.step_tally = StepTally()
        if spec.episodes is not None:  # env=<environment>: TRL's rollout_func, the episodes handed back to _keep_episodes
            kwargs["rollout_func"] = lambda prompts, trainer: self._keep_episodes(
                spec.episodes(prompts, trainer, rows=self.batch_in_flight.rows))
        super().__init__(*args, **kwargs)
        self.parts = build_parts(trl_handles.from_trainer(self), spec)
        if self.parts.async_gen is not None:
            async_vllm.wrap_vllm(self)
        self._mixrl_turn_marks = assistant_turn_marks(self.processing_class) if self.tools else None
        if self.parts.injections:  # appended expert rows read their tool turns with the same marks
            self.parts.injections.use_turn_marks(self._mixrl_turn_marks)
        for model in (self.model, self.ref_model, *(self.parts.teachers.frozen if self.parts.teachers else [])):
            if model is not None:  # decided (true: refused, auto: said) now, not at the first forward
                self.parts.packing.reason(model)
        self.generation_wrap = wrap_generation(self.accelerator.unwrap_model(self.model), spec.generation)  # shared-prefill; continuous: per-call cache size

    def _keep_episodes(self, batch) -> dict:
        """An environment's episodes (:class:`mixrl.trainer.env_rollout.EpisodeBatch`): their provenance kept
        for this generation batch, their metrics logged; TRL gets its rollout dict."""
        self.batch_in_flight.rollouts = batch.rollouts
        self._log("train", batch.metrics)
        return batch.trl

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

    # ------------------------------------------------------------------ generation (mixrl.trainer.trl_hooks.generation)
    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """TRL's single-turn generation inside the injections' ``after_generation`` hook."""
        return generation.single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images)

    def _tool_call_loop(self, prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields):
        """env=tools: rows an injection wrote (finished expert trajectories) skip TRL's tool loop
        (mixrl.trainer.tool_rows)."""
        rollouts = self.batch_in_flight.rollouts
        finished_trajectories(completions, completion_ids, None if rollouts is None else rollouts.row_source,
                              lambda ids: self.processing_class.decode(ids, skip_special_tokens=True))
        return super()._tool_call_loop(prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields)

    def _sampler_rounds(self, inputs, indices):
        """The sampler's rounds of one generation batch (:func:`mixrl.trainer.trl_hooks.generation.sampler_rounds`)."""
        return generation.sampler_rounds(self, inputs, indices)

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """transformers' batch fetch, through the async part's lookahead of the epoch iterator in
        async mode (the next generation batch's prompts are read ahead; the batches are the same)."""
        if self.parts.async_gen is not None:
            epoch_iterator = self.parts.async_gen.batches(epoch_iterator)
        return super().get_batch_samples(epoch_iterator, num_batches, device)

    # ------------------------------------------------------------------ rewards
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self.batch_in_flight.rewards_per_func = rewards_per_func  # gathered over processes: [N_global, F]
        return rewards_per_func

    # ------------------------------------------------------------------ batch (mixrl.trainer.trl_hooks.scoring)
    def _generate_and_score_completions(self, inputs):
        """One generation batch, in named stages (verl's ``fit()`` reads the same way): gen (with
        the behaviour log-probs under lagged or async weights), provenance, reward, adv (with the
        critic's values), accounting, teacher log-probs, logging, and the normalisers of every term."""
        training = self.model.training
        mode = "train" if training else "eval"
        began = time.perf_counter()
        budget = self.parts.budget
        with budget.scoring_rows(self.args) if budget is not None else contextlib.nullcontext():
            out, inputs, version = generation.stage_gen(self, inputs, training, mode)
        scoring.stage_provenance(self, out, version, training, mode)
        rewards, ctx, scored_sources = scoring.stage_reward(self, out, inputs, training, mode)
        sources, start = scoring.stage_adv(self, out, inputs, rewards, training, mode)
        out = scoring.stage_accounting(self, out, inputs, rewards, sources, ctx, training, mode)
        self._log(mode, scoring.stage_teacher(self.parts.teachers, self.model, out, inputs))
        scoring.stage_log(self, out, rewards, start, scored_sources, training, mode)
        self.batch_in_flight.normalisers = global_counts(out, self.objective, num_processes=self.accelerator.num_processes,
                                                reduce_sum=lambda t: self.accelerator.reduce(t, reduction="sum"))
        if training:
            self.step_tally.seconds[1] += time.perf_counter() - began
        return out

    # ------------------------------------------------------------------ checkpoints (mixrl.trainer.trl_hooks.checkpoints)
    def _save_checkpoint(self, model, trial):
        """mixrl's files go into the checkpoint folder *before* TRL writes its own, so a
        checkpoint that looks complete (``trainer_state.json`` is written last) has them even
        when the run is killed right after it (:mod:`mixrl.trainer.state.checkpoint_state`)."""
        checkpoints.save(self, trial)
        super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        """TRL's optimizer and scheduler, then mixrl's files of the checkpoint (its parts, counters, buffered batch)."""
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint:
            checkpoints.load(self, checkpoint)

    def restore_counters(self, state: dict | None) -> None:
        """The run's counters as a checkpoint's progress state recorded them (``mixrl train resume=``,
        before training; None: a checkpoint without them, the counters stay)."""
        if state is not None:
            self.mixrl_rollouts = int(state.get("rollouts", 0))
            self.mixrl_generated_tokens = int(state.get("generated_tokens", 0))

    def push_engine_weights(self) -> bool:
        """The training weights pushed to the colocated vLLM engine unless this step's are there
        (the benchmarks' evaluation on the engine; :func:`~mixrl.trainer.trl_hooks.async_vllm.push_engine_weights`)."""
        return async_vllm.push_engine_weights(self)

    def generate_on_engine(self, requests: list, params: list) -> list:
        """vLLM's outputs for ``requests`` on the colocated engine, woken and put back to sleep as TRL does
        (the benchmarks' evaluation; :func:`~mixrl.trainer.trl_hooks.async_vllm.generate_on_engine`)."""
        return async_vllm.generate_on_engine(self, requests, params)

    def micro_step_at_checkpoint(self) -> int:
        """TRL's micro-batch counter ``_step`` as of the end of optimizer step ``global_step`` (what a
        run resumed from a checkpoint of this step must continue from; :func:`~mixrl.trainer.trl_hooks.checkpoints.micro_step_at_checkpoint`)."""
        return checkpoints.micro_step_at_checkpoint(self.step_tally.begin, self.state.global_step, self._step)

    # ------------------------------------------------------------------ loss (mixrl.trainer.trl_hooks.loss)
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
        """The micro-batch's loss: ``mixrl.core.compute_objective`` over one forward per kind of row."""
        return loss.compute_loss(self, model, inputs)

    def training_step(self, model, inputs, num_items_in_batch):
        """TRL's micro-step; with a token budget, the whole step's rows in token-budget micro-batches
        (:func:`~mixrl.trainer.trl_hooks.loss.budget_step`). After an optimizer step's last micro-step, the step's
        ``batch/padding_fraction`` and ``batch/trained_tokens_per_second`` (:func:`~mixrl.trainer.trl_hooks.loss.log_step_tokens`)."""
        began = time.perf_counter()
        if self.parts.budget is None:
            step_loss = super().training_step(model, inputs, num_items_in_batch)
        else:
            step_loss = loss.budget_step(self, model, inputs)
        self.step_tally.seconds[0] += time.perf_counter() - began
        if self._step % self.current_gradient_accumulation_steps == 0:
            loss.log_step_tokens(self)
        return step_loss
