"""The TRL glue of :class:`mixrl.trainer.grpo.MixrlGRPOTrainer`, one module per job.

``grpo.py`` keeps the hooks TRL calls (``OVERRIDDEN``), each a few lines that hand the work to
a function here; these modules read the trainer's TRL state (its accelerator, generation
settings, TRL's private counters listed in :mod:`mixrl.trainer.trl_contract`) and its parts, and
are the only modules besides ``grpo.py`` that do:

* :mod:`~mixrl.trainer.trl_hooks.generation`: the gen stage of a generation batch (the sampler's
  rounds, the injections around TRL's generation, lagged or asynchronous weights).
* :mod:`~mixrl.trainer.trl_hooks.scoring`: the stages after it (provenance, reward, advantage,
  accounting, teacher log-probs, logging).
* :mod:`~mixrl.trainer.trl_hooks.loss`: the loss of one micro-batch, the token-budget step, the
  step's token metrics.
* :mod:`~mixrl.trainer.trl_hooks.checkpoints`: what a checkpoint carries besides TRL's files
  (the run's counters, TRL's buffered batch, the parts that are on).
"""
