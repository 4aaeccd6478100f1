"""Cross-field rules of one config: the batch geometry divides (:mod:`mixrl.config.geometry`),
settings that contradict each other (staleness, asynchronous generation, devices), then the
objective's checks (:mod:`mixrl.config.objective`)."""

from __future__ import annotations

from omegaconf import DictConfig

from mixrl.config.geometry import geometry
from mixrl.config.builders import build_injection, component
from mixrl.config.objective import check_objective
from mixrl.config.shaping import check_shaping
from mixrl.config.sampler import check_sampler
from mixrl.errors import ConfigError
from mixrl.sources.base import Injection


def _check_staleness(cfg: DictConfig) -> None:
    k = int(cfg.trainer.get("staleness", 0) or 0)
    if k < 0:
        raise ConfigError(f"trainer.staleness must be >= 0 (optimizer steps the generating weights lag behind), got {k}")
    if k and cfg.hardware.use_vllm:
        raise ConfigError(
            "trainer.staleness > 0 swaps lagged weights into the trained model for generation; vLLM generates from its own "
            "copy, so set hardware.use_vllm=false (or trainer.staleness=0)"
        )
    if k and cfg.hardware.deepspeed:
        raise ConfigError("trainer.staleness > 0 needs whole (unsharded) weights on every process; unset hardware.deepspeed")


def _check_async(cfg: DictConfig) -> None:
    """``hardware.vllm_async=true``: the layouts the actor-learner pipeline is built for
    (mixrl.trainer.generation.async_generation): a vLLM server, one training process with whole weights,
    one pass per batch, and rollouts that are exactly the data loader's prompts as vLLM samples
    them (what is sent ahead must be what the step trains on)."""
    hw = cfg.hardware
    if not hw.get("vllm_async", False):
        return
    k = int(hw.get("vllm_async_max_staleness", 1))
    if k < 1:
        raise ConfigError(f"hardware.vllm_async_max_staleness must be >= 1 (trainer steps a row may lag behind), got {k}")
    if not hw.use_vllm or hw.vllm_mode != "server":
        raise ConfigError("hardware.vllm_async=true generates ahead on a vLLM server; set hardware.use_vllm=true "
                          "hardware.vllm_mode=server (or hardware.vllm_async=false)")
    world = int(hw.num_processes) * int(hw.num_machines)
    if world > 1 or hw.deepspeed or hw.strategy != "ddp":
        raise ConfigError(f"hardware.vllm_async=true runs one training process with whole weights (here {world} process(es), "
                          f"strategy {hw.strategy}); set hardware.num_processes=1 hardware.num_machines=1 hardware.strategy=ddp, "
                          "or hardware.vllm_async=false")
    if int(cfg.trainer.get("staleness", 0) or 0):
        raise ConfigError("hardware.vllm_async=true sets the staleness itself (hardware.vllm_async_max_staleness); set trainer.staleness=0")
    if int(cfg.trainer.num_iterations) != 1:
        raise ConfigError(f"hardware.vllm_async=true trains each batch once; set trainer.num_iterations=1 (got {cfg.trainer.num_iterations})")
    inj = build_injection(cfg)
    kind = type(inj)
    changes = [what for what, bad in (
        ("rewrites the prompts", kind.before_generation is not Injection.before_generation),
        ("sets generation prefixes", kind.generation_prefixes is not Injection.generation_prefixes),
        ("generates more completions", inj.may_generate_more),
        ("writes every completion", inj.skips_generation),
    ) if bad]
    if changes:
        raise ConfigError(f"hardware.vllm_async=true sends each step's prompts to vLLM one step ahead, but algo={cfg.algo.name}'s "
                          f"injection {component(cfg.algo.inject)[0]} {' and '.join(changes)}; "
                          "use hardware.vllm_async=false for it")


def _check_token_budget(cfg: DictConfig) -> None:
    """``trainer.max_tokens_per_micro_batch``: a positive budget, and a layout whose backward can run
    several times per optimizer step inside one TRL micro-step (DeepSpeed's engine steps its
    optimizer inside each backward it counts)."""
    n = cfg.trainer.get("max_tokens_per_micro_batch")
    if n is None:
        return
    if int(n) < 1:
        raise ConfigError(f"trainer.max_tokens_per_micro_batch must be >= 1 (tokens per micro-batch forward) or null, got {n}")
    if cfg.hardware.deepspeed:
        raise ConfigError("trainer.max_tokens_per_micro_batch runs several backwards per DeepSpeed micro-step; "
                          "unset hardware.deepspeed (use hardware.strategy=fsdp) or set trainer.max_tokens_per_micro_batch=null")


def _check_cov_window(cfg: DictConfig) -> None:
    """clip_cov's covariance window must not be empty by construction (cov_lower <= cov_upper)."""
    specs = [("algo.loss", cfg.algo.get("loss"))]
    specs += [(f"algo.terms.{k}.loss", t.get("loss")) for k, t in (cfg.algo.get("terms") or {}).items()]
    for where, spec in specs:
        if spec is not None and spec.get("name") == "clip_cov":
            lo, hi = float(spec.get("cov_lower", 1.0)), float(spec.get("cov_upper", 5.0))
            if lo > hi:
                raise ConfigError(f"{where}.cov_lower={lo:g} > {where}.cov_upper={hi:g}: clip_cov's covariance window is empty; "
                                  "set cov_lower <= cov_upper")


def validate_rules(cfg: DictConfig) -> None:
    """Cross-field rules, then the objective's checks (a step of :func:`mixrl.config.validate.validate_config`)."""
    geometry(cfg)
    algo = cfg.algo
    if algo.num_generations < 2 and algo.advantage.name in ("grpo", "dr_grpo", "rloo"):
        raise ConfigError(
            f"algo.advantage.name={algo.advantage.name} compares completions within a group; set algo.num_generations >= 2"
        )
    if algo.advantage.name == "polychromic" and int(algo.advantage.get("set_size", 4)) > algo.num_generations:
        raise ConfigError(f"algo.advantage.set_size={int(algo.advantage.get('set_size', 4))} > algo.num_generations={algo.num_generations}: "
                          "a polychromic set is drawn from one prompt's group; set set_size <= num_generations")
    if cfg.hardware.device not in ("cpu", "cuda"):
        raise ConfigError(f"hardware.device must be 'cpu' or 'cuda', got '{cfg.hardware.device}'")
    if cfg.model.dtype not in ("float32", "bfloat16", "float16", "auto"):
        raise ConfigError(f"model.dtype must be float32, bfloat16, float16 or auto, got '{cfg.model.dtype}'")
    if cfg.trainer.max_steps < 1:
        raise ConfigError(f"trainer.max_steps must be >= 1, got {cfg.trainer.max_steps}")
    if cfg.trainer.learning_rate <= 0:
        raise ConfigError(f"trainer.learning_rate must be > 0, got {cfg.trainer.learning_rate}")
    if float(cfg.algo.kl.get("coef", 0.0)) < 0:
        raise ConfigError("algo.kl.coef must be >= 0")
    _check_staleness(cfg)
    _check_async(cfg)
    _check_cov_window(cfg)
    _check_token_budget(cfg)
    check_sampler(cfg)
    check_shaping(cfg)
    build_injection(cfg, geometry=geometry(cfg)).check_budget(int(cfg.trainer.max_completion_length))
    check_objective(cfg)
