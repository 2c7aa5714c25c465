# Quick start: `make demo` runs the main job, `make test` runs the tests.
# Each target creates the virtual environment it needs (.venv) on first use.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# The demo's device; any accelkit name or preference list works, e.g. `make demo ACCELKIT_DEVICE=tpu,cpu`.
ACCELKIT_DEVICE ?= ref
export ACCELKIT_DEVICE

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/train_mlp.py

test: $(STAMP)
	env -u ACCELKIT_DEVICE $(BIN)/python -m pytest

bench: $(STAMP)
	env -u ACCELKIT_DEVICE $(BIN)/python bench/bench_ops.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
