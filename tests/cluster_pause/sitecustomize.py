"""Test-only fault injection for ``tests/test_cluster.py``: on this folder's PYTHONPATH, with
``STEP_PAUSE_DIR`` set, every process that imports ``mixrl.trainer.grpo`` gets a trainer whose
first micro-batch of step ``STEP_PAUSE_AT`` writes ``STEP_PAUSE_DIR/rank<RANK>-step<k>`` (its pid)
and sleeps ``STEP_PAUSE_S`` seconds: a signal the test sends then lands in the middle of that step.
Nothing of mixrl changes; without ``STEP_PAUSE_DIR`` this file does nothing."""

import importlib.abc
import importlib.util
import os
import sys
import time

TARGET = "mixrl.trainer.grpo"


def _patch(module) -> None:
    cls = module.MixrlGRPOTrainer
    original = cls.training_step
    at, pause_s, folder = int(os.environ.get("STEP_PAUSE_AT", "2")), float(os.environ.get("STEP_PAUSE_S", "8")), os.environ["STEP_PAUSE_DIR"]
    paused = set()

    def training_step(self, *args, **kwargs):
        step = int(self.state.global_step) + 1
        if step == at and step not in paused:
            paused.add(step)
            path = os.path.join(folder, f"rank{os.environ.get('RANK', '0')}-step{step}")
            with open(path + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace(path + ".tmp", path)
            time.sleep(pause_s)
        return original(self, *args, **kwargs)

    cls.training_step = training_step


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("STEP_PAUSE_DIR"):
    sys.meta_path.insert(0, _Finder())
