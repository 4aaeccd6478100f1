"""What the parts need of TRL and the accelerator, named once: :class:`TrlHandles`.

:func:`from_trainer` reads a :class:`~mixrl.trainer.grpo.MixrlGRPOTrainer` whose TRL ``__init__``
has run, once, and is the only function that does: :func:`mixrl.trainer.assembly.build_parts`
receives the handles, never the trainer. Each TRL callable is named here (TRL's own methods past
mixrl's overrides where the parts must not see mixrl's hooks); a callable that resolves the
trainer's method at call time says so (a test may wrap that method on the trainer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trl.models import unwrap_model_for_generation
from trl.trainer.grpo_trainer import GRPOTrainer

from mixrl.trainer.trl_hooks.generation import max_new_tokens


@dataclass(frozen=True)
class TrlHandles:
    """The TRL objects, callables and accelerator facts the parts are built from."""

    # the accelerator
    device: Any
    num_processes: int
    process_index: int
    sharded: bool  # FSDP or ZeRO-3 over several processes: every process joins every policy forward
    gather: Callable
    reduce: Callable  # accelerate's reduce(tensor, reduction)
    pad_across_processes: Callable
    unwrap: Callable  # model -> the model without its wrappers
    for_generation: Callable  # model -> context giving the model ready to generate (TRL's unwrap_model_for_generation)
    # what TRL built or was given
    policy: Any  # the policy as TRL prepared it (at construction)
    current_policy: Callable  # () -> the policy now (transformers may re-wrap it when training starts)
    ref_model: Callable  # () -> TRL's reference model now (None: the policy with its adapter disabled, or no KL)
    tokenizer: Any
    args: Any  # the GRPOConfig (read, never written)
    reward_funcs: list
    reward_weights: Any
    train_dataset: Any
    num_generations: int
    max_completion_length: int
    temperature: float
    eos_token_ids: Any
    use_vllm: bool
    beta: float
    vllm_generation: Any  # TRL's VLLMGeneration, or None
    # TRL's callables
    per_token_logps: Callable  # TRL's per-token log-probs (mixrl's override: packing), resolved at call time
    calculate_rewards: Callable  # TRL's own reward scoring, gathered (not mixrl's override)
    generate_one: Callable  # TRL's own single-turn generation of one completion per prompt (not mixrl's override)
    tokenize_prompts: Callable  # prompts -> TRL's prompt ids
    limit_new_tokens: Callable  # n -> context in which TRL's generation stops after n tokens
    param_groups: Callable  # () -> the optimizer's param groups (None before TRL builds the optimizer)


def from_trainer(trainer) -> TrlHandles:
    """The handles of ``trainer`` (its TRL ``__init__`` has run)."""
    acc = trainer.accelerator
    return TrlHandles(
        device=acc.device, num_processes=acc.num_processes, process_index=acc.process_index,
        sharded=acc.num_processes > 1 and (trainer._dist.is_fsdp or trainer._dist.is_zero3),
        gather=acc.gather, reduce=acc.reduce, pad_across_processes=acc.pad_across_processes, unwrap=acc.unwrap_model,
        for_generation=lambda model: unwrap_model_for_generation(model, acc),
        policy=trainer.model, current_policy=lambda: trainer.model, ref_model=lambda: trainer.ref_model, tokenizer=trainer.processing_class, args=trainer.args,
        reward_funcs=trainer.reward_funcs, reward_weights=trainer.reward_weights, train_dataset=trainer.train_dataset,
        num_generations=trainer.num_generations, max_completion_length=trainer.max_completion_length,
        temperature=trainer.temperature, eos_token_ids=trainer.eos_token_ids, use_vllm=trainer.use_vllm, beta=trainer.beta,
        vllm_generation=getattr(trainer, "vllm_generation", None),  # TRL sets it only when vLLM generates
        # resolved at call time: a test may wrap the trainer's function
        per_token_logps=lambda *a, **k: trainer._get_per_token_logps_and_entropies(*a, **k),
        calculate_rewards=lambda *a: GRPOTrainer._calculate_rewards(trainer, *a),
        generate_one=lambda prompts: GRPOTrainer._generate_single_turn(trainer, prompts, None, {}, 1),
        tokenize_prompts=lambda prompts: trainer._tokenize_prompts(prompts)[0],
        limit_new_tokens=lambda n: max_new_tokens(trainer, n),
        param_groups=lambda: trainer.optimizer.param_groups if trainer.optimizer is not None else None,
    )
