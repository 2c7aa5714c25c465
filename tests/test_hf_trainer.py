"""Hugging Face ``Trainer`` with its default arguments on tpu and neuron, against the CPU.

The defaults pin host memory (``dataloader_pin_memory=True``) and, between runs, ask
``torch.accelerator`` to empty the device's cache (accelerate's ``free_memory``): both failed on
accelkit devices before. Each run is a fresh process (one PrivateUse1 backend per process),
``hf_trainer_run.py``; float32 losses must equal the CPU's within float32 tolerance.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

RUN = Path(__file__).with_name("hf_trainer_run.py")


def _train(name: str) -> dict:
    result = subprocess.run([sys.executable, str(RUN), name], capture_output=True, text=True, timeout=600,
                            env={k: v for k, v in os.environ.items() if k != "ACCELKIT_DEVICE"})
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def cpu_run() -> dict:
    run = _train("cpu")
    assert run["device"] == "cpu" and len(run["losses"]) == 4
    return run


@pytest.mark.parametrize("name", ["tpu", "neuron"])
def test_trainer_with_default_arguments_matches_the_cpu(name, cpu_run):
    run = _train(name)
    assert run["pin_memory"] is True
    assert run["device"] == f"{name}:0"
    assert run["batches_on_device"] == [True] * 4
    assert run["losses"] == pytest.approx(cpu_run["losses"], rel=1e-5, abs=1e-6)
