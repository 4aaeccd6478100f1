"""mixrl benchmarks (not part of the installed package).

Commands: ``python -m bench.throughput`` (step time against plain TRL and a torch floor),
``python -m bench.memory`` (peak memory against ``mixrl plan``), ``python -m bench.sampler``
(what the samplers cost), ``python -m bench.vllm_steps`` (step time with vLLM generation).
None of them writes into ``docs/results/`` unless ``--out`` names it.

The step-time benchmark's parts, one job each (the others reuse them): ``variants`` (building
each variant), ``turns`` (turn taking), ``timer`` (the timing hook), ``probes`` (memory),
``records`` (measurements and their ratios), ``runner`` (one run), ``profiling`` and ``report``
(the outputs and where they go), ``machine`` (machine, commit, load).
"""
