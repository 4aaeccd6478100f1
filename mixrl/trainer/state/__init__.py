"""A run's state on disk: the run directory (:mod:`~mixrl.trainer.state.rundir`: its layout,
lock, saved config and checkpoint lookup), resuming (:mod:`~mixrl.trainer.state.resume`: whether a
resume may go on, the counters read back) and checkpoints (:mod:`~mixrl.trainer.state.checkpoint_state`:
each part's state, which process writes what). No module here imports TRL or a part."""
