"""EntroPIC's PI controller on the coefficient of the positive samples (controller ``entropic_sign``).

The same proportional-integral law as :class:`mixrl.core.controllers.EntropicController` (which
sets the entropy bonus), acting instead on the advantage shaping ``sign_weight``
(:mod:`mixrl.core.advantage_shaping`): its output alpha lowers the coefficient of the positive
advantages when the entropy falls below the target (positive samples lower the entropy, negative
ones raise it) and raises it above the target. The knob it sets, ``shaping.positive``, is read by
the trainer's shaping stage on the next generation batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

from mixrl.core.controllers import CONTROLLERS, EntropicController


@CONTROLLERS.register("entropic_sign", bounds={
    "target": (">= 0", "an entropy in nats, which is >= 0"),
    "kp": (">= 0", "a negative gain pushes the entropy away from its target"),
    "ki": (">= 0", "a negative gain pushes the entropy away from its target"),
    "alpha_max": ("[0, 1]", "the positive coefficient 1 - alpha must stay >= 0: above 1 it would invert their gradient"),
    "alpha_min": ("<= 0", "alpha < 0 raises the positive coefficient when the entropy is above the target"),
    "integral_limit": (">= 0", "a clamp on |I|"),
})
class EntropicSignController:
    """EntroPIC: a PI controller on the entropy sets the coefficient of the positive samples, ``positive = 1 - alpha``.

    After each optimizer step: ``e = target - H`` (H the step's token-mean entropy of the
    rollouts), ``I += e``, ``alpha = clamp(kp e + ki I, alpha_min, alpha_max)``; the next batch's
    positive advantages are multiplied by ``1 - alpha`` (``algo.shaping: sign_weight``), the
    negative ones keep theirs. The paper's controller acts on the positive samples' high-probability
    tokens (and spares the negative samples' low-probability ones); this stage re-weights whole
    rows, so every token of a positive row shares the coefficient. The PI law is the paper's; the
    mapping ``1 - alpha`` onto whole positive rows and the default gains are mixrl's reading (the
    authors' code, yk7333/EntroPIC, could not be read here).

    Formula: after each step e = {target} - H, I += e (|I| <= {integral_limit}), alpha = clamp({kp} e + {ki} I, {alpha_min}, {alpha_max}); algo.shaping.positive = 1 - alpha

    Paper: EntroPIC, "EntroPIC: Towards Stable Long-Term Training of LLMs via Entropy Stabilization
    with Proportional-Integral Control" (arXiv 2511.15248).

    Parameters:
        target (0.2): target entropy (nats per token).
        kp (1.0): proportional gain.
        ki (0.05): integral gain.
        alpha_min (-1.0): lower bound of alpha (positive coefficient at most 1 - alpha_min).
        alpha_max (1.0): upper bound of alpha (positive coefficient at least 1 - alpha_max >= 0).
        integral_limit (None): clamp on |integral| (None = no anti-windup).
    """

    when = "step_end"
    needs = ("entropy",)
    knob_names = ("shaping.positive",)

    def __init__(self, *, target: float = 0.2, kp: float = 1.0, ki: float = 0.05, alpha_min: float = -1.0,
                 alpha_max: float = 1.0, integral_limit: float | None = None):
        self.pi = EntropicController(target=target, kp=kp, ki=ki, coef_min=alpha_min, coef_max=alpha_max,
                                     integral_limit=integral_limit)

    @staticmethod
    def check(objective) -> None:
        """The shaping it acts on is checked by the config layer (mixrl.config.shaping)."""

    def step(self, stats: dict[str, Any], reduce: Callable[[Tensor], Tensor] | None = None) -> None:
        self.pi.step(stats, reduce)

    def knobs(self) -> dict[str, float]:
        """``shaping.positive = 1 - alpha`` once the first step has been seen (before: the config's)."""
        return {"shaping.positive": 1.0 - self.pi.coef} if self.pi.num_updates else {}

    def metrics(self) -> dict[str, float]:
        return {"entropic/alpha": self.pi.coef, "entropic/error": self.pi.last_error, "entropic/integral": self.pi.integral}

    def state_dict(self) -> dict[str, Any]:
        return self.pi.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pi.load_state_dict(state)
