"""Shared fixtures. Tests run offline on CPU; the tiny model is warm-started for a few
steps into a per-session cache so that training smoke tests take seconds."""

from __future__ import annotations

import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before any test imports torch

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

#: folders whose every test compares floats with pinned or hand-computed values (`make test-other-cpu`
#: collects these folders only: keep its EXACT_PATHS in step)
EXACT_DIRS = ("pins", "core")
#: modules of EXACT_DIRS that compare text no CPU kernel computes (the printed plan/explain/config
#: snapshots, the generated components page): not ``exact``, so `make test-other-cpu` does not redo them
NOT_KERNEL_BOUND = ("pins/test_snapshots.py", "core/test_docs_current.py")


def pytest_collection_modifyitems(config, items):
    """Mark the tests of EXACT_DIRS ``exact``: `make test-other-cpu` runs them under a CPU kernel
    set other than this machine's best, so a value that only one kind of CPU reproduces fails CI."""
    here = Path(__file__).resolve().parent
    for item in items:
        try:
            rel = Path(item.fspath).resolve().relative_to(here)
        except ValueError:
            continue
        if rel.parts[0] in EXACT_DIRS and rel.as_posix() not in NOT_KERNEL_BOUND:
            item.add_marker(pytest.mark.exact)
    import importlib.util

    if importlib.util.find_spec("vllm") is None:  # `make test-vllm` runs these in .venv-vllm
        skip = pytest.mark.skip(reason="vLLM is not installed (make test-vllm installs its CPU build in .venv-vllm)")
        for item in items:
            if "vllm" in item.keywords:
                item.add_marker(skip)


class _HeaviestFirst:
    @pytest.hookimpl(trylast=True)  # after `-m` has deselected: the order of the tests that run
    def pytest_collection_modifyitems(self, items):
        from module_costs import heaviest_first

        heaviest_first(items, Path(__file__).resolve().parent)


def pytest_configure(config):
    if os.environ.get("MIXRL_TOLERANCE_RECORD"):  # `make tolerances`: record every numeric assertion's values
        import tolerance_record

        tolerance_record.configure(config)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the heaviest modules first, so both workers finish together
        config.pluginmanager.register(_HeaviestFirst(), "mixrl-heaviest-first")

#: overrides that make a training run take seconds: used by every smoke test
FAST = [
    "trainer.max_steps=2",
    "trainer.prompts_per_step=4",
    "algo.num_generations=4",
    "trainer.micro_batch_size=8",
    "trainer.eval_size=8",
    "trainer.max_completion_length=24",
    "data.train_size=64",
    "logger.progress=false",
    "hardware.torch_threads=1",
]


class ModelLoaded(AssertionError):
    """Raised by :func:`fail_model_loading`: a test of a refusal loaded a model first."""


def fail_model_loading(*args, **kwargs):
    """Patched over model loading by tests whose refusals must come before any model loads."""
    raise ModelLoaded("a model was loaded before the error was reported")


def _run_cache(tmp_path_factory, name: str):
    """``(folder, lock)`` for a model built once per test run: in the folder that every pytest-xdist
    worker of the run shares (the parent of the workers' own base folders), so that the second
    worker waits for the first one's build (about 6 CPU-s for the tiny model, 4 for the BPE one)
    and loads it instead of building its own."""
    import fcntl
    from contextlib import contextmanager

    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "run-cache" / name
    folder.mkdir(parents=True, exist_ok=True)

    @contextmanager
    def lock():
        with open(folder / ".lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
            yield

    return folder, lock


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> str:
    """A tiny model warm-started for 10 steps (seconds), saved in HF format; one build per test run."""
    from mixrl.models import tiny

    folder, lock = _run_cache(tmp_path_factory, "tiny")
    with lock():
        return str(tiny.warm_start(folder, steps=10, progress=False))


@pytest.fixture(scope="session")
def tiny_bpe_model_path(tmp_path_factory) -> str:
    """The BPE chat model (mixrl.models.tiny_bpe) warm-started for 10 steps (seconds), saved in HF format;
    one build per test run."""
    from mixrl.models import tiny_bpe

    folder, lock = _run_cache(tmp_path_factory, "tiny-bpe")
    with lock():
        return str(tiny_bpe.warm_start(folder, steps=10, progress=False))


#: a warm start of at least this many steps is a built-in model's full recipe (the student 300 steps,
#: the teachers 600: 60-130 CPU-s), trained when the machine's cache lacks it, as on a fresh CI machine
FULL_WARM_START_STEPS = 100


@pytest.fixture(scope="session", autouse=True)
def _warn_on_full_warm_starts():
    """Warn, naming the test, when a test trains a built-in model at its full recipe (``teacher=tiny``,
    ``model.path=builtin:tiny``, ...): on a machine with a warm cache it costs nothing, on a fresh one
    minutes of `make test`. A test that needs a model uses conftest's (10 steps, 8 for the teacher)."""
    from mixrl.models import supervised

    original = supervised.train_supervised

    def train_supervised(*args, **kwargs):
        steps = kwargs.get("steps", 0)
        if steps >= FULL_WARM_START_STEPS:
            import warnings

            test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]
            warnings.warn(f"{test} warm-starts a built-in model for {steps} steps (its full recipe): "
                          "name a small one (conftest's tiny_model_path, tiny_teacher_path, ...)", stacklevel=2)
        return original(*args, **kwargs)

    supervised.train_supervised = train_supervised
    yield
    supervised.train_supervised = original


@pytest.fixture(scope="session")
def tiny_teacher_path(tmp_path_factory) -> str:
    """A tiny teacher warm-started for 8 steps (seconds): the test student's tokenizer, other weights. A
    test that only needs *a* teacher names it (``teacher.source.models=[...]``): ``teacher=tiny``, the
    built-in teacher, is 600 steps, trained on first use on a machine whose cache lacks it."""
    from mixrl.models import tiny

    folder, lock = _run_cache(tmp_path_factory, "tiny-teacher")
    with lock():
        return str(tiny.teacher_warm_start(folder, steps=8, progress=False))


@pytest.fixture
def fast_overrides(tiny_model_path, tmp_path) -> list[str]:
    """FAST plus the test model and a fresh run directory."""
    return [*FAST, f"model.path={tiny_model_path}", f"run_dir={tmp_path / 'run'}"]


def sigkill_once_written(json_file: Path, proc, poll_s: float = 0.005) -> None:
    """SIGKILL ``proc`` as soon as ``json_file`` holds complete JSON (or when ``proc`` ends). A
    checkpoint's ``trainer_state.json`` is written last, so this kills right after a complete
    checkpoint; waiting only for the file to *exist* could kill while it is still empty."""
    import json
    import signal

    while proc.poll() is None:
        try:
            json.loads(json_file.read_text())
            break
        except (OSError, ValueError):
            time.sleep(poll_s)
    proc.send_signal(signal.SIGKILL)
