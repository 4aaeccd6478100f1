"""Evaluation as the papers do it: their benchmarks, their protocol, their table beside ours.

* :mod:`~mixrl.benchmarks.spec`: ``conf/benchmarks/*.yaml`` (one benchmark or suite per file)
  and the ``benchmarks=...`` overrides, validated (one-line errors);
* :mod:`~mixrl.benchmarks.data`: a benchmark's problems, read by the training data's loader
  (hub id or local file: the offline fixtures go through the same code);
* :mod:`~mixrl.benchmarks.scoring`: answer extraction (boxed, final answer, choice letter) and scorers;
* :mod:`~mixrl.benchmarks.metrics`: avg@k, pass@k, maj@k with bootstrap intervals (scipy.stats);
* :mod:`~mixrl.benchmarks.runner`: generation (HF ``generate`` or vLLM), streamed to a JSONL
  that an interrupted evaluation resumes from, keyed by (model files, benchmark, protocol);
* the command, ``mixrl eval MODEL benchmarks=SUITE`` (the table, with the paper's numbers beside
  it), is :mod:`mixrl.cli.benchmarks`: it builds the run's config with the trainer's assembly, so it
  lives with the command line, above both.
"""
