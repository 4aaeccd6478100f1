"""Scalar schedules keyed to the trainer step (axis A5, ``schedule/``).

Signature of every registered schedule: ``fn(step: int, *, <params>) -> float``, where
``step`` counts optimizer steps from 0. A schedule *spec* in config is either a number
(constant) or a mapping ``{name: <schedule>, <param>: <value>, ...}``;
:func:`resolve_schedule` turns it into a ``Callable[[int], float]``.

A schedule may declare ``fn.knots = lambda params: [steps]``: the steps where it changes
regime (end of a warmup, a switch); :func:`schedule_knots` reads them (``mixrl explain``
adds them to its schedule table).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from mixrl.core.registry import ComponentParamError, Registry, UnknownComponentError

SCHEDULES = Registry("schedule")


@SCHEDULES.register("constant")
def constant(step: int, *, value: float = 0.0) -> float:
    """Constant: ``f(step) = value``.

    Formula: ``f(t) = {value}``

    Paper: any fixed coefficient; CHORD-phi's constant mu = 0.1 ("On-Policy RL Meets
    Off-Policy Experts: Harmonizing Supervised Fine-Tuning and Reinforcement Learning via
    Dynamic Weighting").

    Parameters:
        value (0.0): the value.
    """
    return float(value)


@SCHEDULES.register("linear", bounds={"steps": (">= 0", "a number of steps")})
def linear(step: int, *, start: float = 0.0, end: float = 1.0, steps: int = 100) -> float:
    """Linear ramp: ``start + (end - start) * min(step / steps, 1)``; ``end`` after ``steps``.

    ``steps = 0`` gives ``end`` from step 0.

    Formula: ``f(t) = {start} + ({end} - {start}) min(t / {steps}, 1)``

    Paper: generic (e.g. KL or prefix-length ramps).

    Parameters:
        start (0.0): value at step 0.
        end (1.0): value from step ``steps`` on.
        steps (100): length of the ramp.
    """
    if steps <= 0 or step >= steps:
        return float(end)
    if step <= 0:
        return float(start)
    return float(start + (end - start) * step / steps)


@SCHEDULES.register("cosine", bounds={"warmup": (">= 0", "a number of steps"), "decay": (">= 0", "a number of steps")})
def cosine(
    step: int,
    *,
    warmup: int = 0,
    peak: float = 0.1,
    decay: int = 0,
    valley: float = 0.1,
) -> float:
    """CHORD's mu: linear warmup 0 -> peak, cosine decay peak -> valley, then valley.

    Formula: ``f(t) = {peak} t / {warmup}`` for t < {warmup}; ``{valley} + ({peak} - {valley})
    (1 + cos(pi (t - {warmup}) / {decay})) / 2`` for the next {decay} steps; ``{valley}`` after

    ``warmup = 0`` starts at ``peak``; ``decay = 0`` jumps to ``valley`` at ``warmup``. The
    defaults are CHORD's constructor default (constant 0.1). CHORD-mu: warmup 0, decay 200,
    peak 0.9, valley 0.05; math recipe: warmup 200, decay 400, peak 0.5, valley 0.02.

    Paper: CHORD, "On-Policy RL Meets Off-Policy Experts: Harmonizing Supervised Fine-Tuning
    and Reinforcement Learning via Dynamic Weighting".

    Parameters:
        warmup (0): steps of the linear ramp from 0 to peak.
        peak (0.1): value at the end of warmup.
        decay (0): steps of the cosine decay from peak to valley.
        valley (0.1): value after warmup + decay.
    """
    if step < warmup:
        return float(peak * step / warmup)
    if step >= warmup + decay:
        return float(valley)
    progress = (step - warmup) / decay
    return float(valley + (peak - valley) * 0.5 * (1.0 + math.cos(math.pi * progress)))


@SCHEDULES.register("step", bounds={"switch_step": (">= 0", "a step number")})
def step_schedule(
    step: int, *, switch_step: int = 0, before: float = 0.0, after: float = 1.0
) -> float:
    """Stage switch: ``before`` for ``step < switch_step``, ``after`` from then on.

    Formula: ``f(t) = {before}`` for t < {switch_step}, ``{after}`` from then on

    Paper: the policy reincarnation of ReMix, "Squeeze the Soaked Sponge: Efficient
    Off-policy Reinforcement Finetuning for Large Language Model" (off-policy early,
    on-policy later); staged SFT -> RL.

    Parameters:
        switch_step (0): first step that uses ``after``.
        before (0.0): value before the switch.
        after (1.0): value from the switch on.
    """
    return float(before if step < switch_step else after)


linear.knots = lambda p: [int(p["steps"])]
cosine.knots = lambda p: [int(p["warmup"]), int(p["warmup"]) + int(p["decay"])]
step_schedule.knots = lambda p: [int(p["switch_step"])]


def schedule_knots(spec: Any) -> list[int]:
    """Steps where the schedule ``spec`` changes regime, as its component declares them
    (``fn.knots``); none for a number, a callable or a schedule that declares none."""
    if callable(spec) and not isinstance(spec, Mapping):
        return []
    name, params = _split_spec(spec)
    fn = SCHEDULES.get(name)
    knots = getattr(fn, "knots", None)
    if knots is None:
        return []
    return sorted({int(k) for k in knots({**SCHEDULES.defaults(name), **params})})


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _split_spec(spec: Any) -> tuple[str, dict[str, Any]]:
    """``(name, params)`` of a schedule spec (number, name string or mapping)."""
    if _is_number(spec):
        return "constant", {"value": float(spec)}
    if isinstance(spec, str):
        return spec, {}
    if isinstance(spec, Mapping):
        params = {str(k): v for k, v in spec.items()}
        if "name" not in params:
            raise ComponentParamError(
                f"schedule spec {dict(params)!r} has no 'name'; choices: {', '.join(SCHEDULES.names())}"
            )
        name = params.pop("name")
        if not isinstance(name, str):
            raise ComponentParamError(f"schedule name must be a string, got {name!r}")
        return name, params
    raise ComponentParamError(
        f"a schedule must be a number or a mapping with 'name', got {spec!r}"
    )


def split_spec(spec: Any) -> tuple[str, dict[str, Any]]:
    """``(name, params)`` of a schedule spec: a number is ``("constant", {"value": x})``."""
    return _split_spec(spec)


def resolve_schedule(spec: Any) -> Callable[[int], float]:
    """Turn a schedule spec into ``f(step) -> float``.

    ``spec``: a number (constant), a registered name (its defaults), a mapping (e.g. an
    OmegaConf DictConfig) ``{name: cosine, warmup: 0, peak: 0.9, ...}``, or a callable
    (returned as is). Unknown names raise :class:`UnknownComponentError`; unknown or
    wrongly typed params raise :class:`ComponentParamError` (a ``TypeError``); both have
    one-line messages.
    """
    if callable(spec) and not isinstance(spec, Mapping):
        return spec
    name, params = _split_spec(spec)
    fn = SCHEDULES.get(name)  # raises UnknownComponentError
    SCHEDULES.check_params(name, params)
    kwargs = {**SCHEDULES.defaults(name), **params}

    def schedule(step: int) -> float:
        return fn(int(step), **kwargs)

    schedule.__name__ = f"schedule_{name}"
    schedule.__doc__ = describe_schedule(spec)
    return schedule


def describe_schedule(spec: Any) -> str:
    """Readable text for a spec, all params filled in, e.g.
    ``cosine(warmup=0, peak=0.9, decay=200, valley=0.05)``."""
    if callable(spec) and not isinstance(spec, Mapping):
        return getattr(spec, "__doc__", None) or getattr(spec, "__name__", repr(spec))
    name, params = _split_spec(spec)
    SCHEDULES.get(name)
    SCHEDULES.check_params(name, params)
    values = {**SCHEDULES.defaults(name), **params}
    return f"{name}({', '.join(f'{k}={_fmt(v)}' for k, v in values.items())})"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return repr(v) if isinstance(v, str) else str(v)


__all__ = [
    "SCHEDULES",
    "UnknownComponentError",
    "constant",
    "cosine",
    "describe_schedule",
    "linear",
    "resolve_schedule",
    "schedule_knots",
    "split_spec",
    "step_schedule",
]
