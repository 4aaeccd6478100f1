"""The batch geometry derived from one config.

The user states the rollout geometry once (``trainer.prompts_per_step``,
``algo.num_generations``, ``trainer.micro_batch_size``, ``hardware.num_processes``);
every other size (gradient accumulation, generation batch, expert rows) is derived here
and checked, never repeated in the config. Its own module because both the cross-field
rules (:mod:`mixrl.config.rules`) and the objective's checks (:mod:`mixrl.config.objective`)
need it.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from mixrl.config.builders import build_injection
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
    """The batch geometry of ``cfg``; ConfigError (one line) when the sizes do not divide."""
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
    return build_injection(cfg).extra_rows_per_step(rollouts, unit)


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a
