"""The pytest plugin that runs tests against one accelkit device.

Not registered automatically (it has no ``pytest11`` entry point, so it never touches a pytest
run that did not ask for it); load it by name::

    pytest -p accelkit.sdk.testing.plugin --pyargs accelkit.sdk.testing.generic --accelkit-device NAME

or with ``pytest_plugins = ["accelkit.sdk.testing.plugin"]`` in a root ``conftest.py``.

When pytest configures, it activates the device under test once for the session:
``--accelkit-device NAME``, else ``$ACCELKIT_TEST_DEVICE``, else ``ref`` (PyTorch has one
PrivateUse1 slot, so one backend per process; run each backend in its own pytest process). It
provides the fixtures

- ``dev``: the device under test (a ``torch.device``), with accelkit's op counters cleared for
  the test (:func:`accelkit.reset_stats`);
- ``no_gc``: earlier tests' garbage collected and the collector off for the test, so memory
  counters move only through the test's own tensors.

Test modules read the device at import time with :func:`accelkit.sdk.testing.device_under_test`.
"""

from __future__ import annotations

import gc

import pytest
import torch

import accelkit
from accelkit.sdk.testing import _device


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("accelkit").addoption(
        "--accelkit-device",
        metavar="NAME",
        default=None,
        help=f"the accelkit device the tests run on (default: ${_device.DEVICE_ENV}, else "
        f"{_device.DEFAULT_DEVICE}); one backend per pytest process",
    )


def pytest_configure(config: pytest.Config) -> None:
    name = config.getoption("accelkit_device")
    try:
        _device.activate(name)
    except accelkit.AccelkitError as error:
        source = "--accelkit-device" if name else f"${_device.DEVICE_ENV} / default"
        raise pytest.UsageError(f"accelkit device under test ({source}): {error}") from error


def pytest_report_header(config: pytest.Config) -> str:
    return f"accelkit device under test: {_device.device_under_test()}"


@pytest.fixture
def dev() -> torch.device:
    """The device under test, with op counters cleared for the test."""
    accelkit.reset_stats()
    return _device.device_under_test()


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
