"""Running PyTorch's own device-generic test files (the ``upstream`` suite).

A PyTorch checkout's ``test/`` files instantiate their test classes per device type with
``instantiate_device_type_tests``; the backend takes part as ``PrivateUse1TestBase`` when it is
activated before ``common_device_type`` is first imported (the plugin activates it at
configure time) and ``PYTORCH_TESTING_DEVICE_ONLY_FOR`` names it (the runner sets it), so only
its instantiations run. Records use normalised names (:func:`accelkit_conformance.cases.upstream_case`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: Decorators that keep a test from running on a PrivateUse1 device; the bypass makes them no-ops.
RESTRICTIONS = ("onlyCUDA", "onlyNativeDeviceTypes", "onlyCUDAAndPRIVATEUSE1", "onlyOn")


def bypass_device_restrictions() -> list[str]:
    """Make PyTorch's device-restriction decorators pass every test through, before any test
    file imports them; returns the names replaced. ``onlyCPU`` stays: it marks CPU semantics."""
    import torch.testing._internal.common_device_type as cdt

    def passes_through(*args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used bare: @onlyCUDA
        return lambda fn: fn  # used with arguments: @onlyOn(["cuda"])

    replaced = []
    for name in RESTRICTIONS:
        if hasattr(cdt, name):
            setattr(cdt, name, passes_through)
            replaced.append(name)
    return replaced


def test_files(directory: Path, names: str | None) -> list[Path]:
    """The test files to run from a PyTorch ``test/`` directory: ``names`` (comma-separated,
    relative to it), or every ``test_*.py`` directly in it.

    :raises ValueError: the directory or a named file does not exist (the message names it).
    """
    if not directory.is_dir():
        raise ValueError(f"--pytorch-tests {directory}: no such directory (point it at a PyTorch checkout's test/)")
    if not names:
        found = sorted(directory.glob("test_*.py"))
        if not found:
            raise ValueError(f"--pytorch-tests {directory}: no test_*.py files in it")
        return found
    files = [directory / name.strip() for name in names.split(",") if name.strip()]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ValueError(f"--files: no such test file: {', '.join(missing)}")
    return files
