"""What a benchmark measures, and the statistics read from it: one :class:`StepRecord` per
step, one :class:`VariantResult` per variant, and :func:`paired_ratio` between two variants.

Shared by ``python -m bench.throughput`` and ``python -m bench.vllm_steps`` (whose child
processes send their records back as JSON: every field is a plain number or string).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass
class StepRecord:
    step: int
    seconds: float = 0.0
    rollout_seconds: float = 0.0  # generate + score (+ mixing)
    generate_seconds: float = 0.0  # the generation inside the rollout (_generate_single_turn; the floor's model.generate)
    rollout_tokens: int = 0  # on-policy completion tokens trained on this step
    expert_tokens: int = 0  # expert completion tokens trained on this step (CHORD)
    prompt_tokens: int = 0
    rows: int = 0
    expert_rows: int = 0
    forward_tokens: int = 0  # tokens of the step's padded rows (rows x (prompt width + completion width))
    padding_fraction: float | None = None  # padding over the tokens of the step's loss forwards (mixrl's batch/padding_fraction)
    rss_peak_mb: float | None = None  # process RSS high-water mark during this step
    cuda_peak_mb: float | None = None  # torch.cuda.max_memory_allocated during this step
    cuda_base_mb: float | None = None  # torch.cuda.memory_allocated when the step began
    measured: bool = True
    profiled: str = ""

    @property
    def train_seconds(self) -> float:
        return self.seconds - self.rollout_seconds

    @property
    def trained_tokens_per_second(self) -> float | None:
        """Real tokens of the step's rows (prompt + completion, every row trained) over the train phase.

        Formula: (prompt_tokens + rollout_tokens + expert_tokens) / (seconds - rollout_seconds)"""
        t = self.train_seconds
        return (self.prompt_tokens + self.rollout_tokens + self.expert_tokens) / t if t > 0 else None


@dataclass
class VariantResult:
    name: str
    description: str
    records: list[StepRecord] = field(default_factory=list)
    state_mb: float | None = None  # parameters + optimizer state
    error: str | None = None
    generated_tokens: int | None = None  # mixrl's count of every token the policy sampled (all steps)

    def measured(self) -> list[StepRecord]:
        return [r for r in self.records if r.measured]

    def med(self, attr: str) -> float | None:
        vals = [getattr(r, attr) for r in self.measured()]
        vals = [v for v in vals if v is not None]
        return statistics.median(vals) if vals else None

    def quantiles(self, attr: str = "seconds") -> tuple[float, float, float] | None:
        vals = sorted(getattr(r, attr) for r in self.measured())
        if not vals:
            return None
        if len(vals) == 1:
            return vals[0], vals[0], vals[0]
        q = statistics.quantiles(vals, n=4, method="inclusive")
        return vals[0], q[0], q[2]

    def peak(self, attr: str) -> float | None:
        vals = [getattr(r, attr) for r in self.measured() if getattr(r, attr) is not None]
        return max(vals) if vals else None


def paired_ratio(a: VariantResult | None, b: VariantResult | None, attr: str = "seconds") -> dict | None:
    """Median over rounds of a_i / b_i (the i-th measured step of each) and the ratio of medians."""
    if a is None or b is None or not a.measured() or not b.measured():
        return None
    pairs = [getattr(x, attr) / getattr(y, attr) for x, y in zip(a.measured(), b.measured()) if getattr(y, attr) > 0]
    ma, mb = a.med(attr), b.med(attr)
    mins = [min(getattr(r, attr) for r in v.measured()) for v in (a, b)]
    return {
        "ratio_of_mins": (mins[0] / mins[1]) if mins[1] > 0 else None,
        "paired_median": statistics.median(pairs) if pairs else None,
        "paired_min": min(pairs) if pairs else None,
        "paired_max": max(pairs) if pairs else None,
        "ratio_of_medians": (ma / mb) if ma and mb else None,
        "n": len(pairs),
    }


def fmt(v: float | None, spec: str = ".3f", unit: str = "") -> str:
    """A number for a table cell; "–" for a missing one."""
    return "–" if v is None else f"{v:{spec}}{unit}"
