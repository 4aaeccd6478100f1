"""``mixrl plan``'s text: the geometry, the context check (:mod:`mixrl.config.context`), the multi-turn budget, the memory estimate per GPU, the
evaluation section and the launch command of a config, rendered from :mod:`mixrl.planning.memory`,
:mod:`mixrl.planning.evaluation` and :mod:`mixrl.launch`.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from mixrl.config.context import check_context
from mixrl.config.geometry import geometry
from mixrl.config.hardware import needs_launch, world_size
from mixrl.envs.budget import turn_lines
from mixrl.launch import plan_launch
from mixrl.planning.evaluation import EVAL_TOKENS_PER_S, evaluation_counts
from mixrl.planning.memory import GB, default_prompt_tokens, estimate, fits
from mixrl.planning.shape import model_shape


def _gb(x: float) -> str:
    return f"{x / GB:,.1f} GB" if x >= 0.05 * GB else f"{x / 1024**2:,.1f} MB"


def _memory_lines(cfg: DictConfig, shape, geom, prompt_tokens: int) -> list[str]:
    """The memory estimate's lines of the plan (per GPU, or per process on CPU), a blank line last."""
    lines: list[str] = []
    hw = cfg.hardware
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
    return lines


def render_plan(cfg: DictConfig, overrides: list[str], *, prompt_tokens: int | None = None) -> str:
    """The plan as text: geometry, memory estimate per GPU and the launch command."""
    given = prompt_tokens  # --prompt-tokens, or None: the context check's own budget (mixrl.config.context.prompt_budget)
    prompt_tokens = prompt_tokens or default_prompt_tokens(cfg)
    hw = cfg.hardware
    name = cfg.recipe_info.name or "(overrides)"
    lines = [f"plan: {name}  (algo={cfg.algo.name}, model={cfg.model.path}, hardware={hw.name})", ""]
    geom = geometry(cfg)
    lines += ["geometry", f"  {geom.describe()}",
              f"  world size {world_size(cfg)} = hardware.num_processes {hw.num_processes} x hardware.num_machines {hw.num_machines}; "
              f"strategy {hw.strategy}{' + CPU offload' if hw.offload else ''}; "
              f"rollouts: {'vLLM ' + hw.vllm_mode if hw.use_vllm else 'transformers generate'}", ""]
    ctx = check_context(cfg, prompt_tokens=given)  # refuses (ConfigError) a completion the model cannot hold
    lines += [f"context (prompt budget {ctx.prompt:,} tokens + trainer.max_completion_length {ctx.completion:,} = {ctx.need:,} "
              "positions; every prompt is measured again at data load)", *ctx.lines(), ""]
    lines += turn_lines(cfg, prompt_tokens)  # multi-turn rollouts: who writes the completion's tokens
    shape = model_shape(cfg)
    if shape is None:
        lines += [f"memory: unknown model shape for '{cfg.model.path}' (not a local folder, not in mixrl.models.known.KNOWN_MODELS); "
                  "point model.path at a local folder with config.json for an estimate", ""]
    else:
        lines += _memory_lines(cfg, shape, geom, prompt_tokens)
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
