"""``mixrl plan``: the geometry, a per-GPU memory estimate and the launch command of a
config, without loading the model.

The model's shape comes from its ``config.json`` when ``model.path`` is a local folder (or
the cached tiny model), else from :data:`KNOWN_MODELS` (the shipped recipes' models, values
of their published ``config.json``); an unknown hub model gets no memory estimate, only
the geometry and command.

How the estimate is computed (bytes per GPU; ``N`` parameters, ``p`` bytes per parameter of
``model.dtype`` (bf16: 2, fp32: 4), ``W`` training processes, ``L`` layers, ``h`` hidden size,
``V`` vocabulary, ``kv`` = KV heads x head dim, ``s`` = prompt tokens (``--prompt-tokens``, default
512; the built-in task's longest prompt for ``builtin:arith``) +
``trainer.max_completion_length``, ``b`` = ``trainer.micro_batch_size``):

* parameters ``N``: embeddings ``V h`` (+ ``V h`` for an untied LM head) + per layer attention
  ``h (h + 2 kv) + h h`` (+ q/k/v biases for Qwen2) + MLP ``3 h i`` + two RMSNorms; checked
  against the published totals of the known models by ``tests/test_plan.py``.
* weights ``N p`` (``strategy`` zero3/fsdp: ``N p / W``; zero3 + offload: 0, streamed from
  CPU); a frozen reference model (``algo.kl.coef`` > 0) adds the same again.
* gradients ``N p`` (zero2/zero3/fsdp: ``/ W``; fsdp + offload: 0).
* optimizer state (AdamW): DDP/FSDP keep two moments in the parameters' dtype, ``2 N p``
  (fsdp: ``/ W``); DeepSpeed keeps fp32 master weights and moments, ``12 N / W`` (offload: 0 on
  the GPU). LoRA (``model.lora.enabled``): gradients and optimizer state of the adapter only,
  ``r (d_in + d_out)`` per adapted linear layer.
* activations per micro-batch: with gradient checkpointing one layer input per layer kept,
  ``L s b h p``, plus one layer recomputed, ``34 s b h`` bytes (Korthikanti et al., "Reducing
  Activation Recomputation in Large Transformer Models", arXiv:2205.05198, with fused
  attention so no ``s^2`` term); without checkpointing ``34 s b h L``. Plus the logits and their
  fp32 log-softmax, ``s b V (p + 4)`` (TRL computes per-token log-probabilities from them).
* generation: transformers ``generate`` holds the KV cache of the whole generation batch of a
  process, ``2 L kv s rows p`` (rows = rollouts per process per step), while the gradients are
  freed; vLLM colocated takes ``vllm_gpu_memory_utilization`` of the GPU for its weights copy
  and KV cache; the KV share (what remains after its weights) is also given in tokens, against
  the tokens one step generates on that GPU. In server mode the server GPUs are reported apart.

Peak per training GPU = weights + optimizer + reference + max(gradients + activations,
generation KV cache) + the vLLM share when colocated. It ignores the CUDA context (~1 GB),
allocator fragmentation and communication buffers: keep ~10 % headroom.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

GB = 1024**3

#: hub id -> the fields of its config.json used here (Qwen2 architecture, published configs)
KNOWN_MODELS: dict[str, dict] = {
    "Qwen/Qwen2.5-7B-Instruct": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                                     num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False, model_type="qwen2",
                                     max_position_embeddings=32768),
    "Qwen/Qwen2.5-Math-7B": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                                 num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False, model_type="qwen2",
                                 max_position_embeddings=4096),
    "Qwen/Qwen2.5-Math-1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                                   num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, model_type="qwen2",
                                   max_position_embeddings=4096),
    # the built-in tiny model (mixrl.models.tiny) before it is built
    "builtin:tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=18, tie_word_embeddings=True, model_type="qwen2",
                         max_position_embeddings=64),
    # the built-in BPE chat model (mixrl.models.tiny_bpe) before it is built
    "builtin:tiny-bpe": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                             num_key_value_heads=4, vocab_size=320, tie_word_embeddings=True, model_type="qwen2",
                             max_position_embeddings=128),
}

#: published parameter counts (billions) the formula is checked against
PUBLISHED_PARAMS_B = {"Qwen/Qwen2.5-7B-Instruct": 7.62, "Qwen/Qwen2.5-Math-7B": 7.62, "Qwen/Qwen2.5-Math-1.5B": 1.54}

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}


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
    bias: bool  # q/k/v biases (Qwen2)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def params(self) -> int:
        h, i, kv = self.hidden, self.intermediate, self.kv_dim
        attn = h * h + 2 * h * kv + h * h + ((h + 2 * kv) if self.bias else 0)
        layer = attn + 3 * h * i + 2 * h
        return self.vocab * h * (1 if self.tied else 2) + self.layers * layer + h

    def lora_params(self, r: int) -> int:
        h, i, kv = self.hidden, self.intermediate, self.kv_dim
        per_layer = (h + h) + (h + kv) * 2 + (h + h) + (h + i) * 2 + (i + h)  # q, k, v, o, gate, up, down
        return self.layers * r * per_layer


def _shape(conf: dict, source: str) -> ModelShape:
    return ModelShape(
        source=source, hidden=int(conf["hidden_size"]), intermediate=int(conf["intermediate_size"]),
        layers=int(conf["num_hidden_layers"]), heads=int(conf["num_attention_heads"]),
        kv_heads=int(conf.get("num_key_value_heads") or conf["num_attention_heads"]), vocab=int(conf["vocab_size"]),
        tied=bool(conf.get("tie_word_embeddings", False)), bias=conf.get("model_type") == "qwen2",
    )


def model_shape(cfg: DictConfig) -> ModelShape | None:
    """The model's shape from a local ``config.json`` (never the weights) or the known table."""
    path = str(cfg.model.path)
    local = None
    if path == "builtin:tiny":
        from mixrl.models import tiny

        cached = tiny.default_path()
        local = cached if tiny.is_complete(cached) else None
    elif path == "builtin:tiny-bpe":
        from mixrl.models import tiny_bpe

        cached = tiny_bpe.default_path()
        local = cached if tiny_bpe.is_complete(cached) else None
    elif Path(path).is_dir():
        local = Path(path)
    if local is not None and (local / "config.json").is_file():
        conf = json.loads((local / "config.json").read_text())
        if all(k in conf for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")):
            return _shape(conf, f"{local / 'config.json'}")
    if path in KNOWN_MODELS:
        return _shape(KNOWN_MODELS[path], "mixrl.plan.KNOWN_MODELS (published config.json)")
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
        from mixrl.models import tiny, tiny_bpe

        return int(tiny_bpe.MAX_PROMPT_TOKENS if tiny_bpe.is_tiny_bpe(cfg.model.path) else tiny.MAX_PROMPT_TOKENS)
    return 512


def estimate(cfg: DictConfig, shape: ModelShape, *, prompt_tokens: int = 512) -> dict:
    """Per-GPU bytes of each part (see the module docstring) for ``cfg`` and ``shape``."""
    from mixrl.config.rules import geometry
    from mixrl.launch import world_size

    hw, t = cfg.hardware, cfg.trainer
    geom = geometry(cfg)
    W = world_size(cfg)
    p = DTYPE_BYTES.get(str(cfg.model.dtype), 4)
    N = shape.params()
    strategy, offload = str(hw.strategy), bool(hw.offload)
    lora = (cfg.model.lora or {}).get("enabled", False)
    n_train = shape.lora_params(int(cfg.model.lora.get("r", 16))) if lora else N
    sharded = strategy in ("zero3", "fsdp")
    weights = 0.0 if (strategy == "zero3" and offload) or (strategy == "fsdp" and offload) else N * p / (W if sharded else 1)
    grads = 0.0 if strategy == "fsdp" and offload else n_train * p / (W if strategy != "ddp" else 1)
    if strategy in ("zero2", "zero3"):
        optim = 0.0 if offload else 12 * n_train / W
    elif strategy == "fsdp":
        optim = 0.0 if offload else 2 * n_train * p / W
    else:
        optim = 2 * n_train * p
    reference = weights if float(cfg.algo.kl.coef) > 0 and not lora else 0.0
    s, b, h, L = prompt_tokens + int(t.max_completion_length), geom.micro_batch_size, shape.hidden, shape.layers
    if hw.gradient_checkpointing:
        acts = L * s * b * h * p + 34 * s * b * h
    else:
        acts = 34 * s * b * h * L
    logits = s * b * shape.vocab * (p + 4)
    kv_token = 2 * L * shape.kv_dim * p  # bytes of KV cache per token
    gpu = gpu_memory_gb(cfg)
    out = {
        "params": N, "trainable_params": n_train, "seq_tokens": s, "world_size": W,
        "weights": weights, "gradients": grads, "optimizer": optim, "reference": reference,
        "activations": acts, "logits": logits, "gpu_gb": gpu,
    }
    rows = geom.rows_per_process + geom.expert_rows_per_process
    step_tokens = geom.rows_per_process * s  # tokens one step generates + attends on this GPU
    if hw.use_vllm and hw.vllm_mode == "colocate" and gpu:
        share = float(hw.vllm_gpu_memory_utilization) * gpu * GB
        vllm_weights = N * 2 / int(hw.vllm_tensor_parallel_size)
        out.update(vllm_share=share, vllm_weights=vllm_weights, vllm_kv=max(share - vllm_weights, 0.0),
                   vllm_kv_tokens=int(max(share - vllm_weights, 0.0) // (kv_token * 2 / p / int(hw.vllm_tensor_parallel_size))),
                   step_tokens=step_tokens, generation=0.0)
    else:
        out["generation"] = 0.0 if hw.use_vllm else kv_token * s * geom.rows_per_process
        out["vllm_share"] = 0.0
    if hw.use_vllm and hw.vllm_mode == "server" and gpu:
        tp = int(hw.vllm_tensor_parallel_size)
        share = float(hw.vllm_server_gpu_memory_utilization) * gpu * GB
        srv_w = N * 2 / tp
        out.update(server_share=share, server_weights=srv_w, server_kv=max(share - srv_w, 0.0),
                   server_kv_tokens=int(max(share - srv_w, 0.0) // (kv_token * 2 / p / tp)),
                   server_copies=int(hw.vllm_server_gpus) // tp if int(hw.vllm_server_gpus) else None,
                   step_tokens_all=geom.rollouts_per_step * s)
    out["rows_per_process"] = rows
    out["peak"] = weights + optim + reference + max(grads + acts + logits, out["generation"]) + out["vllm_share"]
    return out


def _gb(x: float) -> str:
    return f"{x / GB:,.1f} GB" if x >= 0.05 * GB else f"{x / 1024**2:,.1f} MB"


def render_plan(cfg: DictConfig, overrides: list[str], *, prompt_tokens: int | None = None) -> str:
    """The plan as text: geometry, memory estimate per GPU and the launch command."""
    prompt_tokens = prompt_tokens or default_prompt_tokens(cfg)
    from mixrl.config.rules import geometry
    from mixrl.launch import needs_launch, plan_launch, world_size

    hw = cfg.hardware
    name = cfg.recipe_info.name or "(overrides)"
    lines = [f"plan: {name}  (algo={cfg.algo.name}, model={cfg.model.path}, hardware={hw.name})", ""]
    geom = geometry(cfg)
    lines += ["geometry", f"  {geom.describe()}",
              f"  world size {world_size(cfg)} = hardware.num_processes {hw.num_processes} x hardware.num_machines {hw.num_machines}; "
              f"strategy {hw.strategy}{' + CPU offload' if hw.offload else ''}; "
              f"rollouts: {'vLLM ' + hw.vllm_mode if hw.use_vllm else 'transformers generate'}", ""]
    shape = model_shape(cfg)
    if shape is None:
        lines += [f"memory: unknown model shape for '{cfg.model.path}' (not a local folder, not in mixrl.plan.KNOWN_MODELS); "
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
        lines += [f"  activations           {_gb(e['activations'])}  (micro-batch {geom.micro_batch_size} x {e['seq_tokens']} tokens"
                  f" = {prompt_tokens} prompt + {cfg.trainer.max_completion_length} completion; "
                  f"gradient checkpointing {'on' if hw.gradient_checkpointing else 'off'})",
                  f"  logits + log-softmax  {_gb(e['logits'])}"]
        if e.get("vllm_share"):
            lines.append(f"  vLLM colocated        {_gb(e['vllm_share'])}  (vllm_gpu_memory_utilization {hw.vllm_gpu_memory_utilization}: "
                         f"weights {_gb(e['vllm_weights'])} + KV cache {_gb(e['vllm_kv'])} = {e['vllm_kv_tokens']:,} tokens; "
                         f"one step generates up to {e['step_tokens']:,} tokens on this GPU)")
        elif not hw.use_vllm:
            lines.append(f"  generation KV cache   {_gb(e['generation'])}  (transformers generate, {geom.rows_per_process} rows at once)")
        verdict = ""
        if e["gpu_gb"]:
            gpu = e["gpu_gb"] * GB
            verdict = (f"  -> fits a {e['gpu_gb']:.0f} GB GPU ({e['peak'] / gpu:.0%})" if e["peak"] <= 0.9 * gpu
                       else f"  -> does NOT fit a {e['gpu_gb']:.0f} GB GPU with 10% headroom ({e['peak'] / gpu:.0%}): "
                            "lower trainer.micro_batch_size, use hardware.strategy=zero3/fsdp or offload")
        lines += [f"  peak                  {_gb(e['peak'])}{verdict}"]
        if "server_share" in e:
            lines.append(f"  vLLM server GPUs      {_gb(e['server_share'])} each (vllm_server_gpu_memory_utilization "
                         f"{hw.vllm_server_gpu_memory_utilization}: weights {_gb(e['server_weights'])} + KV cache "
                         f"{_gb(e['server_kv'])} = {e['server_kv_tokens']:,} tokens per copy; {e['server_copies']} copies; "
                         f"a step generates up to {e['step_tokens_all']:,} tokens)")
        lines.append("")
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
