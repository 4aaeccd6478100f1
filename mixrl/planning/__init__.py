"""The pieces of ``mixrl plan`` (its public names, and the estimate's explanation, are in
:mod:`mixrl.plan`): ``shape`` (a model's shape without loading it), ``memory`` (the per-GPU
estimate), ``evaluation`` (what ``trainer.eval_benchmarks`` generates) and ``render`` (the
plan as text)."""
