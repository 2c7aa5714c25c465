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
	$(BIN)/pip install --quiet -e '.[test,tpu]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/train_mlp.py

# One process per backend (PyTorch has one PrivateUse1 slot): the core's tests on ref, the
# device-generic ones again on tpu, then the tpu backend's own tests.
GENERIC_TESTS := tests/test_views.py tests/test_printing.py tests/test_training.py

test: $(STAMP)
	env -u ACCELKIT_DEVICE $(BIN)/python -m pytest tests
	env -u ACCELKIT_DEVICE ACCELKIT_TEST_DEVICE=tpu ACCELKIT_TPU_FLOAT64=emulate $(BIN)/python -m pytest $(GENERIC_TESTS)
	env -u ACCELKIT_DEVICE $(BIN)/python -m pytest backends/tpu/tests

bench: $(STAMP)
	env -u ACCELKIT_DEVICE $(BIN)/python bench/bench_ops.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
