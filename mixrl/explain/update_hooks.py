"""``mixrl explain``'s rows for what changes the update outside the loss: SFPO's reposition
(``algo.reposition``, :mod:`mixrl.trainer.reposition`) and ALP's layerwise perturbation
(``algo.perturbation``, :mod:`mixrl.trainer.perturbation`)."""

from __future__ import annotations

from omegaconf import DictConfig


def update_rows(cfg: DictConfig) -> list[str]:
    """One line per update hook the config turns on (none: no rows)."""
    rows = []
    spec = cfg.algo.get("reposition")
    if spec is not None:
        k, alpha = int(cfg.trainer.num_iterations) - 1, spec.get("alpha", 0.8)
        rows.append(f"reposition (SFPO): {k} fast step(s) per generation batch, then theta <- theta_0 + {alpha} (theta - theta_0) "
                    f"(theta_0: the weights the batch started from), then 1 slow step" if k > 0 else
                    "reposition (SFPO): trainer.num_iterations=1, no fast steps: nothing to reposition")
    spec = cfg.algo.get("perturbation")
    if spec is not None:
        rows.append(f"perturbation (ALP): h <- h + {spec.get('sigma', 0.01)} sg(rms(h)) eps, eps ~ N(0, I), on every decoder "
                    "layer's input in the loss forward only: r_t = p_t(perturbed) / pi_b(y_t)")
    return rows
