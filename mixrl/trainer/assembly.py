"""The trainer's parts, built in one place: :func:`build_parts`.

:func:`mixrl.trainer.build.trainer_from_config` turns the config into the objects a run is made
of (the objective, the injections, the controller, the teacher spec, the sampler, the critic's
config node, ``trainer.staleness``, ``hardware.vllm_async``), names them once in a
:class:`~mixrl.trainer.parts_spec.PartsSpec` and hands it to
:class:`~mixrl.trainer.grpo.MixrlGRPOTrainer` (``spec=``). Once TRL's ``GRPOTrainer.__init__`` has built
the policy, the accelerator and the reward functions, the trainer calls :func:`build_parts`,
which builds every part (:mod:`mixrl.trainer.parts`) and gives each, as keyword arguments, only
what it needs of TRL: values, and TRL's functions as callables. This module and
:mod:`mixrl.trainer.grpo` are the TRL glue; the parts themselves never import TRL.

Order (each step needs the ones above it):

0. ``Packing`` (``trainer.padding_free``): every forward's rows, the critic's too.
1. ``Forwards`` and ``Scoring``: from TRL's per-token log-prob function, the sharding
   layout, the tokenizer and the reward functions.
2. Teachers: after the policy, because a teacher takes its dtype (``teacher.dtype=auto``) and
   device; TRL's LM-head tile width is fitted once the policy and the teachers exist.
3. The critic: a copy of the policy's backbone (after the teachers, as before this module
   existed: the order of construction is the order of random draws, which the pins fix).
4. The sampler, the controller, the lagged weights, ReMax's baseline.
5. The injections' context: it offers the teachers, the sampler and the scoring to injections.
6. Asynchronous generation: it wraps TRL's vLLM client, already built.
7. Token-budget micro-batches (``trainer.max_tokens_per_micro_batch``), for the no-grad scoring
   forwards too (``ScoringChunks``).

:func:`wrap_generation` (called by the trainer's ``__init__`` after :func:`build_parts`) wraps the
policy's generation for ``trainer.generation``: shared prefill, or the continuous engine's cache
sized per call.
"""

from __future__ import annotations

import os

import torch
from transformers import AutoModelForCausalLM, DynamicCache
from trl.data_utils import is_conversational
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.grpo_trainer import use_adapter
from trl.trainer.utils import add_fused_lm_head

from mixrl.core.advantages import advantage_needs
from mixrl.core.controllers import sum_over_processes
from mixrl.core import ADVANTAGES
from mixrl.core.terms import term_needs
from mixrl.trainer.generation.async_generation import AsyncGeneration, AsyncPipeline
from mixrl.trainer.generation.compact import CompactGeneration
from mixrl.trainer.generation.lagged_weights import LaggedWeights, cpu_copy, trainable
from mixrl.trainer.generation.paged_cache import PagedCacheSizing
from mixrl.trainer.generation.shared_prefill import SharedPrefill
from mixrl.trainer.lm_head import fit_tile_to_vocab
from mixrl.trainer.parts import Parts
from mixrl.trainer.parts.advantage_shaping import AdvantageShaping
from mixrl.trainer.parts.controller_steps import ControllerSteps
from mixrl.trainer.parts.critic import Critic
from mixrl.trainer.parts.forwards import Forwards
from mixrl.trainer.parts.injection_context import Injections
from mixrl.trainer.parts.packing import Packing
from mixrl.trainer.parts.scoring_chunks import ScoringChunks
from mixrl.trainer.parts.remax_baseline import RemaxBaseline
from mixrl.trainer.parts.sampler_rounds import SamplerRounds
from mixrl.trainer.parts.scoring import Scoring
from mixrl.trainer.parts.teacher import SELF, Teachers
from mixrl.trainer.parts.token_budget import TokenBudget
from mixrl.trainer.parts_spec import PartsSpec
from mixrl.trainer.trl_handles import TrlHandles


def load_teacher_models(teacher, *, policy_dtype, device, temperature: float, cast_lm_head_to_fp32: bool) -> list:
    """The teacher models, frozen, on their device and dtype, with TRL's fused LM head at the
    run's temperature (as TRL prepares its reference model); :data:`SELF` stands for the policy."""
    models = []
    for path in teacher.paths or teacher.resolve():
        if path == "self":
            models.append(SELF)
            continue
        dtype = policy_dtype if teacher.dtype == "auto" else getattr(torch, teacher.dtype)
        m = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        m.to(teacher.device or device).eval()
        m.requires_grad_(False)
        add_fused_lm_head(m, temperature=temperature, cast_lm_head_to_fp32=cast_lm_head_to_fp32)
        models.append(m)
    return models


def build_parts(h: TrlHandles, spec: PartsSpec) -> Parts:
    """Every part, from the handles of a trainer whose TRL ``__init__`` has run
    (:func:`mixrl.trainer.trl_handles.from_trainer`), in the order of the module docstring. No part
    sees the trainer. ``spec``: what the config asked for (a field None / 0: that part is off)."""
    args, tok, device = h.args, h.tokenizer, h.device
    objective, token_budget = spec.objective, spec.token_budget
    _, advantage_params, include_offpolicy = spec.advantage

    # 0. padding-free rows (trainer.padding_free): every forward's, the critic's too; auto says once per model why not
    packing = Packing(spec.padding_free, say=lambda text: print(text) if int(os.environ.get("RANK", "0")) == 0 else None)

    # 1. forwards and scoring
    forwards = Forwards(
        h.per_token_logps, collective=h.sharded,
        device=device, pad_token_id=tok.pad_token_id,
        dummy_token=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
        # rows per no-grad forward: trainer.micro_batch_size (under a token budget TRL's batch size is the whole step)
        batch_size=(token_budget or {}).get("scoring_batch_size") or args.per_device_train_batch_size,
        no_checkpointing=lambda model: disable_gradient_checkpointing(model, args.gradient_checkpointing_kwargs),
    )
    scoring = Scoring(
        reward_funcs=h.reward_funcs, reward_weights=h.reward_weights,
        decode=lambda ids: tok.batch_decode(ids, skip_special_tokens=True),
        calculate=h.calculate_rewards, is_conversational=is_conversational, device=device,
    )

    # 2. teachers, then TRL's LM-head tile for the policy and them
    teachers = _teachers(h, spec.teacher, objective, forwards) if spec.teacher is not None else None
    fit_tile_to_vocab([h.unwrap(h.policy), *(teachers.frozen if teachers is not None else [])])

    # 3. the critic
    critic_part = None
    if spec.critic is not None:
        critic_part = Critic.from_policy(spec.critic, policy=h.unwrap(h.policy), device=device,
                                         advantage_params=advantage_params, include_offpolicy=include_offpolicy,
                                         reward_funcs=h.reward_funcs, reward_weights=h.reward_weights,
                                         batch_size=forwards.batch_size, packing=packing)

    # 4. sampler, controller, lagged weights, ReMax
    sampler_part = None
    if spec.sampler is not None:
        sampler_part = SamplerRounds(spec.sampler, spec.sampler_length, dataset=h.train_dataset,
                                     num_generations=h.num_generations, pad_token_id=tok.pad_token_id,
                                     weigh=scoring.weighted)
    controller_part = None
    if spec.controller is not None:
        controller_part = ControllerSteps(
            spec.controller, policy_tokens=next((t.tokens for t in objective.terms if t.kind == "policy"), ("on_policy",)),
            reduce_sum=sum_over_processes if h.num_processes > 1 else None,  # torch.distributed all-reduce
            reduce_mean=lambda t: h.reduce(t, "mean"), gather=h.gather, device=device, param_groups=h.param_groups,
        )
    lag = LaggedWeights(spec.staleness) if int(spec.staleness) > 0 else None
    remax = None
    if "baseline_rewards" in advantage_needs(ADVANTAGES.get(spec.advantage[0])):
        remax = RemaxBaseline(eos_token_ids=h.eos_token_ids, scoring=scoring, process_index=h.process_index,
                              for_generation=h.for_generation)

    # 5. the injections' context
    inject = Injections(
        list(spec.injections), tokenizer=tok, process_index=h.process_index, num_processes=h.num_processes,
        num_generations=h.num_generations, max_completion_length=h.max_completion_length, device=device,
        tokenize_prompts=h.tokenize_prompts, gather=h.gather,
        # TRL's own generation (not mixrl's override): vLLM, sampling settings and EOS handling are the rollouts'
        generate_one=h.generate_one,
        gathers_prompts=h.use_vllm and getattr(args, "vllm_mode", "") == "server",
        forwards=forwards, scoring=scoring, teachers=teachers, sampler=sampler_part,
        ref_logps=_ref_logps(h, forwards) if h.beta != 0.0 else None,
        max_positions=getattr(getattr(h.unwrap(h.policy), "config", None), "max_position_embeddings", None),
        max_new_tokens=h.limit_new_tokens,  # what a builder asks the policy to write is shorter than a rollout
        ref_model=h.ref_model() if h.beta != 0.0 else None,  # Nash-MD's mixture (mixrl.sources.nash_md), SePPO's checkpoints
    )

    # 6.-8. asynchronous generation (TRL's vLLM client, wrapped), token-budget micro-batches, the post-advantage shaping
    return Parts(forwards=forwards, scoring=scoring, injections=inject, packing=packing, teachers=teachers, critic=critic_part,
                 remax=remax, sampler=sampler_part, controller=controller_part, lag=lag,
                 async_gen=_async_generation(h, int(spec.async_generation)) if int(spec.async_generation) else None,
                 budget=_token_budget(h, token_budget) if token_budget is not None else None,
                 score_chunks=ScoringChunks(int(token_budget["budget"]), collective=h.sharded, packed=packing.applies)
                 if token_budget is not None else None,
                 shaping=_shaping(h, spec.shaping, forwards) if spec.shaping is not None else None)


def _teachers(h: TrlHandles, teacher, objective, forwards: Forwards) -> Teachers:
    """The teacher part: its models loaded after the policy (its dtype and device), the terms' teacher tokens."""
    args, tok = h.args, h.tokenizer
    models = load_teacher_models(teacher, policy_dtype=next(h.policy.parameters()).dtype, device=h.device,
                                 temperature=h.temperature,
                                 cast_lm_head_to_fp32=bool(getattr(args, "cast_lm_head_to_fp32", False)))
    return Teachers(
        teacher, models, forwards=forwards,
        tokens=tuple(sorted({p for t in objective.terms if "teacher_logp" in term_needs(t.kind) for p in t.tokens})),
        entropy=any("teacher_entropy" in term_needs(t.kind) for t in objective.terms),  # SRPO's weights
        tokenize_prompts=h.tokenize_prompts, reduce_sum=lambda t: h.reduce(t, reduction="sum"),
        temperature=h.temperature, top_p=float(args.top_p), max_completion_length=h.max_completion_length,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )


def _ref_logps(h: TrlHandles, forwards: Forwards):
    def ref_logps(policy, prompt_ids, completion_ids):
        """Per-token log-probs under the reference model, as TRL computes them for rollouts: its
        ``ref_model``, or with a PEFT adapter the base model (the adapter disabled; an initial
        copy named "ref" when re-training one). No gradient."""
        ref_model = h.ref_model()
        if ref_model is not None:
            return forwards.score_token_lists(ref_model, prompt_ids, completion_ids, is_policy=False)
        model = h.unwrap(policy)
        with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
            return forwards.score_token_lists(policy, prompt_ids, completion_ids, is_policy=True)

    return ref_logps


def _async_generation(h: TrlHandles, max_staleness: int) -> AsyncPipeline:
    """``hardware.vllm_async``: TRL's vLLM client (already built), wrapped."""
    vg = h.vllm_generation
    generate = vg.generate
    return AsyncPipeline(AsyncGeneration(
        generate=lambda ids, n: generate(prompts=ids, images=None, num_generations=n),
        push=vg.sync_weights,
        snapshot=lambda: cpu_copy(trainable(h.unwrap(h.current_policy()))),
        max_staleness=max_staleness,
    ), tokenize_prompts=h.tokenize_prompts)


def _token_budget(h: TrlHandles, token_budget: dict) -> TokenBudget:
    """``trainer.max_tokens_per_micro_batch``: as many micro-batches on every process (the largest count)."""
    def reduce_max(n: int) -> int:
        if h.num_processes == 1:
            return int(n)
        most = torch.tensor([int(n)], dtype=torch.long, device=h.device)
        torch.distributed.all_reduce(most, op=torch.distributed.ReduceOp.MAX)
        return int(most)

    return TokenBudget(int(token_budget["budget"]), packed=bool(token_budget.get("packed", False)),
                       reduce_max=reduce_max, scoring_batch_size=token_budget.get("scoring_batch_size"))


def wrap_generation(model, generation: str) -> SharedPrefill | CompactGeneration | PagedCacheSizing | None:
    """The policy's generation as ``trainer.generation`` asks beyond TRL's flags
    (:func:`mixrl.config.generation.generation_args`): ``shared-prefill`` wraps its ``generate``
    (each group's prompt prefilled once), ``compact`` too (finished rows no longer computed),
    ``continuous`` sizes the engine's paged cache per call (it acts where the config sets
    ``num_blocks``: on CPU). ``model``: the policy without its wrappers. None: nothing installed."""
    if generation == "shared-prefill":
        return SharedPrefill(model, new_cache=lambda: DynamicCache(config=model.config.get_text_config(decoder=True)))
    if generation == "compact":
        return CompactGeneration(model)
    if generation == "continuous":
        return PagedCacheSizing(model)
    return None


def _shaping(h: TrlHandles, shaping: tuple, forwards: Forwards) -> AdvantageShaping:
    """``algo.shaping``: the post-advantage stage."""
    return AdvantageShaping(shaping[0], shaping[1], offpolicy=shaping[2], forwards=forwards, gather=h.gather,
                            pad=lambda t: h.pad_across_processes(t, dim=1, pad_index=0), process_index=h.process_index)
