"""Heaviest test modules first under pytest-xdist, so that the two workers of `make test`,
`make test-slow` and `make test-other-cpu` finish together.

``--dist loadscope`` hands whole modules to the workers in the order collected, and by default
(without ``--no-loadscope-reorder``, which the Makefile passes) in order of their number of tests: a
module of few but long tests (training runs) then came last and ran alone on one worker while the
other idled. :func:`heaviest_first` puts the modules in the order of the seconds below (longest
first: what a greedy scheduler needs), the rest after them in collection order. Used by
``tests/conftest.py`` in xdist workers only; a serial run keeps the collection order.

The seconds are one module's tests run on a 2-core machine, (not slow, slow): rough, and only their
order matters; a module that grows past ~8 s belongs here.
"""

from __future__ import annotations

from pathlib import Path

#: tests/<module>: (seconds of its tests not marked slow, seconds of its slow tests)
SECONDS = {
    "test_cluster.py": (0, 332),
    "test_resume_methods.py": (0, 123),
    "test_inputs.py": (30, 66),
    "test_reproduce.py": (3, 88),
    "test_padding_free.py": (50, 76),
    "test_generation_backends.py": (15, 10),
    "test_fsdp_cpu.py": (1, 69),
    "test_tiny_bpe.py": (60, 0),
    "test_benchmark_live.py": (59, 0),
    "test_ddp.py": (0, 58),
    "test_resume.py": (1, 56),
    "test_config.py": (55, 0),
    "test_config_roundtrip.py": (52, 0),
    "test_sampler_train.py": (35, 18),
    "test_reward_models_launch.py": (0, 46),
    "test_launch.py": (8, 42),
    "test_bench.py": (16, 33),
    "test_interrupt_eval.py": (47, 0),
    "pins/test_trainer_pins_more.py": (46, 0),
    "test_benchmark_cli.py": (1, 41),
    "test_cli.py": (41, 0),
    "test_recipes.py": (40, 0),
    "test_reward_models.py": (36, 0),
    "pins/test_snapshots.py": (33, 0),
    "test_peers_table.py": (30, 0),
    "test_algo_presets.py": (1, 29),
    "pins/test_trainer_pins.py": (29, 0),
    "test_compare.py": (13, 16),
    "test_probe_surfaces.py": (16, 45),
    "test_token_budget.py": (29, 0),
    "test_ampo.py": (0, 29),
    "test_critic.py": (13, 10),
    "test_methods_i25.py": (23, 0),
    "test_pairs.py": (2, 20),
    "test_engine_correction_trl.py": (22, 0),
    "test_teacher.py": (21, 0),
    "pins/test_objective_pins.py": (19, 0),
    "test_replay.py": (1, 17),
    "test_advantage_runtime.py": (18, 0),
    "test_self_written.py": (40, 0),
    "test_extending.py": (1, 16),
    "test_publish.py": (5, 12),
    "test_benchmark_eval.py": (17, 0),
    "core/test_docs_current.py": (14, 0),
    "test_trust_run_code.py": (14, 0),
    "test_resume_safety.py": (13, 0),
    "test_import_graph.py": (13, 0),
    "test_train_smoke.py": (13, 0),
    "test_recipes_list.py": (11, 0),
    "test_plan.py": (10, 0),
    "test_token_splicing.py": (10, 0),
    "test_rehearsal.py": (10, 0),
    "test_gpu_check.py": (9, 0),
    "test_samples.py": (8, 0),
}


def heaviest_first(items: list, tests_dir: Path) -> None:
    """Reorder ``items`` in place: modules by the seconds of their selected tests (slow or not),
    longest first; the order of the tests within a module, and of the modules not listed, is kept."""
    weight: dict[str, float] = {}
    for item in items:
        try:
            rel = Path(item.fspath).resolve().relative_to(tests_dir).as_posix()
        except ValueError:
            rel = str(item.fspath)
        fast, slow = SECONDS.get(rel, (0, 0))
        part = slow if item.get_closest_marker("slow") else fast
        weight[item.nodeid.split("::")[0]] = max(weight.get(item.nodeid.split("::")[0], 0), part)
    first = {m: i for i, m in enumerate(dict.fromkeys(i.nodeid.split("::")[0] for i in items))}
    items.sort(key=lambda i: (-weight[i.nodeid.split("::")[0]], first[i.nodeid.split("::")[0]]))
