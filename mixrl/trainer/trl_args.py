"""TRL's arguments of a config: :func:`grpo_args` (the ``GRPOConfig``) and :func:`peft_config` (LoRA)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from mixrl.config.builders import build_objective
from mixrl.config.builders import plain as _plain
from mixrl.config.generation import generation_args
from mixrl.config.geometry import Geometry, geometry
from mixrl.config.ref_reset import ref_reset_args
from mixrl.config.shaping import shaping_reads_ref
from mixrl.core.terms import term_needs
from mixrl.trainer import fsdp


def grpo_args(cfg: DictConfig, run_dir: Path, geom: Geometry | None = None, **fields):
    """The run's ``GRPOConfig``, built once and complete: the config's fields (:func:`_config_fields`)
    and ``fields``, what the trainer's build decides beside the config (the reward weights, the tool
    loop's rounds, a benchmark's ``generation_kwargs``), which take precedence. Nothing writes it after."""
    from trl import GRPOConfig  # deferred: trl imports transformers; the light commands (--help, config show, plan) never load it

    return GRPOConfig(**{**_config_fields(cfg, run_dir, geom or geometry(cfg)), **fields})


def _config_fields(cfg: DictConfig, run_dir: Path, geom: Geometry) -> dict:
    """``GRPOConfig``'s fields from the config."""
    t, hw = cfg.trainer, cfg.hardware
    cpu = hw.device == "cpu"
    dtype = None if cfg.model.dtype == "auto" else cfg.model.dtype
    budget = t.get("max_tokens_per_micro_batch")
    return dict(
        output_dir=str(run_dir / "trainer"),
        seed=int(cfg.seed),
        max_steps=int(t.max_steps),
        learning_rate=float(t.learning_rate),
        lr_scheduler_type=str(t.lr_scheduler_type),
        warmup_steps=int(t.warmup_steps),
        weight_decay=float(t.weight_decay),
        max_grad_norm=float(t.max_grad_norm),
        adam_beta1=float(t.adam_beta1),
        adam_beta2=float(t.adam_beta2),
        adam_epsilon=float(t.adam_epsilon),
        # a token budget: TRL hands the whole step to one training_step, split there (mixrl.trainer.parts.token_budget)
        per_device_train_batch_size=geom.rows_per_process if budget else geom.micro_batch_size,
        gradient_accumulation_steps=1 if budget else geom.grad_accum,
        steps_per_generation=1 if budget else geom.grad_accum,
        num_generations=geom.num_generations,
        num_iterations=int(t.num_iterations),
        temperature=float(t.temperature),
        top_p=float(t.top_p),
        top_k=int(t.top_k),
        max_completion_length=int(t.max_completion_length),
        mask_truncated_completions=bool(t.mask_truncated_completions),
        beta=float(cfg.algo.kl.coef) or (1.0 if _needs_ref_logp(cfg) else 0.0),  # TRL computes reference log-probs iff beta != 0
        logging_steps=int(t.logging_steps),
        save_strategy="steps" if t.save_steps else "no",
        save_steps=int(t.save_steps) if t.save_steps else 500,
        save_total_limit=int(t.save_total_limit) or None,
        logging_nan_inf_filter=False,  # a non-finite loss must reach the divergence guard (mixrl.trainer.guards)
        report_to=list(cfg.logger.report_to),
        log_completions=bool(cfg.logger.log_completions),
        use_cpu=cpu,
        bf16=bool(hw.bf16) and not cpu,
        gradient_checkpointing=bool(hw.gradient_checkpointing) and not cpu,
        use_vllm=bool(hw.use_vllm),
        **generation_args(cfg, geom.rows_per_process),  # trainer.generation: transformers' continuous batching (mixrl.config.generation)
        vllm_mode=str(hw.vllm_mode),
        vllm_gpu_memory_utilization=float(hw.vllm_gpu_memory_utilization),
        vllm_tensor_parallel_size=int(hw.vllm_tensor_parallel_size),
        vllm_max_model_length=int(hw.vllm_max_model_length) if hw.vllm_max_model_length else None,
        vllm_enable_sleep_mode=bool(hw.vllm_enable_sleep_mode),
        vllm_server_host=str(hw.vllm_server_host),
        vllm_server_port=int(hw.vllm_server_port),
        # mixrl applies the correction itself (algo.engine_correction, mixrl.core.engine_mismatch); TRL's
        # flag makes it compute the trainer's old log-probs of vLLM rollouts, which the weight needs
        **_engine_correction_args(cfg),
        **ref_reset_args(cfg),  # algo.kl.reset_every: TRL's sync_ref_model with alpha 1 (mixrl.config.ref_reset)
        deepspeed=hw.deepspeed,
        disable_tqdm=True,
        model_init_kwargs={"dtype": dtype, "trust_remote_code": bool(cfg.model.trust_remote_code)}
        | ({"attn_implementation": cfg.model.attn_implementation} if cfg.model.attn_implementation else {}),
        dataloader_num_workers=0,
        remove_unused_columns=False,
        shuffle_dataset=True,
        **fsdp.training_args(cfg),  # FSDP on CPU: transformers' fsdp / fsdp_config (GPUs: the launch's accelerate config)
    )


def _engine_correction_args(cfg: DictConfig) -> dict:
    """TRL's ``vllm_importance_sampling_*`` arguments from ``algo.engine_correction``."""
    node = cfg.algo.engine_correction
    return {
        "vllm_importance_sampling_correction": bool(node.enabled),
        "vllm_importance_sampling_mode": str(node.mode),
        "vllm_importance_sampling_clip_min": None if node.c_min is None else float(node.c_min),
        "vllm_importance_sampling_clip_max": None if node.c_max is None else float(node.c_max),
    }


def _needs_ref_logp(cfg: DictConfig) -> bool:
    """Does a term other than the KL term (e.g. kl_convex) read reference log-probs? mixrl
    computes its own loss, so TRL's beta only decides whether they are computed."""
    return any("ref_logp" in term_needs(t.kind) for t in build_objective(cfg).terms) or shaping_reads_ref(cfg)


def peft_config(cfg: DictConfig):
    lora = _plain(cfg.model.lora) or {}
    if not lora.get("enabled"):
        return None
    from peft import LoraConfig  # deferred: peft imports transformers; only a LoRA/adapter path needs it

    return LoraConfig(
        r=int(lora.get("r", 16)), lora_alpha=int(lora.get("alpha", 32)), lora_dropout=float(lora.get("dropout", 0.0)),
        target_modules=lora.get("target_modules", "all-linear"), task_type="CAUSAL_LM",
    )
