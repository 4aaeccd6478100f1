"""The per-GPU memory estimate of ``mixrl plan``: bytes of each part (weights, gradients,
optimizer state, reference, teachers, reward models, critic, gathered units, activations, the
fused LM head, generation's KV cache or vLLM's share, evaluation's KV cache) and the peak over
the training, generation and evaluation phases.

The formulas are explained, term by term, in the docstring of :mod:`mixrl.plan`.
"""

from __future__ import annotations

import re

from omegaconf import DictConfig

from mixrl.config.context import prompt_budget
from mixrl.config.geometry import geometry
from mixrl.config.hardware import world_size
from mixrl.planning.evaluation import evaluation_counts
from mixrl.planning.shape import ModelShape, reward_model_shapes, teacher_shapes

GB = 1024**3

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}


def gpu_memory_gb(cfg: DictConfig) -> float | None:
    """The GPU size the hardware option names (``...x80g...`` -> 80), or None (CPU)."""
    if cfg.hardware.device != "cuda":
        return None
    m = re.search(r"(\d+)g\b", str(cfg.hardware.name))
    return float(m.group(1)) if m else 80.0


def default_prompt_tokens(cfg: DictConfig) -> int:
    """``data.max_prompt_tokens`` when set; else 512 tokens for real data, the built-in task's longest
    prompt for ``builtin:arith``: the prompt budget of the context check
    (:func:`mixrl.config.context.prompt_budget`, which also caps the 512 at half a model's context)."""
    return prompt_budget(cfg)


#: TRL 1.16's fused LM head (``trl.trainer.utils.add_fused_lm_head``): tokens per projection tile
#: (``trl.kernels.chunked_logprob.TOKEN_CHUNK_SIZE``) and tile width in vocabulary entries
#: (``trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE``; mixrl.trainer.lm_head narrows it to a smaller vocabulary)
LM_HEAD_TILE_TOKENS = 4096
LM_HEAD_TILE_VOCAB = 32768


def layer_activation_bytes(shape: ModelShape, p: int) -> int:
    """Bytes one decoder layer keeps for backward per token (Qwen2/Qwen3: RMSNorm in float32,
    SDPA, SwiGLU MLP, no dropout): per RMSNorm its float32 input copy and its output, ``4 h + p h``
    (twice); the q/k/v outputs after RoPE, ``p (q + 2 kv)`` (``q`` = heads x head dim); the
    attention output and the o_proj input, ``2 p q``; gate, up, silu(gate) and their product,
    ``4 p i``; SDPA's float32 log-sum-exp, ``4`` per head; Qwen3's per-head q/k RMSNorms, their
    float32 inputs and outputs, ``(4 + p) (q + kv)``. Checked against what autograd saves
    (``torch.autograd.graph.saved_tensors_hooks``) by ``tests/test_plan.py``."""
    h, q, kv, i = shape.hidden, shape.q_dim, shape.kv_dim, shape.intermediate
    qk_norm = (4 + p) * (q + kv) if shape.qk_norm else 0
    return 2 * (4 * h + p * h) + p * (q + 2 * kv) + 2 * p * q + 4 * p * i + 4 * shape.heads + qk_norm


def activation_bytes(shape: ModelShape, p: int, tokens: int, checkpointing: bool) -> int:
    """Bytes the backbone keeps for backward over ``tokens`` tokens: every layer's
    (:func:`layer_activation_bytes`), or with gradient checkpointing each layer's input plus one
    layer recomputed; plus the final RMSNorm's ``4 h + p h``."""
    a, h, L = layer_activation_bytes(shape, p), shape.hidden, shape.layers
    per_token = (L * h * p + a) if checkpointing else L * a
    return tokens * (per_token + 4 * h + p * h)


def lm_head_bytes(shape: ModelShape, p: int, tokens: int, *, compact: bool, trainable: bool = True) -> dict:
    """What TRL's fused LM head holds for ``tokens`` scored positions (never the ``[tokens, V]``
    logits): the hidden states it saves for backward (``tokens h p``), one projection tile
    ``min(tokens, 4096) x min(V, 32768)`` in the compute dtype (the width fitted by
    :mod:`mixrl.trainer.lm_head`), and in backward the float32 accumulators
    of the hidden-state gradient (``tokens h 4``) and of the LM-head weight gradient (``V h 4``,
    cast to ``p`` at the end: ``+ V h p``). Without Triton (CPU) the tile is folded by torch ops,
    about 6 float32 temporaries of the tile's ``min(V, 32768)`` used columns."""
    h, V = shape.hidden, shape.vocab
    n = min(tokens, LM_HEAD_TILE_TOKENS)
    tile = n * min(V, LM_HEAD_TILE_VOCAB) * p  # mixrl.trainer.lm_head fits the width to the vocabulary
    fold = 0 if compact else 6 * n * min(V, LM_HEAD_TILE_VOCAB) * 4
    weight_grad = V * h * (4 + p) if trainable else 0
    return {"tokens": tokens, "saved": tokens * h * p, "tile": tile + fold, "grad": tokens * h * 4 + weight_grad,
            "total": tokens * h * p + tile + fold + tokens * h * 4 + weight_grad}


def _frozen_models(cfg: DictConfig, p: int) -> tuple[float, int, float, int]:
    """``(teachers, teachers of unknown shape, reward models, reward models of unknown shape)``: the
    bytes of the frozen models every GPU holds whole (a reward model in its checkpoint's dtype,
    counted as the policy's ``p`` bytes per parameter)."""
    teachers = 0.0
    teacher_unknown = 0
    for ts in teacher_shapes(cfg):
        if ts is None:
            teacher_unknown += 1
            continue
        t_dtype = str(cfg.teacher.source.get("dtype", "auto"))
        teachers += ts.params() * (p if t_dtype == "auto" else DTYPE_BYTES.get(t_dtype, 4))
    reward_models = sum(rs.params() * p for rs in reward_model_shapes(cfg) if rs is not None)
    reward_models_unknown = sum(rs is None for rs in reward_model_shapes(cfg))
    return teachers, teacher_unknown, reward_models, reward_models_unknown


def _server_share(hw: DictConfig, N: float, p: int, kv_token: float, gpu: float, step_tokens_all: int) -> dict:
    """A vLLM server GPU's memory (``hardware.vllm_mode=server``): its share, the weights of one tensor-parallel
    copy, the KV cache (bytes and tokens) and the number of copies."""
    tp = int(hw.vllm_tensor_parallel_size)
    share = float(hw.vllm_server_gpu_memory_utilization) * gpu * GB
    srv_w = N * 2 / tp
    return dict(server_share=share, server_weights=srv_w, server_kv=max(share - srv_w, 0.0),
                server_kv_tokens=int(max(share - srv_w, 0.0) // (kv_token * 2 / p / tp)),
                server_copies=int(hw.vllm_server_gpus) // tp if int(hw.vllm_server_gpus) else None,
                step_tokens_all=step_tokens_all)


def _generation_memory(hw: DictConfig, N: float, p: int, kv_token: float, gpu: float, *, colocated: bool,
                       step_tokens: int, seq: int, rows: int) -> dict:
    """What generating takes on a training GPU: vLLM colocated (its share: weights and KV cache), else
    transformers generate's KV cache for the process's rows (0 with a vLLM server)."""
    if colocated:
        share = float(hw.vllm_gpu_memory_utilization) * gpu * GB
        vllm_weights = N * 2 / int(hw.vllm_tensor_parallel_size)
        return dict(vllm_share=share, vllm_weights=vllm_weights, vllm_kv=max(share - vllm_weights, 0.0),
                    vllm_kv_tokens=int(max(share - vllm_weights, 0.0) // (kv_token * 2 / p / int(hw.vllm_tensor_parallel_size))),
                    step_tokens=step_tokens, generation=0.0)
    return {"generation": 0.0 if hw.use_vllm else kv_token * seq * rows, "vllm_share": 0.0}


def estimate(cfg: DictConfig, shape: ModelShape, *, prompt_tokens: int = 512) -> dict:
    """Per-GPU bytes of each part (see the module docstring) for ``cfg`` and ``shape``."""
    hw, t = cfg.hardware, cfg.trainer
    geom = geometry(cfg)
    W = world_size(cfg)
    p = DTYPE_BYTES.get(str(cfg.model.dtype), 4)
    N = shape.params()
    strategy, offload = str(hw.strategy), bool(hw.offload)
    lora = (cfg.model.lora or {}).get("enabled", False)
    n_train = shape.lora_params(int(cfg.model.lora.get("r", 16))) if lora else N
    sharded = strategy in ("zero3", "fsdp")
    # FSDP2 under accelerate's mixed precision upcasts the trainable parameters to float32 master
    # weights (accelerate.utils.fsdp_utils.fsdp2_prepare_model); compute gathers them in bf16
    pm = 4 if strategy == "fsdp" and bool(hw.bf16) else p
    weights = 0.0 if (strategy == "zero3" and offload) or (strategy == "fsdp" and offload) else (
        ((N - n_train) * p + n_train * pm) / (W if sharded else 1))
    grads = 0.0 if strategy == "fsdp" and offload else n_train * pm / (W if strategy != "ddp" else 1)
    # DDP's reducer keeps its own gradient buckets (accelerate's default gradient_as_bucket_view=False)
    buckets = n_train * p if strategy == "ddp" and W > 1 else 0.0
    if strategy in ("zero2", "zero3"):
        optim = 0.0 if offload else 12 * n_train / W
    elif strategy == "fsdp":
        optim = 0.0 if offload else 2 * n_train * pm / W
    else:
        optim = 2 * n_train * p
    reference = (0.0 if offload and sharded else N * p / (W if sharded else 1)) if float(cfg.algo.kl.coef) > 0 and not lora else 0.0
    teachers, teacher_unknown, reward_models, reward_models_unknown = _frozen_models(cfg, p)
    # sharded strategies gather one unit at a time (+ the next, prefetched) and the LM head whole
    layer_params = (N - shape.vocab * shape.hidden * (1 if shape.tied else 2)) / max(shape.layers, 1)
    gathered = (2 * layer_params + shape.vocab * shape.hidden) * p if sharded else 0.0
    C = int(t.max_completion_length)
    s = prompt_tokens + C
    appended = geom.expert_rows_per_process // max(geom.grad_accum, 1)
    b, h, L = geom.micro_batch_size + appended, shape.hidden, shape.layers
    a_layer = layer_activation_bytes(shape, p)
    # a token budget (trainer.max_tokens_per_micro_batch) bounds a micro-batch's forward at N tokens (one longer row: its own s)
    budget = t.get("max_tokens_per_micro_batch")
    tokens = max(int(budget), s) if budget else s * b
    acts = activation_bytes(shape, p, tokens, bool(hw.gradient_checkpointing))
    compact = hw.device == "cuda"  # TRL scores only the completion tokens where Triton runs (CUDA)
    head = lm_head_bytes(shape, p, tokens * (C if compact else s - 1) // s, compact=compact, trainable=not lora)
    kv_token = 2 * L * shape.kv_dim * p  # bytes of KV cache per token
    gpu = gpu_memory_gb(cfg)
    out = {
        "params": N, "trainable_params": n_train, "seq_tokens": s, "world_size": W, "rows_per_micro_batch": b,
        "micro_batch_tokens": tokens,
        "weights": weights, "gradients": grads, "ddp_buckets": buckets, "optimizer": optim, "reference": reference,
        "teachers": teachers, "teachers_unknown": teacher_unknown, "gathered": gathered,
        "reward_models": reward_models, "reward_models_unknown": reward_models_unknown,
        "activations": acts, "layer_activation_bytes": a_layer, "lm_head": head["total"], "lm_head_parts": head,
        "plain_log_softmax": head["tokens"] * shape.vocab * (p + 4), "gpu_gb": gpu,
    }
    rows = geom.rows_per_process + geom.expert_rows_per_process
    step_tokens = geom.rows_per_process * s  # tokens one step generates + attends on this GPU
    colocated = bool(hw.use_vllm and hw.vllm_mode == "colocate" and gpu)
    out.update(_generation_memory(hw, N, p, kv_token, gpu, colocated=colocated, step_tokens=step_tokens, seq=s, rows=geom.rows_per_process))
    # ZeRO-3 gathers every parameter for transformers generate (TRL's ds3_gather_for_generation)
    gen_gather = N * p * (1 - 1 / W) if strategy == "zero3" and not hw.use_vllm and not offload else 0.0
    if strategy == "zero3" and not hw.use_vllm and offload:
        gen_gather = N * p
    if hw.use_vllm and hw.vllm_mode == "server" and gpu:
        out.update(_server_share(hw, N, p, kv_token, gpu, geom.rollouts_per_step * s))
    out["rows_per_process"] = rows
    # algo.critic (mixrl.trainer.parts.critic): the policy's backbone + a scalar head, unsharded, with its own
    # gradients and AdamW moments; its forward and backward run while the policy's activations are held
    critic_params = (N - (0 if shape.tied else shape.vocab * shape.hidden) + shape.hidden) if cfg.algo.get("critic") is not None else 0
    out["critic_params"] = critic_params
    out["critic"] = critic_params * p * 3  # weights + AdamW's two moments
    out["critic_train"] = (critic_params * p + acts) if critic_params else 0.0  # its gradients + activations
    held = weights + optim + reference + teachers + reward_models + buckets + out["critic"]
    # vLLM's sleep mode (level 2) frees its weights and KV cache after every generation
    sleeps = colocated and bool(hw.get("vllm_enable_sleep_mode", False))
    out["vllm_sleeps"] = sleeps
    out["train_phase"] = held + grads + gathered + acts + head["total"] + out["critic_train"] + (0.0 if sleeps else out["vllm_share"])
    out["generation_phase"] = held + gathered + gen_gather + out["generation"] + out["vllm_share"]
    ev = evaluation_counts(cfg, prompt_tokens=prompt_tokens)
    out["eval_kv"] = kv_token * ev["seq_tokens"] * ev["batch_rows"] if ev else 0.0
    out["eval_phase"] = (held + gathered + gen_gather + out["eval_kv"] + (0.0 if sleeps else out["vllm_share"])) if ev else 0.0
    out["peak"] = max(out["train_phase"], out["generation_phase"], out["eval_phase"])
    return out


def fits(e: dict) -> bool:
    """Does the estimate leave 10 % of the GPU free (CUDA context, fragmentation)? True on CPU."""
    return e["gpu_gb"] is None or e["peak"] <= 0.9 * e["gpu_gb"] * GB
