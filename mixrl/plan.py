"""``mixrl plan``: the geometry, a per-GPU memory estimate and the launch command of a
config, without loading the model.

The model's shape comes from its ``config.json`` when ``model.path`` is a local folder (or
the cached tiny model), else from :data:`KNOWN_MODELS` (the shipped recipes' models, values
of their published ``config.json``); an unknown hub model gets no memory estimate, only
the geometry and command.

How the estimate is computed (bytes per GPU; ``N`` parameters, ``p`` bytes per parameter of
``model.dtype`` (bf16: 2, fp32: 4), ``W`` training processes, ``L`` layers, ``h`` hidden size,
``i`` MLP size, ``V`` vocabulary, ``d`` head dim (``h / heads`` unless the config gives ``head_dim``, as
Qwen3's do), ``q`` = heads x ``d`` (``h`` for Qwen2), ``kv`` = KV heads x ``d``, ``s`` = prompt tokens
(``--prompt-tokens``, default 512; the built-in task's longest prompt for ``builtin:arith``) +
``C`` = ``trainer.max_completion_length``, ``b`` = rows of one micro-batch: ``trainer.micro_batch_size``
plus the rows an injection appends to it, e.g. CHORD's expert rows; with a token budget
``trainer.max_tokens_per_micro_batch = N`` a micro-batch's forward holds ``max(N, s)`` tokens instead of ``s b``,
which sizes the activations and the LM head below):

* parameters ``N``: embeddings ``V h`` (+ ``V h`` for an untied LM head) + per layer attention
  ``h (q + 2 kv) + q h`` (+ q/k/v biases for Qwen2; + the per-head q/k RMSNorms, ``2 d``, for
  Qwen3) + MLP ``3 h i`` + two RMSNorms; checked against the published totals of the known models
  (Qwen2.5 and Qwen3) by ``tests/test_plan.py``.
* weights ``N p`` (zero3/fsdp: ``/ W``; offload: 0, streamed from CPU). FSDP2 under accelerate's
  bf16 mixed precision keeps float32 master weights of the trainable parameters (4 bytes each),
  so its weights, gradients and AdamW moments are float32. A frozen reference model
  (``algo.kl.coef`` > 0) adds ``N p`` (sharded: ``/ W``); teacher models (``teacher=model``) are
  loaded whole on every GPU in their dtype.
* gradients ``N p`` (zero2/zero3/fsdp: ``/ W``; fsdp + offload: 0). DDP adds its reducer's
  gradient buckets, ``N p`` more (accelerate's default ``gradient_as_bucket_view=False``).
* optimizer state (AdamW): DDP keeps two moments in the parameters' dtype, ``2 N p``; FSDP
  ``2 N 4 / W``; DeepSpeed keeps fp32 master weights and moments, ``12 N / W`` (offload: 0 on
  the GPU). LoRA (``model.lora.enabled``): gradients and optimizer state of the adapter only,
  ``r (d_in + d_out)`` per adapted linear layer.
* sharded strategies (zero3/fsdp) hold the unit they compute unsharded: two decoder layers
  (the current one and the prefetched next) and the LM head, ``(2 N_layer + V h) p``.
* activations per micro-batch, from what a Qwen2 decoder layer saves for backward per token,
  ``a = 2 (4 h + p h) + p (q + 2 kv) + 2 p q + 4 p i + 4 heads`` (the float32 RMSNorm input copies and
  outputs, q/k/v after RoPE, the attention output and o_proj input, the SwiGLU gate/up/act/product,
  SDPA's float32 log-sum-exp; Qwen3 adds its q/k RMSNorms' ``(4 + p) (q + kv)``; no ``s^2`` term;
  checked, for Qwen2 and Qwen3, against autograd's saved-tensor
  hooks by the tests). With gradient checkpointing the input of every layer, ``L s b h p``, plus
  one layer recomputed, ``s b a``; without, ``L s b a``; plus the final norm, ``s b (4 h + p h)``.
  (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", count
  ``34 s b h`` per layer for GPT's 4h GeLU MLP; Qwen2's SwiGLU with ``i = 5.3 h`` holds more.)
* the LM head: TRL 1.16 attaches a fused, chunked LM head to the policy, the reference model
  (and mixrl to every teacher), so the ``[b, s, V]`` logits and their log-softmax are never
  built: per-token log-probs and entropies come from ``min(tokens, 4096) x min(V, 32768)`` tiles
  with an online log-sum-exp (TRL allocates the tile 32768 wide; :mod:`mixrl.trainer.lm_head`
  narrows it to a smaller vocabulary). What it holds (``lm_head_bytes``): the scored hidden states
  ``T h p`` (``T`` = ``b C`` on CUDA, where only completion tokens are scored; ``b (s - 1)`` on
  CPU), one tile ``min(T, 4096) x min(V, 32768) x p`` (CPU: + float32 temporaries of the tile), and in backward the
  float32 gradient accumulators ``T h 4`` and ``V h 4`` (+ its cast, ``V h p``). The plan prints
  the log-softmax it replaces, ``T V (p + 4)``, for comparison.
* generation: transformers ``generate`` holds the KV cache of the whole generation batch of a
  process, ``2 L kv s rows p`` (rows = rollouts per process per step), while the gradients are
  freed (ZeRO-3 gathers every parameter for it); vLLM colocated takes
  ``vllm_gpu_memory_utilization`` of the GPU for its weights copy and KV cache (the KV share is
  also given in tokens, against the tokens one step generates on that GPU); with
  ``vllm_enable_sleep_mode`` TRL puts the engine to sleep (level 2: weights and KV cache freed)
  after every generation, so the share only counts while generating. In server mode the server
  GPUs are reported apart.

* evaluation (``trainer.eval_benchmarks``, :mod:`mixrl.benchmarks.live`): every ``eval_every``
  steps each of the ``W`` processes generates its ``ceil(problems x k / W)`` share of each
  benchmark's (problem, sample) pairs with transformers ``generate``, ``eval_batch_size`` rows
  at once (fewer when its largest share is smaller), holding their KV cache ``2 L kv p (s_eval) rows`` with ``s_eval`` = prompt tokens +
  the largest protocol's new tokens (the evaluation phase: weights, optimizer, gathered units and
  that cache). Its time is counted in generated tokens per process, share x max new tokens (an
  upper bound: samples that stop early take less), at a stated throughput
  (:data:`EVAL_TOKENS_PER_S`), and so is the final table (``mixrl eval RUN benchmarks=recipe``:
  every problem, the protocol's samples).

Peak per training GPU = the larger of three phases, both with weights + optimizer + reference +
teachers + DDP buckets + gathered units: training (+ gradients + activations + LM head, + the
vLLM share unless it sleeps), generation (+ KV cache or vLLM share) and evaluation. It ignores the CUDA
context (~1 GB), allocator fragmentation and communication buffers (DeepSpeed's bucket sizes
are ``auto``, ``h^2`` elements): a plan fits when its peak leaves 10 % of the GPU free.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from mixrl.config.geometry import geometry
from mixrl.config.hardware import needs_launch, world_size
from mixrl.launch import plan_launch
from mixrl.envs.budget import turn_lines
from mixrl.models import tiny_bpe, tiny_spec
from mixrl.models.known import KNOWN_MODELS

GB = 1024**3

#: published parameter counts (billions) the formula is checked against
#: (Qwen3: the model cards' "Number of Parameters": 4.0B / 8.2B, and the safetensors totals the hub pages show, 4.02B / 8.19B)
PUBLISHED_PARAMS_B = {"Qwen/Qwen2.5-7B-Instruct": 7.62, "Qwen/Qwen2.5-Math-7B": 7.62, "Qwen/Qwen2.5-Math-1.5B": 1.54,
                      "Qwen/Qwen3-4B-Instruct-2507": 4.02, "Qwen/Qwen3-8B": 8.19,
                      "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": 1.78, "meta-llama/Llama-3.1-8B-Instruct": 8.03}

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}

#: problems in the split each shipped benchmark reads (its dataset card; LUFFY's valid.all.parquet
#: for amc, minerva and olympiadbench), to count an evaluation's generated tokens without reading it
BENCHMARK_PROBLEMS = {"aime24": 30, "aime25": 30, "amc": 83, "amc23": 40, "math500": 500, "minerva": 272,
                      "olympiadbench": 675, "arc_c": 1172, "gpqa_diamond": 198, "mmlu_pro": 12032}

#: decode throughput the plan's evaluation times assume, tokens per second per GPU (a 7B model in
#: bf16, batches of tens of rows: transformers ``generate`` during training, vLLM's offline engine
#: for the final table); stated in the plan, not measured by it
EVAL_TOKENS_PER_S = {"hf": 1_000.0, "vllm": 10_000.0}


def evaluation_counts(cfg: DictConfig, *, prompt_tokens: int = 512) -> dict | None:
    """What ``trainer.eval_benchmarks`` generates: per benchmark the problems, samples and new
    tokens during training and for the final table, the evaluations of the run, the generated
    tokens and the times at :data:`EVAL_TOKENS_PER_S`; None without benchmarks (or eval_every 0)."""
    from mixrl.benchmarks.live import metrics_at, selection  # deferred: reads conf/benchmarks only when asked

    t = cfg.trainer
    sel = selection(cfg)
    if sel is None or int(t.eval_every) <= 0:
        return None
    k = t.get("eval_benchmark_k")
    W = world_size(cfg)  # each process generates its share of the pairs (mixrl.benchmarks.live.shard)
    rows, unknown = [], []
    for b in sel.benchmarks:
        size = int(t.eval_size) if b.builtin else BENCHMARK_PROBLEMS.get(b.name)
        if size is None:
            unknown.append(b.name)
            continue
        n = min(size, sel.limit) if sel.limit else size
        samples = int(k) if k is not None else b.protocol.samples
        new = int(b.protocol.max_new_tokens or t.max_completion_length)
        rows.append({"name": b.name, "problems": n, "samples": samples, "metrics": metrics_at(b.protocol.metrics, samples),
                     "max_new_tokens": new, "tokens": n * samples * new, "process_tokens": -(-n * samples // W) * new,
                     "final_problems": size, "final_samples": b.protocol.samples, "final_tokens": size * b.protocol.samples * new})
    evals = int(t.max_steps) // int(t.eval_every)
    per_eval = sum(r["tokens"] for r in rows)
    final = sum(r["final_tokens"] for r in rows)
    per_process = sum(r["process_tokens"] for r in rows)
    batch = min(int(t.eval_batch_size), max((-(-r["problems"] * r["samples"] // W) for r in rows), default=1))
    return {"suite": sel.name, "benchmarks": rows, "unknown": unknown, "evaluations": evals, "tokens_per_eval": per_eval,
            "processes": W, "tokens_per_process": per_process,
            "tokens_total": per_eval * evals, "seconds_per_eval": per_process / EVAL_TOKENS_PER_S["hf"],
            "final_tokens": final, "final_seconds": final / EVAL_TOKENS_PER_S["vllm"], "batch_rows": batch,
            "seq_tokens": prompt_tokens + max((r["max_new_tokens"] for r in rows), default=0)}


@dataclass
class ModelShape:
    source: str  # where the shape came from
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    bias: bool  # q/k/v biases (Qwen2; Qwen3 has none)
    explicit_head_dim: int | None = None  # config.json's head_dim (Qwen3: 128, not hidden / heads)
    qk_norm: bool = False  # per-head RMSNorms on q and k (Qwen3)

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def params(self) -> int:
        h, i, q, kv = self.hidden, self.intermediate, self.q_dim, self.kv_dim
        attn = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if self.bias else 0) + (2 * self.head_dim if self.qk_norm else 0)
        layer = attn + 3 * h * i + 2 * h
        return self.vocab * h * (1 if self.tied else 2) + self.layers * layer + h

    def lora_params(self, r: int) -> int:
        h, i, q, kv = self.hidden, self.intermediate, self.q_dim, self.kv_dim
        per_layer = (h + q) + (h + kv) * 2 + (q + h) + (h + i) * 2 + (i + h)  # q, k, v, o, gate, up, down
        return self.layers * r * per_layer


def _shape(conf: dict, source: str) -> ModelShape:
    return ModelShape(
        source=source, hidden=int(conf["hidden_size"]), intermediate=int(conf["intermediate_size"]),
        layers=int(conf["num_hidden_layers"]), heads=int(conf["num_attention_heads"]),
        kv_heads=int(conf.get("num_key_value_heads") or conf["num_attention_heads"]), vocab=int(conf["vocab_size"]),
        tied=bool(conf.get("tie_word_embeddings", False)),
        bias=conf.get("model_type") == "qwen2" or bool(conf.get("attention_bias", False)),  # Qwen2 always has them
        explicit_head_dim=int(conf["head_dim"]) if conf.get("head_dim") else None,
        qk_norm=conf.get("model_type") == "qwen3",
    )


def model_shape(cfg: DictConfig) -> ModelShape | None:
    """The model's shape from a local ``config.json`` (never the weights) or the known table."""
    path = str(cfg.model.path)
    local = None
    if path == "builtin:tiny":
        cached = tiny_spec.default_path()
        local = cached if tiny_spec.is_complete(cached) else None
    elif path == "builtin:tiny-bpe":
        cached = tiny_bpe.default_path()
        local = cached if tiny_bpe.is_complete(cached) else None
    elif Path(path).is_dir():
        local = Path(path)
    if local is not None and (local / "config.json").is_file():
        conf = json.loads((local / "config.json").read_text())
        if all(k in conf for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")):
            return _shape(conf, f"{local / 'config.json'}")
    if path in KNOWN_MODELS:
        return _shape(KNOWN_MODELS[path], "mixrl.models.known.KNOWN_MODELS (published config.json)")
    return None


def gpu_memory_gb(cfg: DictConfig) -> float | None:
    """The GPU size the hardware option names (``...x80g...`` -> 80), or None (CPU)."""
    if cfg.hardware.device != "cuda":
        return None
    m = re.search(r"(\d+)g\b", str(cfg.hardware.name))
    return float(m.group(1)) if m else 80.0


def default_prompt_tokens(cfg: DictConfig) -> int:
    """512 tokens for real data; the built-in task's longest prompt for ``builtin:arith``."""
    if str(cfg.data.source).startswith("builtin:"):
        return int(tiny_bpe.MAX_PROMPT_TOKENS if tiny_bpe.is_tiny_bpe(cfg.model.path) else tiny_spec.MAX_PROMPT_TOKENS)
    return 512


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


def teacher_shapes(cfg: DictConfig) -> list[ModelShape | None]:
    """The shapes of the teacher models a config loads (``self`` loads none)."""
    source = cfg.get("teacher", {}).get("source", {}) or {}
    if source.get("name") != "teacher":
        return []
    shapes = []
    for path in source.get("models") or []:
        path = str(path)
        if path == "self":
            continue
        if path in ("builtin:tiny-teacher", "builtin:tiny-bpe-teacher"):  # the same shape as its student model
            path = path.removesuffix("-teacher")
        shapes.append(model_shape(OmegaConf.create({"model": {"path": path}})))
    return shapes


def reward_model_shapes(cfg: DictConfig) -> list[ModelShape | None]:
    """The shapes of the reward models a config loads (``reward.name=model``, or one in ``reward.extra``): frozen,
    whole on every GPU (:mod:`mixrl.rewards.reward_model`)."""
    specs = [cfg.reward] + list(cfg.reward.get("extra") or [])
    paths = [str((s.get("params") or {}).get("path", "builtin:tiny-rm")) for s in specs if s.get("name") == "model"]
    return [model_shape(OmegaConf.create({"model": {"path": path}})) for path in paths]


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
    teachers = 0.0
    teacher_unknown = 0
    for ts in teacher_shapes(cfg):
        if ts is None:
            teacher_unknown += 1
            continue
        t_dtype = str(cfg.teacher.source.get("dtype", "auto"))
        teachers += ts.params() * (p if t_dtype == "auto" else DTYPE_BYTES.get(t_dtype, 4))
    reward_models = sum(rs.params() * p for rs in reward_model_shapes(cfg) if rs is not None)  # in its checkpoint's dtype, counted as the policy's
    reward_models_unknown = sum(rs is None for rs in reward_model_shapes(cfg))
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
    if colocated:
        share = float(hw.vllm_gpu_memory_utilization) * gpu * GB
        vllm_weights = N * 2 / int(hw.vllm_tensor_parallel_size)
        out.update(vllm_share=share, vllm_weights=vllm_weights, vllm_kv=max(share - vllm_weights, 0.0),
                   vllm_kv_tokens=int(max(share - vllm_weights, 0.0) // (kv_token * 2 / p / int(hw.vllm_tensor_parallel_size))),
                   step_tokens=step_tokens, generation=0.0)
    else:
        out["generation"] = 0.0 if hw.use_vllm else kv_token * s * geom.rows_per_process
        out["vllm_share"] = 0.0
    # ZeRO-3 gathers every parameter for transformers generate (TRL's ds3_gather_for_generation)
    gen_gather = N * p * (1 - 1 / W) if strategy == "zero3" and not hw.use_vllm and not offload else 0.0
    if strategy == "zero3" and not hw.use_vllm and offload:
        gen_gather = N * p
    if hw.use_vllm and hw.vllm_mode == "server" and gpu:
        tp = int(hw.vllm_tensor_parallel_size)
        share = float(hw.vllm_server_gpu_memory_utilization) * gpu * GB
        srv_w = N * 2 / tp
        out.update(server_share=share, server_weights=srv_w, server_kv=max(share - srv_w, 0.0),
                   server_kv_tokens=int(max(share - srv_w, 0.0) // (kv_token * 2 / p / tp)),
                   server_copies=int(hw.vllm_server_gpus) // tp if int(hw.vllm_server_gpus) else None,
                   step_tokens_all=geom.rollouts_per_step * s)
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


def _gb(x: float) -> str:
    return f"{x / GB:,.1f} GB" if x >= 0.05 * GB else f"{x / 1024**2:,.1f} MB"


def render_plan(cfg: DictConfig, overrides: list[str], *, prompt_tokens: int | None = None) -> str:
    """The plan as text: geometry, memory estimate per GPU and the launch command."""
    prompt_tokens = prompt_tokens or default_prompt_tokens(cfg)
    hw = cfg.hardware
    name = cfg.recipe_info.name or "(overrides)"
    lines = [f"plan: {name}  (algo={cfg.algo.name}, model={cfg.model.path}, hardware={hw.name})", ""]
    geom = geometry(cfg)
    lines += ["geometry", f"  {geom.describe()}",
              f"  world size {world_size(cfg)} = hardware.num_processes {hw.num_processes} x hardware.num_machines {hw.num_machines}; "
              f"strategy {hw.strategy}{' + CPU offload' if hw.offload else ''}; "
              f"rollouts: {'vLLM ' + hw.vllm_mode if hw.use_vllm else 'transformers generate'}", ""]
    lines += turn_lines(cfg, prompt_tokens)  # multi-turn rollouts: who writes the completion's tokens
    shape = model_shape(cfg)
    if shape is None:
        lines += [f"memory: unknown model shape for '{cfg.model.path}' (not a local folder, not in mixrl.models.known.KNOWN_MODELS); "
                  "point model.path at a local folder with config.json for an estimate", ""]
    else:
        e = estimate(cfg, shape, prompt_tokens=prompt_tokens)
        unit = "per GPU" if e["gpu_gb"] else "per process (CPU memory)"
        lines += [f"memory estimate {unit} (model shape from {shape.source})",
                  f"  parameters            {e['params'] / 1e9:,.3f} B ({cfg.model.dtype})"
                  + (f", trainable {e['trainable_params'] / 1e6:,.1f} M (LoRA)" if e["trainable_params"] != e["params"] else ""),
                  f"  weights               {_gb(e['weights'])}",
                  f"  gradients             {_gb(e['gradients'])}",
                  f"  optimizer state       {_gb(e['optimizer'])}"]
        if e["reference"]:
            lines.append(f"  reference model       {_gb(e['reference'])}  (algo.kl.coef > 0)")
        lh = e["lm_head_parts"]
        if e["ddp_buckets"]:
            lines.append(f"  DDP gradient buckets  {_gb(e['ddp_buckets'])}  (the reducer's copy of the gradients)")
        if e["teachers"] or e["teachers_unknown"]:
            lines.append(f"  teacher model(s)      {_gb(e['teachers'])}  (frozen, whole on every GPU"
                         + (f"; {e['teachers_unknown']} of unknown shape not counted" if e["teachers_unknown"] else "") + ")")
        if e["reward_models"] or e["reward_models_unknown"]:
            lines.append(f"  reward model(s)       {_gb(e['reward_models'])}  (reward=model: frozen, whole on every GPU"
                         + (f"; {e['reward_models_unknown']} of unknown shape not counted" if e["reward_models_unknown"] else "") + ")")
        if e["critic_params"]:
            lines.append(f"  critic (algo.critic)  {_gb(e['critic'] + e['critic_train'])}  ({e['critic_params'] / 1e9:,.3f} B parameters: "
                         f"weights + AdamW {_gb(e['critic'])}, gradients + activations while training {_gb(e['critic_train'])}; "
                         "not sharded)")
        if e["gathered"]:
            lines.append(f"  gathered for compute  {_gb(e['gathered'])}  (two decoder layers + the LM head unsharded at a time)")
        mb = f"token budget {e['micro_batch_tokens']:,}, rows up to" if cfg.trainer.get("max_tokens_per_micro_batch") else f"micro-batch {e['rows_per_micro_batch']} rows x"
        lines += [f"  activations           {_gb(e['activations'])}  ({mb} {e['seq_tokens']} tokens = {prompt_tokens} prompt + {cfg.trainer.max_completion_length} completion; "
                  f"gradient checkpointing {'on' if hw.gradient_checkpointing else 'off'})",
                  f"  LM head (fused)       {_gb(e['lm_head'])}  (TRL's chunked head over {lh['tokens']:,} scored tokens: "
                  f"saved hidden {_gb(lh['saved'])} + tile {_gb(lh['tile'])} + fp32 gradient accumulators {_gb(lh['grad'])}; "
                  f"the full-vocabulary log-softmax, never built, would take {_gb(e['plain_log_softmax'])})"]
        if e.get("vllm_share"):
            lines.append(f"  vLLM colocated        {_gb(e['vllm_share'])}  (vllm_gpu_memory_utilization {hw.vllm_gpu_memory_utilization}: "
                         f"weights {_gb(e['vllm_weights'])} + KV cache {_gb(e['vllm_kv'])} = {e['vllm_kv_tokens']:,} tokens; "
                         f"one step generates up to {e['step_tokens']:,} tokens on this GPU; "
                         + ("sleep mode: freed while training)" if e["vllm_sleeps"] else "held while training: no sleep mode)"))
        elif not hw.use_vllm:
            lines.append(f"  generation KV cache   {_gb(e['generation'])}  (transformers generate, {geom.rows_per_process} rows at once)")
        if e["eval_phase"]:
            ev = evaluation_counts(cfg, prompt_tokens=prompt_tokens)
            lines.append(f"  evaluation KV cache   {_gb(e['eval_kv'])}  (transformers generate, {ev['batch_rows']} rows x "
                         f"{ev['seq_tokens']:,} tokens: trainer.eval_benchmarks every {cfg.trainer.eval_every} steps)")
        lines.append(f"  phases                training {_gb(e['train_phase'])}, generation {_gb(e['generation_phase'])}"
                     + (f", evaluation {_gb(e['eval_phase'])}" if e["eval_phase"] else ""))
        verdict = ""
        if e["gpu_gb"]:
            gpu = e["gpu_gb"] * GB
            verdict = (f"  -> fits a {e['gpu_gb']:.0f} GB GPU ({e['peak'] / gpu:.0%})" if fits(e)
                       else f"  -> does NOT fit a {e['gpu_gb']:.0f} GB GPU with 10% headroom ({e['peak'] / gpu:.0%}): "
                            + ("lower trainer.eval_batch_size (the evaluation's KV cache is the peak)" if e["peak"] == e["eval_phase"]
                               else "lower trainer.micro_batch_size, use hardware.strategy=zero3/fsdp or offload"))
        lines += [f"  peak                  {_gb(e['peak'])}{verdict}"]
        if "server_share" in e:
            lines.append(f"  vLLM server GPUs      {_gb(e['server_share'])} each (vllm_server_gpu_memory_utilization "
                         f"{hw.vllm_server_gpu_memory_utilization}: weights {_gb(e['server_weights'])} + KV cache "
                         f"{_gb(e['server_kv'])} = {e['server_kv_tokens']:,} tokens per copy; {e['server_copies']} copies; "
                         f"a step generates up to {e['step_tokens_all']:,} tokens)")
        lines.append("")
    lines += render_evaluation(cfg, prompt_tokens)
    command = "mixrl train " + " ".join(overrides)
    lines.append("launch")
    lines.append(f"  {command}")
    if needs_launch(cfg, environ={}):
        run_dir = Path(cfg.resume or cfg.run_dir or "RUN_DIR")  # chosen at launch: runs/<date>/<time>-<algo>-s<seed>
        plan = plan_launch(cfg, list(overrides), run_dir, python="python")
        if plan.server_argv:
            lines.append(f"  starts the vLLM server: {plan.server_shell()}")
        lines.append(f"  runs: {plan.shell()}")
        for fname in sorted(plan.files):
            if fname.endswith((".yaml", ".json")):
                lines.append(f"  writes {run_dir / 'launch' / fname}")
    else:
        lines.append("  runs in this process (one process, no launcher)")
    return "\n".join(lines) + "\n"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:,.1f} h" if seconds >= 360 else f"{seconds / 60:,.1f} min"


def render_evaluation(cfg: DictConfig, prompt_tokens: int) -> list[str]:
    """The plan's evaluation section: the benchmarks' samples and generated tokens during training
    (every eval_every steps) and for the final table, with times at the stated throughput."""
    ev = evaluation_counts(cfg, prompt_tokens=prompt_tokens)
    if ev is None:
        return []
    t = cfg.trainer
    lines = [f"evaluation (trainer.eval_benchmarks={ev['suite']}: every {t.eval_every} steps, {ev['evaluations']} evaluations; "
             "the final table: mixrl eval RUN benchmarks=recipe)",
             f"  {'benchmark':<14} {'problems x k':>14} {'new tokens':>10} {'logged as':<26} {'final table':>22}"]
    for r in ev["benchmarks"]:
        logged = f"eval/{r['name']}/{r['metrics'][0]}"
        lines.append(f"  {r['name']:<14} {r['problems']:>6,} x {r['samples']:<5} {r['max_new_tokens']:>10,} {logged:<26} "
                     f"{r['final_problems']:>8,} x {r['final_samples']:<3} = {r['final_problems'] * r['final_samples']:,}")
    if ev["unknown"]:
        lines.append(f"  not counted (size unknown to mixrl.plan.BENCHMARK_PROBLEMS): {', '.join(ev['unknown'])}")
    lines += [f"  per evaluation        up to {ev['tokens_per_eval']:,} generated tokens, {ev['tokens_per_process']:,} on each of "
              f"{ev['processes']} process(es) (each generates its share of the (problem, sample) pairs): "
              f"~{_hours(ev['seconds_per_eval'])} at {EVAL_TOKENS_PER_S['hf']:,.0f} tokens/s (transformers generate, assumed); "
              f"{_hours(ev['seconds_per_eval'] * ev['evaluations'])} over the run",
              f"  final table           up to {ev['final_tokens']:,} generated tokens: ~{_hours(ev['final_seconds'])} at "
              f"{EVAL_TOKENS_PER_S['vllm']:,.0f} tokens/s (vLLM, assumed)", ""]
    return lines
