"""Every value of a run that changes with the optimizer step, as ``label -> f(step)``.

The schedules of a config are: the learning rate (transformers' scheduler, as the trainer
builds it), every named coefficient of the objective (``build_objective(cfg).coefs``:
``mu``, ``entropy_coef``, ...) that no controller sets, and any other schedule spec under
``algo`` (a mapping whose ``name`` is a registered schedule, e.g. a term's ``weight``).
:func:`schedule_rows` tabulates them at a few steps, :func:`plot_schedules` draws them.
The steps where a schedule changes regime (``schedule_knots``) are what each schedule
component declares (:func:`mixrl.core.schedules.schedule_knots`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from omegaconf import DictConfig
import torch

from mixrl.config.builders import CHECK_LIMIT as _CHECK_LIMIT  # how far schedules are evaluated
from mixrl.config.builders import component  # noqa: F401  (re-exported for render)
from mixrl.config.builders import plain as _plain
from mixrl.errors import ConfigError
from mixrl.config.builders import build_objective
from mixrl.core import CONTROLLERS, SCHEDULES
from mixrl.core.schedules import resolve_schedule, schedule_knots as declared_knots


def objective(cfg: DictConfig):
    """The :class:`mixrl.core.objective.Objective` the trainer builds from ``cfg``."""
    try:
        return build_objective(cfg)
    except ConfigError:
        raise
    except (ValueError, TypeError, KeyError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"could not build the objective from algo: {msg}") from None


def controller_knobs(cfg: DictConfig) -> tuple[str | None, tuple[str, ...]]:
    """The configured controller's name and the knobs it sets (``knob_names``)."""
    name, _ = component(cfg.algo.get("controller"))
    if name is None:
        return None, ()
    return name, tuple(getattr(CONTROLLERS.get(name), "knob_names", ()))


def constant_value(spec: Any, max_steps: int) -> float | None:
    """The schedule's value if it is the same at every step of the run, else None."""
    fn = resolve_schedule(spec)
    first = float(fn(0))
    for step in range(1, min(int(max_steps), _CHECK_LIMIT) + 1):
        if float(fn(step)) != first:
            return None
    return first


def _extra_schedules(node: Any, prefix: str, skip: tuple[str, ...]) -> dict[str, Any]:
    """Mappings under ``algo`` that are schedule specs (``{name: cosine, ...}``), by path."""
    out: dict[str, Any] = {}
    if prefix in skip or any(prefix.startswith(s + ".") for s in skip):
        return out
    if isinstance(node, Mapping):
        name = node.get("name")
        if isinstance(name, str) and name in SCHEDULES:
            params = SCHEDULES.params(name)
            if all(k == "name" or k in params for k in node):
                out[prefix] = dict(node)
                return out
        for k, v in node.items():
            out.update(_extra_schedules(v, f"{prefix}.{k}", skip))
    return out


def schedule_specs(cfg: DictConfig) -> dict[str, Any]:
    """``label -> schedule spec`` of everything scheduled in ``cfg.algo``, in display order:
    the objective's coefficients (minus those a controller sets), then any other schedule
    spec under ``algo`` (labelled by its path below ``algo``)."""
    _, knobs = controller_knobs(cfg)
    out = {name: spec for name, spec in objective(cfg).coefs.items() if name not in knobs}
    for path, spec in _extra_schedules(_plain(cfg.algo), "algo", ("algo.coefs", "algo.entropy_coef")).items():
        out[path.removeprefix("algo.")] = spec
    return out


def _lr_schedule(cfg: DictConfig) -> Callable[[int], float]:
    """The learning rate at each optimizer step (transformers' scheduler, as the trainer uses)."""
    from transformers import get_scheduler  # deferred: transformers is heavy; the light commands (--help, config show, plan) never load it

    t = cfg.trainer
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=float(t.learning_rate))
    try:
        sched = get_scheduler(
            str(t.lr_scheduler_type), opt, num_warmup_steps=int(t.warmup_steps), num_training_steps=int(t.max_steps)
        )
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"trainer.lr_scheduler_type={t.lr_scheduler_type}: {str(e).splitlines()[0]}") from None
    lambdas = getattr(sched, "lr_lambdas", None)
    base = float(t.learning_rate)
    if lambdas:
        return lambda step: base * float(lambdas[0](int(step)))
    values = []  # not a LambdaLR: step it once per optimizer step
    for _ in range(int(t.max_steps) + 1):
        values.append(float(sched.get_last_lr()[0]))
        opt.step()
        sched.step()
    return lambda step: values[min(int(step), len(values) - 1)]


def schedules(cfg: DictConfig, *, include_lr: bool = True) -> dict[str, Callable[[int], float]]:
    """Each scheduled value of the run as ``label -> f(step)``, in display order:
    :func:`schedule_specs`, then ``lr`` (the optimizer's learning rate)."""
    out = {label: resolve_schedule(spec) for label, spec in schedule_specs(cfg).items()}
    if include_lr:
        out["lr"] = _lr_schedule(cfg)
    return out


def table_steps(max_steps: int, n: int = 5, knots: list[int] | tuple[int, ...] = ()) -> list[int]:
    """``n`` evenly spaced steps from 0 to ``max_steps`` (both included), plus ``knots`` in range."""
    if n < 2:
        raise ConfigError(f"--steps must be >= 2 (0 and trainer.max_steps at least), got {n}")
    steps = {round(i * max_steps / (n - 1)) for i in range(n)}
    steps |= {int(k) for k in knots if 0 <= int(k) <= max_steps}
    return sorted(steps)


def schedule_knots(cfg: DictConfig) -> list[int]:
    """Steps where a schedule changes regime (as each schedule declares: end of warmup, end
    of decay, a switch), and the end of the learning-rate warmup."""
    max_steps = int(cfg.trainer.max_steps)
    knots: set[int] = set()
    for spec in schedule_specs(cfg).values():
        if constant_value(spec, max_steps) is None:
            knots |= set(declared_knots(spec))
    if int(cfg.trainer.warmup_steps):
        knots.add(int(cfg.trainer.warmup_steps))
    return sorted(knots)


def schedule_rows(cfg: DictConfig, n: int = 5) -> tuple[list[str], list[list[float]]]:
    """``(columns, rows)``: ``step`` and each schedule's value at :func:`table_steps`."""
    fns = schedules(cfg)
    steps = table_steps(int(cfg.trainer.max_steps), n, schedule_knots(cfg))
    return ["step", *fns], [[float(s), *(float(f(s)) for f in fns.values())] for s in steps]


def require_matplotlib():
    """The matplotlib module, or ConfigError with the install hint."""
    try:
        import matplotlib  # deferred: matplotlib is optional (the plot extra)
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'mixrl[plot]'") from None
    return matplotlib


def plot_schedules(stages: DictConfig | list[tuple[str, DictConfig]], path: str) -> str:
    """Draw every schedule over steps 0..max_steps into a PNG at ``path``; returns the path.

    ``stages``: one config, or ``[(name, cfg), ...]`` for a staged algo (sft_then_rl), drawn
    one after the other on a common step axis.
    """
    matplotlib = require_matplotlib()
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: matplotlib is optional (the plot extra)

    if isinstance(stages, DictConfig):
        stages = [("", stages)]
    segments, labels, offset = [], [], 0
    for name, cfg in stages:
        fns = schedules(cfg)
        labels += [k for k in fns if k not in labels]
        max_steps = int(cfg.trainer.max_steps)
        stride = max(1, max_steps // 2000)
        xs = list(range(0, max_steps + 1, stride))
        if xs[-1] != max_steps:
            xs.append(max_steps)
        segments.append((name, offset, xs, fns))
        offset += max_steps
    fig, axes = plt.subplots(len(labels), 1, figsize=(7, 1.8 * len(labels) + 0.6), sharex=True, squeeze=False)
    for ax, label in zip(axes[:, 0], labels):
        for name, off, xs, fns in segments:
            if label in fns:
                ax.plot([off + x for x in xs], [fns[label](x) for x in xs], lw=1.5, label=name or None)
            if off:
                ax.axvline(off, color="grey", ls="--", lw=0.8)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("optimizer step")
    algo = stages[0][1].algo.name if len(stages) == 1 else " -> ".join(n for n, _ in stages)
    axes[0, 0].set_title(f"schedules of {algo} ({offset} steps)")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=100)
    except OSError as e:
        raise ConfigError(f"could not write the plot to '{path}': {e.strerror or e}") from None
    finally:
        plt.close(fig)
    return str(path)
