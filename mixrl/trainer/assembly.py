"""The trainer's parts, built in one place: :func:`build_parts`.

:func:`mixrl.trainer.build.trainer_from_config` turns the config into the objects a run is made
of (the objective, the injections, the controller, the teacher spec, the sampler, the critic's
config node, ``trainer.staleness``, ``hardware.vllm_async``) and hands them to
:class:`~mixrl.trainer.grpo.MixrlGRPOTrainer`. Once TRL's ``GRPOTrainer.__init__`` has built
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
7. Token-budget micro-batches (``trainer.max_tokens_per_micro_batch``).
"""

from __future__ import annotations

import os

import torch
from transformers import AutoModelForCausalLM
from trl.data_utils import is_conversational
from trl.models import unwrap_model_for_generation
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.grpo_trainer import GRPOTrainer, use_adapter
from trl.trainer.utils import add_fused_lm_head

from mixrl.core.advantages import advantage_needs
from mixrl.core.controllers import sum_over_processes
from mixrl.core import ADVANTAGES
from mixrl.core.terms import term_needs
from mixrl.trainer.generation.async_generation import AsyncGeneration, AsyncPipeline
from mixrl.trainer.generation.lagged_weights import LaggedWeights, cpu_copy, trainable
from mixrl.trainer.lm_head import fit_tile_to_vocab
from mixrl.trainer.parts import Parts
from mixrl.trainer.parts.advantage_shaping import AdvantageShaping
from mixrl.trainer.parts.controller_steps import ControllerSteps
from mixrl.trainer.parts.critic import Critic
from mixrl.trainer.parts.forwards import Forwards
from mixrl.trainer.parts.injection_context import Injections
from mixrl.trainer.parts.packing import Packing
from mixrl.trainer.parts.remax_baseline import RemaxBaseline
from mixrl.trainer.parts.sampler_rounds import SamplerRounds
from mixrl.trainer.parts.scoring import Scoring
from mixrl.trainer.parts.teacher import SELF, Teachers
from mixrl.trainer.parts.token_budget import TokenBudget


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


def build_parts(trainer, *, objective, advantage: tuple[str, dict, bool], injections: list, controller=None, teacher=None,
                staleness: int = 0, async_generation: int = 0, sampler=None, sampler_length=None,
                critic: dict | None = None, token_budget: dict | None = None, shaping: tuple | None = None,
                padding_free: str = "false") -> Parts:
    """Every part of ``trainer`` (a :class:`~mixrl.trainer.grpo.MixrlGRPOTrainer` whose TRL
    ``__init__`` has run), in the order of the module docstring. ``trainer`` is read here, once;
    no part keeps it. The keyword arguments are what the config asked for (None / 0: off)."""
    acc, args, tok = trainer.accelerator, trainer.args, trainer.processing_class
    device = acc.device
    _, advantage_params, include_offpolicy = advantage

    # 0. padding-free rows (trainer.padding_free): every forward's, the critic's too; auto says once per model why not
    packing = Packing(padding_free, say=lambda text: print(text) if int(os.environ.get("RANK", "0")) == 0 else None)

    # 1. forwards and scoring
    forwards = Forwards(
        # resolved at call time: a test may wrap the trainer's function
        lambda *a, **k: trainer._get_per_token_logps_and_entropies(*a, **k),
        collective=acc.num_processes > 1 and (trainer._dist.is_fsdp or trainer._dist.is_zero3),
        device=device, pad_token_id=tok.pad_token_id,
        dummy_token=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
        # rows per no-grad forward: trainer.micro_batch_size (under a token budget TRL's batch size is the whole step)
        batch_size=(token_budget or {}).get("scoring_batch_size") or args.per_device_train_batch_size,
        no_checkpointing=lambda model: disable_gradient_checkpointing(model, args.gradient_checkpointing_kwargs),
    )
    scoring = Scoring(
        reward_funcs=trainer.reward_funcs, reward_weights=trainer.reward_weights,
        decode=lambda ids: tok.batch_decode(ids, skip_special_tokens=True),
        calculate=lambda *a: GRPOTrainer._calculate_rewards(trainer, *a),  # TRL's own (gathered), not mixrl's override
        is_conversational=is_conversational, device=device,
    )
    tokenize_prompts = lambda prompts: trainer._tokenize_prompts(prompts)[0]  # noqa: E731

    # 2. teachers, then TRL's LM-head tile for the policy and them
    teachers = None
    if teacher is not None:
        models = load_teacher_models(teacher, policy_dtype=next(trainer.model.parameters()).dtype, device=device,
                                     temperature=trainer.temperature,
                                     cast_lm_head_to_fp32=bool(getattr(args, "cast_lm_head_to_fp32", False)))
        teachers = Teachers(
            teacher, models, forwards=forwards,
            tokens=tuple(sorted({p for t in objective.terms if "teacher_logp" in term_needs(t.kind) for p in t.tokens})),
            entropy=any("teacher_entropy" in term_needs(t.kind) for t in objective.terms),  # SRPO's weights
            tokenize_prompts=tokenize_prompts, reduce_sum=lambda t: acc.reduce(t, reduction="sum"),
            temperature=trainer.temperature, top_p=float(args.top_p), max_completion_length=trainer.max_completion_length,
            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        )
    fit_tile_to_vocab([acc.unwrap_model(trainer.model), *(teachers.frozen if teachers is not None else [])])

    # 3. the critic
    critic_part = None
    if critic is not None:
        critic_part = Critic.from_policy(critic, policy=acc.unwrap_model(trainer.model), device=device,
                                         advantage_params=advantage_params, include_offpolicy=include_offpolicy,
                                         reward_funcs=trainer.reward_funcs, reward_weights=trainer.reward_weights,
                                         batch_size=forwards.batch_size, packing=packing)

    # 4. sampler, controller, lagged weights, ReMax
    sampler_part = None
    if sampler is not None:
        sampler_part = SamplerRounds(sampler, sampler_length, dataset=trainer.train_dataset,
                                     num_generations=trainer.num_generations, pad_token_id=tok.pad_token_id,
                                     weigh=scoring.weighted)
    controller_part = None
    if controller is not None:
        controller_part = ControllerSteps(
            controller, policy_tokens=next((t.tokens for t in objective.terms if t.kind == "policy"), ("on_policy",)),
            reduce_sum=sum_over_processes if acc.num_processes > 1 else None,  # torch.distributed all-reduce
            reduce_mean=lambda t: acc.reduce(t, "mean"), gather=acc.gather, device=device,
            param_groups=lambda: trainer.optimizer.param_groups if trainer.optimizer is not None else None,
        )
    lag = LaggedWeights(staleness) if int(staleness) > 0 else None
    remax = None
    if "baseline_rewards" in advantage_needs(ADVANTAGES.get(advantage[0])):
        remax = RemaxBaseline(eos_token_ids=trainer.eos_token_ids, scoring=scoring, process_index=acc.process_index,
                              for_generation=lambda model: unwrap_model_for_generation(model, acc))

    # 5. the injections' context
    def ref_logps(policy, prompt_ids, completion_ids):
        """Per-token log-probs under the reference model, as TRL computes them for rollouts: its
        ``ref_model``, or with a PEFT adapter the base model (the adapter disabled; an initial
        copy named "ref" when re-training one). No gradient."""
        if trainer.ref_model is not None:
            return forwards.score_token_lists(trainer.ref_model, prompt_ids, completion_ids, is_policy=False)
        model = acc.unwrap_model(policy)
        with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
            return forwards.score_token_lists(policy, prompt_ids, completion_ids, is_policy=True)

    inject = Injections(
        list(injections or []), tokenizer=tok, process_index=acc.process_index, num_processes=acc.num_processes,
        num_generations=trainer.num_generations, max_completion_length=trainer.max_completion_length, device=device,
        tokenize_prompts=tokenize_prompts, gather=acc.gather,
        # TRL's own generation (not mixrl's override): vLLM, sampling settings and EOS handling are the rollouts'
        generate_one=lambda prompts: GRPOTrainer._generate_single_turn(trainer, prompts, None, {}, 1),
        gathers_prompts=trainer.use_vllm and getattr(args, "vllm_mode", "") == "server",
        forwards=forwards, scoring=scoring, teachers=teachers, sampler=sampler_part,
        ref_logps=ref_logps if trainer.beta != 0.0 else None,
        max_positions=getattr(getattr(acc.unwrap_model(trainer.model), "config", None), "max_position_embeddings", None),
        max_new_tokens=trainer._max_new_tokens,  # what a builder asks the policy to write is shorter than a rollout
    )

    # 6. asynchronous generation: TRL's vLLM client, wrapped
    async_gen = None
    if int(async_generation):
        vg = trainer.vllm_generation
        generate = vg.generate
        async_gen = AsyncPipeline(AsyncGeneration(
            generate=lambda ids, n: generate(prompts=ids, images=None, num_generations=n),
            push=vg.sync_weights,
            snapshot=lambda: cpu_copy(trainable(acc.unwrap_model(trainer.model))),
            max_staleness=int(async_generation),
        ), tokenize_prompts=tokenize_prompts)

    # 7. token-budget micro-batches: as many on every process (the largest count)
    budget = None
    if token_budget is not None:
        def reduce_max(n: int) -> int:
            if acc.num_processes == 1:
                return int(n)
            most = torch.tensor([int(n)], dtype=torch.long, device=device)
            torch.distributed.all_reduce(most, op=torch.distributed.ReduceOp.MAX)
            return int(most)

        budget = TokenBudget(int(token_budget["budget"]), packed=bool(token_budget.get("packed", False)),
                             reduce_max=reduce_max, scoring_batch_size=token_budget.get("scoring_batch_size"))

    # 8. the post-advantage shaping (algo.shaping)
    shaping_part = None
    if shaping is not None:
        shaping_part = AdvantageShaping(shaping[0], shaping[1], offpolicy=shaping[2], forwards=forwards, gather=acc.gather,
                                        pad=lambda t: acc.pad_across_processes(t, dim=1, pad_index=0), process_index=acc.process_index)

    return Parts(forwards=forwards, scoring=scoring, injections=inject, packing=packing, teachers=teachers, critic=critic_part,
                 remax=remax, sampler=sampler_part, controller=controller_part, lag=lag, async_gen=async_gen,
                 budget=budget, shaping=shaping_part)

