"""accelkit: one accelerator layer for PyTorch.

    dev = accelkit.select_device()            # or select_device("tpu"), ACCELKIT_DEVICE=neuron
    model.to(dev); loss = model(x.to(dev)); loss.backward()
    step = torch.compile(model, backend=dev.type)  # one program per captured graph

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
    PluginError,
    UnknownDeviceError,
)
from accelkit.hookspecs import hookimpl
from accelkit._buckets import bucketed
from accelkit._policy import fallback_policy
from accelkit._scaling import ScalingPlan, ScalingProjection, project_scaling
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
    "PluginError",
    "UnknownDeviceError",
    "active_backend",
    "bucketed",
    "devices",
    "explain_selection",
    "fallback_policy",
    "hookimpl",
    "ScalingPlan",
    "ScalingProjection",
    "project_scaling",
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

    :returns: the backend names it announced. Entry-point plugins are loaded first.
    :raises BackendConflictError: the name is already taken (an installed or earlier registered
        backend keeps it) or is a PyTorch device type; the message names both plugins.
    :raises PluginError: the plugin raised while registering or announcing itself.
    """
    from accelkit._plugins import registry

    reg = registry()
    reg.load_entry_points()
    return reg.register(plugin)


def stats() -> dict[str, Any]:
    """Execution and memory statistics of the active backend.

    Keys: ``backend``, ``fallback_policy``, ``ops`` (per aten overload: native, decomposed and
    fallback executions), ``totals``, ``cpu_by_design`` (the ops among ``ops`` that took the
    CPU fallback because the backend declared them CPU by design: their fallback count and the
    backend's reason; they stay counted as fallbacks), ``memory`` (the allocator's statistics), ``compile``
    (what ``torch.compile(backend=<name>)`` captured, compiled and reused; see
    ``docs/compile.md``), ``distributed`` (collectives per kind: calls, bytes, host seconds and
    the estimated seconds on the target's interconnect; see ``docs/distributed.md``),
    ``estimate`` (the backend's estimated device time on its target, an
    :class:`accelkit.sdk.Estimate` as a dict, or ``None``: ``accelkit_estimate`` hook), plus
    sections the backend contributes (``accelkit_stats`` hook).

    :raises PluginError: the backend's ``accelkit_stats`` hook raised or returned a non-dict, or
        its ``accelkit_estimate`` hook raised or returned something else than an ``Estimate``.
    """
    from accelkit import _runtime
    from accelkit._plugins import registry
    from accelkit._stats import KINDS
    from accelkit.sdk import Estimate

    ctx = _runtime.active()
    if ctx is None:
        return {"backend": None, "fallback_policy": None, "ops": {}, "totals": dict.fromkeys(KINDS, 0),
                "cpu_by_design": {}, "memory": {}}
    ops = ctx.counters.snapshot()
    result: dict[str, Any] = {
        "backend": ctx.name,
        "fallback_policy": ctx.fallback_policy,
        "ops": ops,
        "totals": ctx.counters.totals(),
        "cpu_by_design": _runtime.cpu_by_design_calls(ctx, ops),
        "memory": ctx.allocator.memory_stats(),
        "compile": _runtime.compile_stats(ctx),
        "distributed": _runtime.distributed_stats(),
    }
    record = registry().get(ctx.name)
    for section in record.call("accelkit_stats", name=ctx.name):
        if section is not None and not isinstance(section, dict):
            raise PluginError(
                f"plugin {record.origin}: accelkit_stats returned {type(section).__name__}, not dict"
            )
        result.update(section or {})
    estimate = record.answer("accelkit_estimate", Estimate)
    result["estimate"] = estimate.as_dict() if estimate is not None else None
    return result


def reset_stats() -> None:
    """Zero the op counters, the memory peaks and the backend's own statistics.

    :raises PluginError: the backend's ``accelkit_reset_stats`` hook raised (the counters and
        peaks are zeroed first).
    """
    from accelkit import _runtime
    from accelkit._plugins import registry

    ctx = _runtime.active()
    if ctx is not None:
        ctx.counters.reset()
        ctx.allocator.reset_peak_stats()
        _runtime.reset_compile_stats()
        _runtime.reset_distributed_stats()
        registry().get(ctx.name).call("accelkit_reset_stats", name=ctx.name)


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("accelkit")
    raise AttributeError(f"module 'accelkit' has no attribute {name!r}")
