"""Several devices per process (``ACCELKIT_<NAME>_DEVICES=2``), on every in-tree backend.

Each backend runs in a fresh process (the checks are in ``multi_device_cases.py``, compared with
the CPU there); this process keeps its one ref device, and shows what one device takes from
the native extension (the hooks) and what it does without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

CASES = Path(__file__).with_name("multi_device_cases.py")


def _run(name: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CASES), name], capture_output=True, text=True, timeout=300,
        env={**os.environ, "ACCELKIT_FALLBACK": "allow", **env},
    )


@pytest.mark.parametrize("name", ["ref", "tpu", "neuron"])
def test_two_devices_in_one_process_behave_as_cuda_devices_do(name):
    result = _run(name, {f"ACCELKIT_{name.upper()}_DEVICES": "2"})
    assert result.returncode == 0, result.stderr[-3000:]
    findings = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(findings) >= 10, findings
    failed = {check: outcome for check, outcome in findings.items() if outcome != "ok"}
    assert not failed, "\n".join(f"{check}:\n{outcome}" for check, outcome in failed.items())


def test_several_devices_without_the_native_extension_is_a_clear_error():
    result = _run("ref", {"ACCELKIT_REF_DEVICES": "2", "ACCELKIT_NATIVE": "off"})
    assert result.returncode != 0
    assert "needs accelkit's native extension" in result.stderr, result.stderr[-2000:]
    assert "ACCELKIT_NATIVE=off" in result.stderr


def test_a_device_count_that_is_no_number_is_refused_by_name():
    result = _run("ref", {"ACCELKIT_REF_DEVICES": "two"})
    assert result.returncode != 0
    assert "ACCELKIT_REF_DEVICES='two'" in result.stderr, result.stderr[-2000:]


def test_one_device_uses_the_native_hooks_and_keeps_the_python_guard(dev):
    from accelkit import _native

    assert _native.loaded() is not None  # its PrivateUse1 hooks give pinned host memory
    assert getattr(torch, dev.type).device_count() == 1
    assert torch.accelerator.device_count() == 1
    assert torch.ones(2).pin_memory().is_pinned()


def test_one_device_without_the_native_extension_runs_and_only_pinning_fails():
    script = (
        "import torch, accelkit\n"
        "dev = accelkit.select_device('ref')\n"
        "x = torch.ones(3, device=dev, requires_grad=True)\n"
        "(x * 2).sum().backward()\n"
        "assert torch.equal(x.grad.cpu(), torch.full((3,), 2.0))\n"
        "assert not torch.ones(2).is_pinned()\n"
        "try:\n"
        "    torch.ones(2).pin_memory()\n"
        "except NotImplementedError as exc:\n"
        "    print('refused:', exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "ACCELKIT_NATIVE": "off"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "refused:" in result.stdout and "getPinnedMemoryAllocator" in result.stdout, result.stdout


def test_the_native_extension_reports_its_state_from_the_command_line():
    result = subprocess.run([sys.executable, "-m", "accelkit", "native", "status"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(("built", "not built yet", "off")), result.stdout
