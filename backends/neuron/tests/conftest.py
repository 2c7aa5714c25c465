"""The neuron backend's tests: the neuron device is activated once for the whole session.

One PrivateUse1 backend per process, so these run in their own pytest process
(``pytest backends/neuron/tests``), apart from the core's tests (ref) and tpu's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import accelkit

DEVICE = accelkit.select_device("neuron")


@pytest.fixture
def dev() -> torch.device:
    """The neuron device, with op counters and estimates cleared for the test."""
    accelkit.reset_stats()
    return DEVICE


def assert_native(*names):
    """Each named op ran natively at least once and never on the CPU fallback."""
    ops = accelkit.stats()["ops"]
    for name in names:
        counts = ops.get(name, {})
        assert counts.get("native", 0) > 0, f"{name} did not run natively: {counts}"
        assert counts.get("fallback", 0) == 0, f"{name} fell back to the CPU: {counts}"


def assert_decomposed(*names):
    """Each named op ran as its decomposition at least once and never on the CPU fallback. A
    name is an overload (``"aten.mode.default"``) or an op (``"aten.mode"``: any of its
    overloads, since a functional form may run as its ``out=`` one)."""
    ops = accelkit.stats()["ops"]
    for name in names:
        whole_op = name.count(".") == 1
        counts = {op: c for op, c in ops.items() if (op.startswith(name + ".") if whole_op else op == name)}
        assert sum(c.get("decomposed", 0) for c in counts.values()) > 0, f"{name} was not decomposed: {counts}"
        assert not any(c.get("fallback") for c in counts.values()), f"{name} fell back to the CPU: {counts}"


@pytest.fixture
def deny_fallback():
    """A CPU fallback raises for the test (use: ``pytestmark = pytest.mark.usefixtures("deny_fallback")``)."""
    with accelkit.fallback_policy("deny"):
        yield


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (no backend active) and return the finished process."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELKIT_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env,
                          capture_output=True, text=True, timeout=timeout)
