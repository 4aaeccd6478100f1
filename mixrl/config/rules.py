"""Cross-field rules and the batch geometry derived from one config.

The user states the rollout geometry once (``trainer.prompts_per_step``,
``algo.num_generations``, ``trainer.micro_batch_size``, ``hardware.num_processes``);
every other size (gradient accumulation, generation batch, expert rows) is derived here
and checked, never repeated in the config.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from mixrl.errors import ConfigError

@dataclass(frozen=True)
class Geometry:
    prompts_per_step: int
    num_generations: int
    rollouts_per_step: int  # on-policy rows per optimizer step, all processes
    world_size: int
    micro_batch_size: int  # rows per forward/backward per process
    grad_accum: int  # micro-batches per optimizer step per process
    rows_per_process: int
    expert_rows_per_step: int = 0  # rows an injection appends beside the rollouts per optimizer step (CHORD), all processes

    @property
    def expert_rows_per_process(self) -> int:
        return self.expert_rows_per_step // self.world_size

    def describe(self) -> str:
        text = (
            f"{self.prompts_per_step} prompts x {self.num_generations} generations = {self.rollouts_per_step} rollouts/step "
            f"= {self.world_size} process(es) x {self.grad_accum} micro-batch(es) x {self.micro_batch_size} rows"
        )
        if self.expert_rows_per_step:
            text += f", + {self.expert_rows_per_step} appended rows/step ({self.expert_rows_per_process // self.grad_accum} per micro-batch)"
        return text


def geometry(cfg: DictConfig) -> Geometry:
    P, G = int(cfg.trainer.prompts_per_step), int(cfg.algo.num_generations)
    W = int(cfg.hardware.num_processes) * int(cfg.hardware.get("num_machines", 1) or 1)  # the world size
    M = int(cfg.trainer.micro_batch_size) if cfg.trainer.micro_batch_size is not None else P * G // max(W, 1)
    if P < 1 or G < 1 or W < 1 or M < 1:
        raise ConfigError(
            "trainer.prompts_per_step, algo.num_generations, trainer.micro_batch_size and hardware.num_processes must be >= 1"
        )
    rows = P * G
    if rows % W:
        raise ConfigError(
            f"{P} prompts x {G} generations = {rows} rollouts cannot be split over hardware.num_processes={cfg.hardware.num_processes}"
            + (f" x hardware.num_machines={cfg.hardware.num_machines} = {W} processes" if W != int(cfg.hardware.num_processes) else "") + "; "
            f"make trainer.prompts_per_step a multiple of {W // _gcd(G, W)}"
        )
    per_proc = rows // W
    if per_proc % M:
        options = [m for m in range(1, per_proc + 1) if per_proc % m == 0]
        raise ConfigError(
            f"trainer.micro_batch_size={M} does not divide the {per_proc} rollouts per process per step "
            f"({P} prompts x {G} generations / {W} process(es)); choose one of {', '.join(map(str, options))}"
        )
    ga = per_proc // M
    return Geometry(P, G, rows, W, M, ga, per_proc, _expert_rows(cfg, rows, W * ga))


def _expert_rows(cfg: DictConfig, rollouts: int, unit: int) -> int:
    """Rows the configured injection appends per step (``extra_rows_per_step``), with
    ``unit`` = processes x micro-batches so that every micro-batch can hold the same number."""
    from mixrl.config.objective import build_injection

    return build_injection(cfg).extra_rows_per_step(rollouts, unit)


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


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
    (mixrl.trainer.async_generation): a vLLM server, one training process with whole weights,
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
    from mixrl.config.objective import build_injection, component
    from mixrl.sources.base import Injection

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


def validate_rules(cfg: DictConfig) -> None:
    """Cross-field rules, then the objective's checks (the one validation pass)."""
    from mixrl.config.objective import check_objective

    geometry(cfg)
    algo = cfg.algo
    if algo.num_generations < 2 and algo.advantage.name in ("grpo", "dr_grpo", "rloo"):
        raise ConfigError(
            f"algo.advantage.name={algo.advantage.name} compares completions within a group; set algo.num_generations >= 2"
        )
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
    from mixrl.config.sampler import check_sampler

    check_sampler(cfg)
    check_objective(cfg)
