"""accelkit: one accelerator layer for PyTorch.

    dev = accelkit.select_device()            # or select_device("tpu"), ACCELKIT_DEVICE=neuron
    model.to(dev); loss = model(x.to(dev)); loss.backward()

Backend authors start at :mod:`accelkit.sdk` and :mod:`accelkit.hookspecs`.
"""

from __future__ import annotations

from typing import Any

# torch first: `import torch` runs accelkit's autoload entry point, which needs accelkit's
# submodules. Importing torch here, before them, keeps that from meeting a half-imported package.
import torch  # noqa: F401

from accelkit import _runtime
from accelkit._errors import (
    AccelkitError,
    BackendConflictError,
    DeviceUnavailableError,
    FallbackDeniedError,
    UnknownDeviceError,
)
from accelkit._plugins import hookimpl
from accelkit._policy import fallback_policy
from accelkit._selection import DeviceReport, devices, explain_selection, select_device

# Before anything can run a backward(): PyTorch's autograd engine only serves devices whose guard
# it knows at its first backward (see _runtime.register_device_guard).
_runtime.register_device_guard()

__all__ = [
    "AccelkitError",
    "BackendConflictError",
    "DeviceReport",
    "DeviceUnavailableError",
    "FallbackDeniedError",
    "UnknownDeviceError",
    "active_backend",
    "devices",
    "explain_selection",
    "fallback_policy",
    "hookimpl",
    "register_backend",
    "reset_stats",
    "select_device",
    "stats",
]


def active_backend() -> str | None:
    """The name of this process's active PrivateUse1 backend, or None."""
    from accelkit import _runtime

    ctx = _runtime.active()
    return ctx.name if ctx else None


def register_backend(plugin: object) -> list[str]:
    """Register a backend plugin object in this process (instead of an entry point).

    :returns: the backend names it announced. Entry-point plugins are loaded first, so a
        name clash with an installed backend is an error.
    """
    from accelkit._plugins import registry

    reg = registry()
    reg.load_entry_points()
    return reg.register(plugin)


def stats() -> dict[str, Any]:
    """Execution and memory statistics of the active backend.

    Keys: ``backend``, ``fallback_policy``, ``ops`` (per aten overload: native, decomposed and
    fallback executions), ``totals``, ``memory`` (the allocator's statistics), plus sections
    the backend contributes (``accelkit_stats`` hook).
    """
    from accelkit import _runtime
    from accelkit._plugins import registry
    from accelkit._stats import KINDS

    ctx = _runtime.active()
    if ctx is None:
        return {"backend": None, "fallback_policy": None, "ops": {}, "totals": dict.fromkeys(KINDS, 0), "memory": {}}
    result: dict[str, Any] = {
        "backend": ctx.name,
        "fallback_policy": ctx.fallback_policy,
        "ops": ctx.counters.snapshot(),
        "totals": ctx.counters.totals(),
        "memory": ctx.allocator.memory_stats(),
    }
    for section in registry().pm.hook.accelkit_stats(name=ctx.name):
        if section:
            result.update(section)
    return result


def reset_stats() -> None:
    """Zero the op counters, the memory peaks and the backend's own statistics."""
    from accelkit import _runtime

    from accelkit._plugins import registry

    ctx = _runtime.active()
    if ctx is not None:
        ctx.counters.reset()
        ctx.allocator.reset_peak_stats()
        registry().pm.hook.accelkit_reset_stats(name=ctx.name)


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("accelkit")
    raise AttributeError(f"module 'accelkit' has no attribute {name!r}")
