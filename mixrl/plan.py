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

The code lives in :mod:`mixrl.planning` (``shape``, ``memory``, ``evaluation``, ``render``); this
module keeps the explanation above and the public names, for the tests and ``scripts/gpu_check.py``.
"""

from __future__ import annotations

from mixrl.models.known import KNOWN_MODELS
from mixrl.planning.evaluation import BENCHMARK_PROBLEMS, EVAL_TOKENS_PER_S, evaluation_counts
from mixrl.planning.memory import (
    DTYPE_BYTES, GB, LM_HEAD_TILE_TOKENS, LM_HEAD_TILE_VOCAB, activation_bytes, default_prompt_tokens, estimate, fits,
    gpu_memory_gb, layer_activation_bytes, lm_head_bytes,
)
from mixrl.planning.render import render_evaluation, render_plan
from mixrl.planning.shape import PUBLISHED_PARAMS_B, ModelShape, _shape, model_shape, reward_model_shapes, teacher_shapes

__all__ = [
    "BENCHMARK_PROBLEMS", "DTYPE_BYTES", "EVAL_TOKENS_PER_S", "GB", "KNOWN_MODELS", "LM_HEAD_TILE_TOKENS", "LM_HEAD_TILE_VOCAB",
    "PUBLISHED_PARAMS_B", "ModelShape", "_shape", "activation_bytes", "default_prompt_tokens", "estimate",
    "evaluation_counts", "fits", "gpu_memory_gb", "layer_activation_bytes", "lm_head_bytes", "model_shape",
    "render_evaluation", "render_plan", "reward_model_shapes", "teacher_shapes",
]
