"""The tpu backend's tests: the tpu device is activated once for the whole session.

One PrivateUse1 backend per process, so these run in their own pytest process
(``pytest backends/tpu/tests``), apart from the core's tests in ``tests/`` (which run on ref).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import accelkit

DEVICE = accelkit.select_device("tpu")


@pytest.fixture
def dev() -> torch.device:
    """The tpu device, with op counters cleared for the test."""
    accelkit.reset_stats()
    return DEVICE


def on_device(value, dev):
    """``value`` on ``dev`` (a copy, also when ``dev`` is where it already is) with the same
    geometry: a view is re-made from a copy of its base."""
    if isinstance(value, torch.Tensor):
        if value._base is not None:
            base = value._base.to(dev, copy=True)
            return base.as_strided(value.shape, value.stride(), value.storage_offset())
        return value.to(dev, copy=True)
    if isinstance(value, list | tuple):
        return type(value)(on_device(v, dev) for v in value)
    return value


def sample(shape, dtype=torch.float32, seed=0, low=-5, high=6):
    """Reproducible input: normal floats, integers in ``[low, high)`` (with ties), random booleans."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(low, high, shape, generator=g, dtype=dtype)


@contextlib.contextmanager
def host_peak_growth(limit_bytes: int):
    """Fail when the process's peak resident memory grows by more than ``limit_bytes`` inside
    the block (Linux: the peak is reset through ``/proc/self/clear_refs`` first)."""
    def peak() -> int:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))

    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        pytest.skip("resetting the peak resident memory needs Linux's /proc/self/clear_refs")
    before = peak()
    yield
    grown = peak() - before
    assert grown <= limit_bytes, f"the host's peak memory grew by {grown / 2**30:.2f} GiB"


def assert_native(*names):
    """Each named op ran natively at least once and never on the CPU fallback."""
    ops = accelkit.stats()["ops"]
    for name in names:
        counts = ops.get(name, {})
        assert counts.get("native", 0) > 0, f"{name} did not run natively: {counts}"
        assert counts.get("fallback", 0) == 0, f"{name} fell back to the CPU: {counts}"


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (no backend active) and return the finished process."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELKIT_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env,
                          capture_output=True, text=True, timeout=timeout)
