"""Experiments: run grids of recipes, compare their runs and judge the papers' claims.

* :mod:`~mixrl.experiments.compare`: ``mixrl compare`` (run directories -> a Markdown table,
  ``compare.json`` and plots), built from :mod:`~mixrl.experiments.runs` (reading run folders),
  :mod:`~mixrl.experiments.summary` (per-method statistics), :mod:`~mixrl.experiments.report`
  (Markdown) and :mod:`~mixrl.experiments.plots` (PNG curves);
* :mod:`~mixrl.experiments.stats`: Welch's t-test, the bootstrap interval, Holm's adjustment and verdicts (scipy.stats);
* :mod:`~mixrl.experiments.intervals`: rliable's interval estimates (IQM, probability of improvement, stratified bootstrap);
* :mod:`~mixrl.experiments.rejudge`: ``mixrl rejudge`` (a results folder's claims judged again from its compare.json);
* :mod:`~mixrl.experiments.claims`: a paper's claim as data, judged over seeds;
* :mod:`~mixrl.experiments.suites`: ``conf/suites/NAME.yaml`` (methods, seeds, budget, claims);
* :mod:`~mixrl.experiments.reproduce`: ``mixrl reproduce SUITE`` (train the grid, compare, README);
* :mod:`~mixrl.experiments.methods`: ``docs/methods.md`` from the shipped recipes and results.
* :mod:`~mixrl.experiments.peers`: ``docs/peers.md`` from ``docs/peers.yaml`` (the peers' options).

These modules read, launch or summarise runs; ``compare`` and its parts read run folders
without importing torch (``methods`` renders objectives, so it does).
"""
