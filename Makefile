# mixrl developer entry points. Two commands set everything up on a fresh machine:
#   make demo   # virtual environment + install + `mixrl train` on the embedded default
#   make test   # virtual environment + test dependencies + the test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install demo test test-fast tiny docs clean

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

test: install
	$(BIN)/python -m pytest

test-fast: install
	$(BIN)/python -m pytest -m "not slow"

tiny: install
	$(BIN)/mixrl model build-tiny

docs: install
	$(BIN)/python -m mixrl.core.docs > docs/components.md
	$(BIN)/python -m mixrl.methods > docs/methods.md

clean:
	rm -rf $(VENV) runs outputs multirun .pytest_cache
