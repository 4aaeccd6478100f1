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

MIX_MODES = ("none", "aux_loss", "group_inject", "sft")
OFFPOLICY_SOURCES = ("none", "expert")


@dataclass(frozen=True)
class Geometry:
    prompts_per_step: int
    num_generations: int
    rollouts_per_step: int  # on-policy rows per optimizer step, all processes
    world_size: int
    micro_batch_size: int  # rows per forward/backward per process
    grad_accum: int  # micro-batches per optimizer step per process
    rows_per_process: int
    expert_rows_per_step: int = 0  # aux_loss (CHORD): extra expert rows per optimizer step, all processes

    @property
    def expert_rows_per_process(self) -> int:
        return self.expert_rows_per_step // self.world_size

    def describe(self) -> str:
        text = (
            f"{self.prompts_per_step} prompts x {self.num_generations} generations = {self.rollouts_per_step} rollouts/step "
            f"= {self.world_size} process(es) x {self.grad_accum} micro-batch(es) x {self.micro_batch_size} rows"
        )
        if self.expert_rows_per_step:
            text += f", + {self.expert_rows_per_step} expert rows/step ({self.expert_rows_per_process // self.grad_accum} per micro-batch)"
        return text


def geometry(cfg: DictConfig) -> Geometry:
    P, G = int(cfg.trainer.prompts_per_step), int(cfg.algo.num_generations)
    W = int(cfg.hardware.num_processes)
    M = int(cfg.trainer.micro_batch_size) if cfg.trainer.micro_batch_size is not None else P * G // max(W, 1)
    if P < 1 or G < 1 or W < 1 or M < 1:
        raise ConfigError(
            "trainer.prompts_per_step, algo.num_generations, trainer.micro_batch_size and hardware.num_processes must be >= 1"
        )
    rows = P * G
    if rows % W:
        raise ConfigError(
            f"{P} prompts x {G} generations = {rows} rollouts cannot be split over hardware.num_processes={W}; "
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
    """CHORD's expert rows per step: ``algo.mix.expert_rows``, or ``expert_ratio`` = the
    fraction of all rows that are expert (0.2 with 256 rollouts gives 64, as in CHORD's
    recipe), rounded to a multiple of ``unit`` = processes x micro-batches so that every
    micro-batch of every process can hold the same number."""
    mix = cfg.algo.mix
    if mix.get("mode", "none") != "aux_loss":
        return 0
    rows, ratio = mix.get("expert_rows"), mix.get("expert_ratio")
    if rows is not None:  # a count wins over the ratio
        if int(rows) < 1 or int(rows) % unit:
            raise ConfigError(
                f"algo.mix.expert_rows={rows} must be a positive multiple of {unit} "
                f"(processes x micro-batches per step), e.g. {max(unit, round(int(rows) / unit) * unit)}"
            )
        return int(rows)
    ratio = 0.2 if ratio is None else float(ratio)
    if not 0.0 < ratio < 1.0:
        raise ConfigError(f"algo.mix.expert_ratio must be in (0, 1), got {ratio}")
    return max(unit, round(ratio * rollouts / (1.0 - ratio) / unit) * unit)


MIX_KEYS = {
    "mode": "none | aux_loss | group_inject | sft",
    "mu": "aux_loss: weight of the expert term, a number or a schedule",
    "token_weight": "aux_loss/sft: weight on expert tokens {name: one|p|chord_phi|luffy}",
    "expert_rows": "aux_loss: expert rows per step (wins over expert_ratio when set)",
    "expert_ratio": "aux_loss: fraction of rows per step that are expert",
    "experts_per_group": "group_inject: expert completions per group (k)",
    "shaping_gamma": "group_inject: f(p) = p / (p + gamma) on expert tokens",
}


def _validate_mix(cfg: DictConfig) -> None:
    from mixrl.errors import did_you_mean

    mix = cfg.algo.mix
    for key in mix.keys():
        if key not in MIX_KEYS:
            raise ConfigError(f"unknown key 'algo.mix.{key}'{did_you_mean(str(key), MIX_KEYS)}; keys: {', '.join(MIX_KEYS)}")
    mode = mix.get("mode", "none")
    if mode == "group_inject":
        k, G = int(mix.get("experts_per_group", 1)), int(cfg.algo.num_generations)
        if not 1 <= k < G:
            raise ConfigError(f"algo.mix.experts_per_group={k} must be between 1 and num_generations-1={G - 1}")
        if float(mix.get("shaping_gamma", 0.1)) <= 0:
            raise ConfigError("algo.mix.shaping_gamma must be > 0")


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def validate_rules(cfg: DictConfig) -> None:
    _validate_mix(cfg)
    geometry(cfg)
    algo, off = cfg.algo, cfg.offpolicy
    if off.source not in OFFPOLICY_SOURCES:
        raise ConfigError(f"unknown offpolicy.source '{off.source}'; choices: {', '.join(OFFPOLICY_SOURCES)}")
    mode = algo.mix.get("mode", "none")
    if mode not in MIX_MODES:
        raise ConfigError(f"unknown algo.mix.mode '{mode}'; choices: {', '.join(MIX_MODES)}")
    if mode != "none" and off.source == "none":
        raise ConfigError(
            f"algo.mix.mode={mode} trains on off-policy rows but offpolicy.source is 'none'; add offpolicy=expert"
        )
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
