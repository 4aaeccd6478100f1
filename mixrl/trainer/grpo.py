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
* ``_save_checkpoint`` / ``_load_optimizer_and_scheduler``: everything a resumed run needs to
  continue exactly travels with checkpoints (:mod:`mixrl.trainer.checkpoint_state`).

Per-token log-probs and entropies (policy, reference, teachers) come from TRL's fused, chunked
LM head, which never builds the ``[tokens, V]`` logits; its tile width is fitted to the
vocabulary (:mod:`mixrl.trainer.lm_head`).

The trainer's other jobs live in mixins of their own, each a module under ``mixrl/trainer``
that says what it owns (the class below lists them; their methods are reached through ``self``):

* :mod:`~mixrl.trainer.inject_services`: the :class:`~mixrl.sources.base.InjectContext` injections see.
* :mod:`~mixrl.trainer.batch_fields`: provenance fields, normalisers, ``engine/*`` and injection metrics of a batch.
* :mod:`~mixrl.trainer.teacher_service`: teacher models, scoring, sampling, ``teacher_logp``.
* :mod:`~mixrl.trainer.staleness`: ``trainer.staleness = k``, the lagged weights and behaviour log-probs.
* :mod:`~mixrl.trainer.async_glue`: ``hardware.vllm_async=true``, generation ahead on a vLLM server.
* :mod:`~mixrl.trainer.controller_hooks`: when a controller (BAPO, EntroPIC) steps.
* :mod:`~mixrl.trainer.checkpoint_state`: mixrl's files in a checkpoint.
* :mod:`~mixrl.trainer.sharded_forward`: under FSDP / ZeRO-3 every process joins every policy forward.
* :mod:`~mixrl.trainer.critic`: ``algo.critic``, PPO's learned critic (values, GAE advantages, its own optimizer step).
* :mod:`~mixrl.trainer.sampler_hooks`: the sampler (``cfg.sampler``): which prompts, which groups train.
* :mod:`~mixrl.trainer.remax_baseline`: ReMax's greedy-completion reward per prompt (``algo.advantage.name=remax``).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer

from mixrl.core import ADVANTAGES
from mixrl.core.advantages import advantage_needs
from mixrl.core import provenance as prov
from mixrl.core.objective import Objective, compute_objective
from mixrl.core.terms import term_needs
from mixrl.sources.base import Rollouts
from mixrl.sources.rows import splice_prefixes
from mixrl.trainer import engine_sync
from mixrl.trainer.async_glue import AsyncGenerationHooks
from mixrl.trainer.batch_fields import BatchFields, behaviour_is_policy, behaviour_known
from mixrl.trainer.checkpoint_state import CheckpointState
from mixrl.trainer.controller_hooks import ControllerHooks
from mixrl.trainer.critic import CriticService
from mixrl.trainer.inject_services import InjectionServices
from mixrl.trainer.lm_head import fit_tile_to_vocab
from mixrl.trainer.magnitude import check_step
from mixrl.trainer.remax_baseline import RemaxBaseline
from mixrl.trainer.sample_log import capture_rows
from mixrl.trainer.sampler_hooks import SamplerHooks
from mixrl.trainer.sharded_forward import ShardedForwards
from mixrl.trainer.staleness import LaggedWeights
from mixrl.trainer.teacher_service import _SELF, TeacherService

OVERRIDDEN = (
    "_generate_single_turn",
    "_calculate_rewards",
    "_generate_and_score_completions",
    "_compute_loss",
    "_save_checkpoint",
    "_load_optimizer_and_scheduler",
)


class MixrlGRPOTrainer(BatchFields, InjectionServices, ControllerHooks, CheckpointState, CriticService, AsyncGenerationHooks, TeacherService, LaggedWeights, ShardedForwards, SamplerHooks, RemaxBaseline, GRPOTrainer):
    """GRPOTrainer whose advantage and loss come from ``mixrl.core`` registries.

    Extra constructor arguments:
        objective: the :class:`mixrl.core.objective.Objective` built from ``cfg.algo``.
        advantage: ``(name, params, include_offpolicy)`` for ``mixrl.core.ADVANTAGES``.
        injections: ``mixrl.sources`` injections (each holding its source), called in order.
        controller: an optional ``mixrl.core.CONTROLLERS`` instance.
        sampler: an optional :class:`mixrl.sampler.runtime.Sampler` (``sampler_length``: its
            max-completion-length schedule, or None).
        critic: ``algo.critic`` as a dict (a learned critic for ``advantage gae``), or None.
    """

    #: mean |Δ log p| between vLLM and the trainer above which a weight sync is broken (mixrl.trainer.engine_sync)
    vllm_sync_tolerance: float | None = engine_sync.DEFAULT_TOLERANCE
    #: rows of each training batch kept for samples.jsonl (set by SampleLogCallback; 0: none), their texts cut to this many characters
    mixrl_sample_rows: int = 0
    mixrl_sample_chars: int = 1000
    mixrl_samples: list | None = None

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
        **kwargs,
    ):
        self.sampler = sampler
        self._sampler_length_spec = sampler_length
        self.objective = objective
        self.staleness = int(staleness)
        self.async_generation = int(async_generation)  # k > 0: vLLM server generates ahead, rows at most k versions old
        self._async = None  # mixrl.trainer.async_generation.AsyncGeneration
        self._lookahead = None
        self._lag_snapshots: dict[int, dict[str, torch.Tensor]] = {}  # step -> CPU copy of the trainable weights
        self._lag_used = 0
        self.controller = controller
        self.injections = list(injections or [])
        self.advantage_name, self.advantage_params, self.advantage_include_offpolicy = advantage
        self.mixrl_rollouts = 0  # on-policy rollouts generated for training, all processes
        self.mixrl_generated_tokens = 0  # completion tokens of those rollouts (padding excluded), all processes
        self._mixrl_batch_inputs: list[dict] | None = None
        self._mixrl_rollouts: Rollouts | None = None
        self._mixrl_rewards_per_func: torch.Tensor | None = None
        self._mixrl_normalisers: dict[str, tuple[float, float, float]] | None = None
        self._entropy_window: list[float] = []  # step_end controllers: entropies of the step's micro-batches
        self._mixrl_step_begin: tuple[int, int] = (-1, 0)  # (global_step, TRL's _step) when the running optimizer step began
        super().__init__(*args, **kwargs)
        self.teacher = teacher
        self._teacher_models: list = self._load_teachers(teacher) if teacher is not None else []
        fit_tile_to_vocab([self.accelerator.unwrap_model(self.model), *(m for m in self._teacher_models if m is not _SELF)])
        self._teacher_tokens = tuple(sorted({p for t in objective.terms if "teacher_logp" in term_needs(t.kind) for p in t.tokens}))
        self._teacher_entropy = any("teacher_entropy" in term_needs(t.kind) for t in objective.terms)  # SRPO's weights
        if critic is not None:
            self._setup_critic(critic)
        if self.async_generation:
            self._setup_async()

    # ------------------------------------------------------------------ generation
    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        injecting = self._injecting()
        ctx = self._inject_context() if injecting else None
        prefixes = self._generation_prefixes(ctx, len(prompt_ids)) if injecting else None
        token_source = None
        if injecting and any(inj.skips_generation for inj in self.injections):
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
            for inj in self.injections:
                rollouts = inj.after_generation(ctx, self._mixrl_batch_inputs, rollouts)
            if rollouts.prompt_ids is not prompt_ids:  # a row trained under another prompt (plain hinted training)
                prompt_ids[:] = rollouts.prompt_ids  # TRL builds the batch's prompts from this very list
        self._mixrl_rollouts = rollouts
        return rollouts.completion_ids, rollouts.logprobs

    def _generation_prefixes(self, ctx, n: int) -> list[list[int]] | None:
        """The one injection's per-row prefixes (None when no injection sets any)."""
        found = None
        for inj in self.injections:
            p = inj.generation_prefixes(ctx, self._mixrl_batch_inputs)
            if p is None:
                continue
            if found is not None:
                raise RuntimeError("two injections set generation prefixes; configure one")
            if len(p) != n:
                raise RuntimeError(f"{type(inj).__name__}.generation_prefixes returned {len(p)} prefixes for {n} rows")
            found = [list(x) for x in p]
        return found

    # ------------------------------------------------------------------ rewards
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._mixrl_rewards_per_func = rewards_per_func  # gathered over processes: [N_global, F]
        return rewards_per_func

    # ------------------------------------------------------------------ batch
    def _generate_and_score_completions(self, inputs):
        training = self.model.training
        sampling = training and self.sampler is not None
        if sampling:
            inputs, prompt_indices = self._sampler_pick(inputs)
        if training and self.injections:
            inputs = self._before_generation(inputs)
        self._mixrl_rollouts = None
        self._mixrl_batch_inputs = inputs
        lagged = training and self.staleness > 0
        asynchronous = training and self._async is not None
        try:
            if asynchronous:
                out, version = self._async_generate_and_score(inputs)
            else:
                with self._lagged_weights() if lagged else contextlib.nullcontext():
                    if sampling:
                        out, inputs = self._sampler_generate(inputs, prompt_indices, super()._generate_and_score_completions,
                                                             self._before_generation if self.injections else (lambda rows: rows))
                    else:
                        out = super()._generate_and_score_completions(inputs)
                    if lagged:
                        out["old_per_token_logps"] = self._behaviour_logps(out)
                version = int(self.state.global_step) - self._lag_used if lagged else None
        finally:
            self._mixrl_batch_inputs = None
        mode = "train" if training else "eval"
        device = self.accelerator.device
        if lagged:
            self._metrics[mode]["staleness"].append(float(self._lag_used))
        self._add_provenance(out)
        if version is not None:  # the policy version that sampled each row (-1 for rows no policy sampled)
            out["policy_version"] = torch.full_like(out["row_source"], int(version))
        self._log_engine_mismatch(out, mode)
        if training and self.use_vllm:  # vLLM sampled this batch with the weights old_per_token_logps were computed under
            engine_sync.check(self, out, mode)
        rpf = self._mixrl_rewards_per_func
        rewards = (rpf * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)
        ctx = self._inject_context()
        ctx.primary_rewards = rpf[:, 0]
        scored_sources = out["row_source"].clone() if training and self.mixrl_sample_rows > 0 else None  # samples.jsonl: rows rewritten after scoring
        if training:
            ctx.batch = out  # an injection may rewrite local rows (refill a group) before advantages
            for inj in self.injections:
                rewards = inj.after_rewards(ctx, inputs, rewards)
            ctx.batch = None
            rewards = self._controller_after_rewards(out, rewards, rpf[:, 0])  # PALU's length budget
            if "policy_version" in out:  # rows an injection rewrote (replayed, expert) were not sampled by this run's policy now
                out["policy_version"] = out["policy_version"].masked_fill(out["row_source"] != prov.ON_POLICY, -1)
                if asynchronous:
                    self._log_async(out, mode)
        n_global = rewards.shape[0]
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        sources = self.accelerator.gather(out["row_source"])
        group_ids = torch.arange(n_global, device=device) // num_generations
        policy_rows = behaviour_is_policy(sources)
        include = None if self.advantage_include_offpolicy else policy_rows
        estimator = ADVANTAGES.get(self.advantage_name)
        runtime = {}
        needs = advantage_needs(estimator)
        if "lengths" in needs:  # completion tokens per row (OPO's baseline, REINFORCE++'s token weights)
            runtime["lengths"] = self.accelerator.gather(out["completion_mask"].sum(dim=1).float())
        if "baseline_rewards" in needs:  # ReMax: the reward of each prompt's greedy completion
            runtime["baseline_rewards"] = self._greedy_baseline_rewards(out, inputs, group_ids, mode)
        advantages = estimator(rewards, group_ids, include=include, **runtime, **self.advantage_params)
        advantages = torch.nan_to_num(advantages, nan=0.0)
        if sampling:
            advantages = self._sampler_filter_rows(rewards, advantages)
        n_local = out["completion_ids"].shape[0]
        start = self.accelerator.process_index * n_local
        out["advantages"] = advantages[start : start + n_local]
        out["group_id"] = group_ids[start : start + n_local]
        if training and self.critic is not None:  # GAE's per-token advantages from the critic's values
            self._critic_advantages(out, rewards[start : start + n_local], mode)
        if training and self.injections:  # what a replay buffer stores with each rollout
            grouped = rewards.view(-1, num_generations)
            out["mixrl_reward"] = rewards[start : start + n_local].float()
            out["mixrl_group_mean"] = grouped.mean(1).repeat_interleave(num_generations)[start : start + n_local].float()
            out["mixrl_group_std"] = grouped.std(1).nan_to_num(0.0).repeat_interleave(num_generations)[start : start + n_local].float()

        primary = rpf[:, 0]
        on = sources == prov.ON_POLICY
        guided = self._guided(n_local, device)
        free = on & (guided == 0)  # rollouts continued from a prefix or generated with a hint are not the policy's own accuracy
        nan = float("nan")  # TRL's logger drops NaN: no on-policy rows (SFT) logs no accuracy
        self._metrics[mode]["accuracy"].append(float((primary[free] >= 1.0 - 1e-6).float().mean()) if free.any() else nan)
        self._metrics[mode]["reward_on_policy"].append(float(rewards[free].mean()) if free.any() else nan)
        if training:
            self.mixrl_rollouts += int(on.sum())
            local_on = out["row_source"] == prov.ON_POLICY
            sampled = behaviour_known(out["token_source"]) & out["completion_mask"].bool()  # not prefix tokens
            gen = (sampled.float().sum(dim=1) * local_on.float()).sum()
            self.mixrl_generated_tokens += int(self.accelerator.reduce(gen, reduction="sum"))
            discarded = (self._mixrl_rollouts.discarded_tokens if self._mixrl_rollouts is not None else [])
            if any(inj.may_generate_more for inj in self.injections):  # a collective: every process or none
                d = self.accelerator.reduce(torch.tensor([len(discarded), sum(discarded)], device=device, dtype=torch.float32), reduction="sum")
                self.mixrl_rollouts += int(d[0])
                self.mixrl_generated_tokens += int(d[1])
            for inj in self.injections:
                out = inj.after_advantages(ctx, inputs, out)
        if self.teacher is not None and self._teacher_tokens:
            out["teacher_logp"] = self._teacher_logps(out, inputs, mode)
        for name in self.objective.selected():
            if name != "on_policy":
                has = (out["token_source"] == prov.code(name)).any(dim=1) if out["token_source"].numel() else out["row_source"] == prov.code(name)
                n_rows = self.accelerator.reduce(has.sum().float(), reduction="sum")
                self._metrics[mode][f"{name}/rows"].append(float(n_rows))
        if training:
            self._log_injection_metrics(mode)
            if self.mixrl_sample_rows > 0:  # a few rows for samples.jsonl (mixrl.trainer.callbacks.SampleLogCallback)
                self.mixrl_samples = capture_rows(
                    out, tokenizer=self.processing_class, rewards=rewards, rewards_per_func=rpf, reward_names=list(self.reward_func_names),
                    start=start, n=self.mixrl_sample_rows, max_chars=self.mixrl_sample_chars, n_local_scored=n_local,
                    guided=self._mixrl_rollouts.guided if self._mixrl_rollouts is not None else None, scored_sources=scored_sources,
                )
        self._mixrl_normalisers = self._global_counts(out)
        return out

    def _before_generation(self, inputs):
        """The injections' ``before_generation``, in order."""
        ctx = self._inject_context()
        for inj in self.injections:
            inputs = inj.before_generation(ctx, inputs)
        return inputs

    def _save_checkpoint(self, model, trial):
        """mixrl's files go into the checkpoint folder *before* TRL writes its own, so a
        checkpoint that looks complete (``trainer_state.json`` is written last) has them even
        when the run is killed right after it: the rollout counters, the controller's and the
        injections' state (an injection with ``state_in_file``: one torch.save file per process)."""
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        self._save_mixrl_state(folder)
        self._save_sampler_state(folder)
        self._save_critic(folder)
        super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        self._load_mixrl_state(checkpoint)
        self._load_sampler_state(checkpoint)
        self._load_critic(checkpoint)

    # ------------------------------------------------------------------ loss
    def _forward_by_row_kind(self, model, inputs):
        """Per-token log-probs and entropies. Rows the injections appended or wrote (another
        ``row_source`` than the rollouts) get a forward of their own, trimmed to their longest
        completion, so they cost their own tokens rather than the rollouts' padded width.
        Rows are independent: the values are those of one forward over the micro-batch, up
        to float rounding (measured: equal to 1e-6 on the pinned cases). With a sharded policy
        (:meth:`_forwards_collective`) every micro-batch gets one forward: the kinds of rows
        differ between processes (expert rows, replayed rows, teacher rows land on some), and
        one forward per kind would leave a process waiting for a forward the others never run."""
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        kinds = inputs["row_source"].unique()
        if len(kinds) == 1 or self._forwards_collective():
            ids = torch.cat([prompt_ids, completion_ids], dim=1)
            att = torch.cat([prompt_mask, completion_mask], dim=1)
            logps, entropies, _ = self._get_per_token_logps_and_entropies(
                model, ids, att, completion_ids.size(1), compute_entropy=True
            )
            return logps, entropies
        logps = entropies = None
        for kind in kinds:
            rows = torch.nonzero(inputs["row_source"] == kind).squeeze(1)
            w = completion_ids.size(1)
            if int(kind) != prov.ON_POLICY:
                w = int(completion_mask[rows].sum(-1).max().clamp(min=1))
            ids = torch.cat([prompt_ids[rows], completion_ids[rows, :w]], dim=1)
            att = torch.cat([prompt_mask[rows], completion_mask[rows, :w]], dim=1)
            lp, ent, _ = self._get_per_token_logps_and_entropies(model, ids, att, w, compute_entropy=True)
            if logps is None:
                logps = lp.new_zeros(completion_ids.shape)
                entropies = ent.new_zeros(completion_ids.shape)
            cols = torch.arange(w, device=rows.device).unsqueeze(0)
            logps = logps.index_put((rows.unsqueeze(1), cols), lp)
            entropies = entropies.index_put((rows.unsqueeze(1), cols), ent)
        return logps, entropies

    def _first_pass(self) -> bool:
        """Is this micro-batch seen for the first time (not a later ``num_iterations`` pass)?"""
        generate_every = self.args.steps_per_generation * self.num_iterations
        return self._step % generate_every < self.args.steps_per_generation

    def _compute_loss(self, model, inputs):
        mode = "train" if self.model.training else "eval"
        if mode == "train" and self._mixrl_step_begin[0] != self.state.global_step:
            self._mixrl_step_begin = (int(self.state.global_step), int(self._step))
        logps, entropies = self._forward_by_row_kind(model, inputs)
        if mode == "train":
            self._controller_step_start(logps, inputs)
            if self.injections and self._first_pass():
                # the rollouts' behaviour log-probs, exactly what the policy term divides by
                old = inputs.get("old_per_token_logps")
                old = logps.detach() if old is None else old
                ctx = self._inject_context()
                for inj in self.injections:
                    inj.after_forward(ctx, inputs, old)
        knobs = self.controller.knobs() if (self.controller is not None and mode == "train") else None
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
            row_fields={k: v for k, v in inputs.items() if k.startswith("pair_")} or None,  # pair links (mixrl.core.preference)
        )
        if mode == "train":
            check_step(self, inputs, metrics)  # an advantage or loss term out of bounds stops the run (mixrl.trainer.magnitude)
            self._controller_step_end(metrics)
            if self.critic is not None:
                self._train_critic(inputs, mode)
        if self.controller is not None:
            metrics.update(self.controller.metrics())
        # loss/* parts are partial sums over this micro-batch: scale so TRL's mean over
        # micro-batches reports the whole step's value
        parts = self.current_gradient_accumulation_steps if mode == "train" else 1
        for key, value in metrics.items():
            self._metrics[mode][key].append(value * parts if key.startswith("loss/") else value)
        return loss
