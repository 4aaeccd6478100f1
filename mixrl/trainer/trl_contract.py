"""Everything of TRL (and of transformers' ``Trainer``) that mixrl reaches past the public API for, in one list.

:data:`mixrl.trainer.grpo.OVERRIDDEN` lists the methods ``MixrlGRPOTrainer`` replaces; :data:`TOUCHED`
lists the rest: private methods mixrl calls, private fields it reads or writes, and public TRL
objects it replaces (for a block or for good). ``tests/test_trl_contract.py`` pins each one (a
method's signature, a field's assignment in its owner's source, a patched object's existence) and
scans ``mixrl/`` for any private name of TRL's trainer, vLLM generation or vLLM client that is not
listed here or in ``OVERRIDDEN``: a TRL upgrade that renames one fails there, with its name, not
mid-training. The scan (``tests/trl_scan.py``) resolves the receiver where the source says what it
is: ``self._x`` in a class that derives from neither TRL nor transformers (nor is a mixin of such a
class) is that class's own; ``trainer._x``, ``super()._x`` in a TRL-derived class and any receiver it
cannot resolve count.

Only ``mixrl/trainer/`` touches TRL's internals: the same test fails when a use the scan finds, or an
assignment to a ``"patched"`` name on an object that may be TRL's (``VLLMClient.init_communicator = ...``,
``setattr(vllm_generation, "LLM", ...)``), lies anywhere else in ``mixrl/``. Code elsewhere asks the
trainer (``MixrlGRPOTrainer.push_engine_weights`` / ``generate_on_engine`` for the benchmarks' engine)
or lives in the trainer's package (:mod:`mixrl.trainer.trl_vllm` for vLLM's CPU build).

Each entry: ``(owner, name, kind, who)``. ``owner`` is the dotted path of the class (or module)
that defines ``name``; ``kind`` is ``"method"`` (called), ``"field"`` (read or written) or
``"patched"`` (a public attribute mixrl replaces); ``who`` says where (a module of ``mixrl.trainer``)
and why.
"""

from __future__ import annotations

GRPO = "trl.GRPOTrainer"
HF = "transformers.Trainer"
VG = "trl.generation.vllm_generation.VLLMGeneration"
CLIENT = "trl.generation.vllm_client.VLLMClient"
ARGS = "trl.GRPOConfig"

TOUCHED: tuple[tuple[str, str, str, str], ...] = (
    # private methods mixrl calls (TRL's own, past mixrl's override where one exists)
    (GRPO, "_calculate_rewards", "method", "trl_handles: Scoring scores completions other than the rollouts with TRL's own (gathered) rewards"),
    (GRPO, "_generate_single_turn", "method", "trl_handles (Injections) and env_rollout generate with TRL's own generation (vLLM, sampling, EOS)"),
    (GRPO, "_get_per_token_logps_and_entropies", "method", "trl_handles: Forwards' per-token log-probs (the override: packing)"),
    (GRPO, "_tokenize_prompts", "method", "trl_handles: prompts to ids as TRL tokenizes them (teachers, injections, async generation)"),
    (GRPO, "_prepare_inputs", "method", "trl_hooks.loss.budget_step: a token-budget step takes TRL's whole generation batch"),
    (HF, "_get_output_dir", "method", "trl_hooks.checkpoints.save (grpo._save_checkpoint): the checkpoint folder mixrl's files go into first"),
    (GRPO, "_save_checkpoint", "method", "run_steps.save_now: the divergence guard's and a stopped run's checkpoint (the override writes mixrl's files)"),
    (CLIENT, "_post", "method", "trl_vllm.install_client: the weight-update request naming the file (CPU trainer, server mode)"),
    (CLIENT, "_start_weight_update", "method", "trl_vllm.install_client: as TRL's update_named_params brackets one update"),
    (CLIENT, "_finish_weight_update", "method", "trl_vllm.install_client: as above"),
    # private fields mixrl reads or writes
    (GRPO, "_metrics", "field", "grpo and trl_hooks: the only writers of parts' metrics (mode -> key -> list), and PeriodicEvalCallback's eval/*"),
    (GRPO, "_step", "field", "grpo and trl_hooks: TRL's micro-step counter (injections' draws, num_iterations passes, the budget step; restored on resume)"),
    (GRPO, "_buffered_inputs", "field", "trl_hooks.checkpoints.BufferedBatch: the generation batch a checkpoint between two generations carries"),
    (GRPO, "_current_train_step_time", "field", "trl_hooks.loss.budget_step: TRL's step time, kept as GRPOTrainer.training_step keeps it"),
    (GRPO, "_last_loaded_step", "field", "trl_hooks.async_vllm (async mode; push_engine_weights for benchmarks/engine.py): the step whose weights vLLM holds"),
    (GRPO, "_dist", "field", "trl_handles: is_fsdp / is_zero3 decide whether every process joins every policy forward"),
    (VG, "_llm_weights_sleeping", "field", "trl_hooks.async_vllm.generate_on_engine (benchmarks/engine.py, through the trainer): the engine put to sleep after a benchmark, as TRL leaves it"),
    (CLIENT, "_updating_weights", "field", "trl_vllm.install_client: inside TRL's weight_update bracket or not"),
    ("transformers.integrations.WandbCallback", "_wandb", "field", "callbacks.publish_samples: a wandb.Table of samples"),
    ("transformers.integrations.TensorBoardCallback", "_init_summary_writer", "method", "callbacks.publish_samples: the writer reopened after training"),
    # public TRL objects mixrl replaces
    (VG, "generate", "patched", "trl_hooks.async_vllm.wrap_vllm: async mode routes TRL's vLLM generation through the pipeline"),
    (VG, "sync_weights", "patched", "trl_hooks.async_vllm.wrap_vllm: async mode pushes weights through the pipeline"),
    (CLIENT, "init_communicator", "patched", "trl_vllm.install_client: a CPU trainer syncs weights through files"),
    (CLIENT, "update_named_params", "patched", "trl_vllm.install_client: as above"),
    ("trl.generation.vllm_generation", "LLM", "patched", "trl_vllm.colocated_engine_dtype: the colocated engine's dtype, while TRL builds it"),
    (GRPO, "generation_config", "patched", "trl_hooks.generation.max_new_tokens: the sampler's length curriculum, for a block"),
    (GRPO, "generation_kwargs", "patched", "trl_hooks.generation.max_new_tokens: as above"),
    (ARGS, "per_device_train_batch_size", "patched", "parts.token_budget.scoring_rows: the no-grad forwards' rows under a budget, for a block"),
    # transformers' generation (not TRL's): replaced on the policy instance for one generate call
    ("transformers.GenerationMixin", "_get_stopping_criteria", "patched",
     "generation.compact: the criteria generate builds, observed (which rows are done, as generate's unfinished_sequences)"),
)


def names(kind: str | None = None) -> set[str]:
    """The touched names (of one ``kind``)."""
    return {name for _, name, k, _ in TOUCHED if kind is None or k == kind}
