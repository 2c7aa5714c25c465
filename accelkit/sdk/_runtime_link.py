"""The one module through which the SDK reaches the runtime (``accelkit._runtime``).

The runtime imports the SDK when it loads, so every import of the runtime here happens inside a
function, at the call. Keeping them in one place shows what the SDK's facade rests on, and lets
the runtime move inside its package without the SDK's public modules noticing.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any


def active_context() -> Any:
    """The active backend's context, or None before activation."""
    from accelkit import _runtime

    return _runtime.active()


def require_context(what: str) -> Any:
    """The active backend's context.

    :raises accelkit.AccelkitError: no backend is active; the message says ``what`` needs one.
    """
    from accelkit._errors import AccelkitError

    ctx = active_context()
    if ctx is None:
        raise AccelkitError(f"{what} needs an active backend: call accelkit.select_device() first")
    return ctx


def register_kernel(op: Any, fn: Callable[..., Any]) -> None:
    from accelkit import _runtime

    _runtime.register_kernel(op, fn)


def reserve_draw(ctx: Any, count: int) -> Any:
    from accelkit._runtime.device.random import reserve

    return reserve(ctx, None, count)


def op_paths() -> dict[str, dict[str, str]]:
    from accelkit._runtime.dispatch.coverage import op_paths as paths

    return paths()


def cpu_equivalent(op: Any) -> Any:
    """The CPU op the runtime runs in ``op``'s place (same geometry), or ``op`` itself."""
    from accelkit._runtime.dispatch.fallback import CPU_EQUIVALENTS

    return CPU_EQUIVALENTS.get(op, op)


def compiler_for(name: str) -> Callable[..., Any]:
    from accelkit._runtime.compile.compiler import compiler_for as find

    return find(name)


def graph_compiler(lowering: Any) -> Callable[..., Any]:
    from accelkit._runtime.compile.graph_compiler import GraphCompiler

    return GraphCompiler(lowering)


def fallback_policy_from_env(default: str) -> str:
    from accelkit._runtime.device.context import policy_from_env

    return policy_from_env(default)


def host_staged_group(store: Any, rank: int, world_size: int, timeout: timedelta) -> Any:
    from accelkit._runtime.distributed.process_group import HostStagedProcessGroup

    ctx = require_context("a host-staged process group")
    return HostStagedProcessGroup(store, rank, world_size, timeout, device_type=ctx.name)
