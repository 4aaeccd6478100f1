"""How off-policy rows enter a generation batch (the ``algo.mix.mode`` axis).

A mixer is consulted by ``MixrlGRPOTrainer`` at two points:

* ``rewrite_completions(trainer, completion_ids, logprobs)``: after rollouts are
  generated and before they are scored (group injection, LUFFY);
* ``after_scoring(trainer, inputs, out)``: after advantages are computed, to append
  extra rows to the batch (auxiliary-loss rows, CHORD).

``mode: none`` has no mixer.
"""

from __future__ import annotations

from omegaconf import DictConfig

from mixrl.config.rules import Geometry


def build_mixer(cfg: DictConfig, train_ds, geom: Geometry):
    """The mixer for ``cfg.algo.mix.mode`` and the (possibly filtered) training dataset."""
    mode = cfg.algo.mix.get("mode", "none")
    if mode == "none":
        return None, train_ds
    raise NotImplementedError(f"algo.mix.mode={mode} is not available yet")
