"""The core's tests run on the ref backend, activated once for the whole session.

One PrivateUse1 backend per process: tests about selection before activation, conflicts and
autoload run in subprocesses (see ``run_python``).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

# A small ref device, so out-of-memory tests stay cheap. Must be set before activation.
os.environ.setdefault("ACCELKIT_REF_MEMORY", "1GiB")

import pytest  # noqa: E402
import torch  # noqa: E402

import accelkit  # noqa: E402

#: The device under test: ref by default; ACCELKIT_TEST_DEVICE=tpu runs the device-generic files
#: (views, printing, training, bad input, outs, edge inputs) against another backend.
DEVICE = accelkit.select_device(os.environ.get("ACCELKIT_TEST_DEVICE", "ref"))


def require_dtype(dtype: torch.dtype) -> None:
    """Skip the calling test when the device under test refuses ``dtype`` by its dtype policy
    (neuron holds no complex tensors); the refusal itself is tested by the backend's tests."""
    from accelkit.sdk import UnsupportedDtypeError

    try:
        torch.empty(0, dtype=dtype, device=DEVICE)
    except UnsupportedDtypeError as error:
        pytest.skip(f"{DEVICE.type} does not hold {dtype}: {error}")


def holds(dtype: torch.dtype) -> bool:
    """Whether the device under test accepts ``dtype`` (see :func:`require_dtype`)."""
    try:
        require_dtype(dtype)
    except pytest.skip.Exception:
        return False
    return True


@pytest.fixture
def dev() -> torch.device:
    """The ref device, with op counters cleared for the test."""
    accelkit.reset_stats()
    return DEVICE


@pytest.fixture
def no_gc():
    """Collect earlier tests' garbage and keep the collector off, so memory counters move only
    through this test's tensors."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 120,
               cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (no backend active) and return the finished process.

    ``cwd``: where it runs (default: here). ``python -c`` puts its working directory first on
    ``sys.path``, so in a source checkout with an editable install its ``accelkit.egg-info`` is
    found before anything on ``PYTHONPATH``.
    """
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELKIT_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )
