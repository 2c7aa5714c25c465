"""The device under test: activated once per process, read by the generic tests and fixtures."""

from __future__ import annotations

import os

import torch

import accelkit

#: Names the device under test when ``--accelkit-device`` is not given.
DEVICE_ENV = "ACCELKIT_TEST_DEVICE"
DEFAULT_DEVICE = "ref"

_device: torch.device | None = None


def activate(name: str | None = None) -> torch.device:
    """Activate the device under test and return it.

    ``name`` (default: ``$ACCELKIT_TEST_DEVICE``, else ``ref``) is anything
    :func:`accelkit.select_device` takes. Activating again with the same name returns the same
    device; a different one raises :class:`accelkit.BackendConflictError` (one PrivateUse1
    backend per process).
    """
    global _device
    name = name or os.environ.get(DEVICE_ENV) or DEFAULT_DEVICE
    _device = accelkit.select_device(name)
    return _device


def device_under_test() -> torch.device:
    """The device this test session runs on.

    :raises RuntimeError: no device was activated, i.e. the plugin
        ``accelkit.sdk.testing.plugin`` is not loaded in this pytest run.
    """
    if _device is None:
        raise RuntimeError(
            "no accelkit device under test: load the pytest plugin that activates it, "
            "`pytest -p accelkit.sdk.testing.plugin --accelkit-device NAME ...` "
            "(or `pytest_plugins = ['accelkit.sdk.testing.plugin']` in your root conftest.py)"
        )
    return _device


def require_dtype(dtype: torch.dtype) -> None:
    """Skip the calling test when the device under test refuses ``dtype`` by its dtype policy
    (neuron holds no complex tensors); the refusal itself is for the backend's own tests."""
    import pytest

    from accelkit.sdk import UnsupportedDtypeError

    device = device_under_test()
    try:
        torch.empty(0, dtype=dtype, device=device)
    except UnsupportedDtypeError as error:
        pytest.skip(f"{device.type} does not hold {dtype}: {error}")


def holds(dtype: torch.dtype) -> bool:
    """Whether the device under test accepts ``dtype`` (see :func:`require_dtype`)."""
    from accelkit.sdk import UnsupportedDtypeError

    try:
        torch.empty(0, dtype=dtype, device=device_under_test())
    except UnsupportedDtypeError:
        return False
    return True
