"""What changes the update itself outside the loss, added to a built trainer: SFPO's reposition
between a batch's fast and slow steps (:mod:`mixrl.trainer.reposition`, ``algo.reposition``) and
ALP's layerwise perturbation of the loss forward (:mod:`mixrl.trainer.perturbation`,
``algo.perturbation``). Each does nothing when its config key is unset.
"""

from __future__ import annotations

from mixrl.trainer.perturbation import LayerPerturbation, add_perturbation
from mixrl.trainer.reposition import add_reposition


def add_update_hooks(trainer, cfg) -> LayerPerturbation | None:
    """Add to ``trainer`` the update hooks ``cfg.algo`` asks for (a callback, hooks on the model; no
    attribute is set on the trainer). Returns ALP's perturbation (None: off), for inspection."""
    add_reposition(trainer, cfg)
    return add_perturbation(trainer, cfg)  # the hooks live on the model
