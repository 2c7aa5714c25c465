"""The backend contract: every hook a device backend may implement.

A backend is a plugin module (or object) registered through the entry-point group
``accelkit.backends``. It announces itself with :func:`accelkit_register_backend`; every other
hook takes the backend's ``name`` and is called on the plugin that announced that name only.
Loading a plugin registers it; it never opens a device.

Hook kinds, stated on each spec:

- *firstresult*: "who provides X" — the first non-``None`` answer wins.
- *1:N*: every plugin answers; the results are collected in a list. A per-backend 1:N hook
  (``accelkit_stats``, ...) is called on the owning plugin only, so the list has one answer.

A backend that leaves out an optional hook (compiler, collectives, ...) is reported as
"not supported" for that area; the runtime never crashes on a missing hook.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    import torch

    from accelkit.sdk import (
        AutocastPolicy,
        BackendInfo,
        DeviceAllocator,
        DeviceModel,
        DeviceProbe,
        DtypeRules,
        Expectations,
        KernelTable,
    )

hookspec = pluggy.HookspecMarker("accelkit")


# ---------------------------------------------------------------------------------------------
# Discovery
# ---------------------------------------------------------------------------------------------


@hookspec
def accelkit_register_backend() -> BackendInfo | None:
    """Announce a backend: its name, selection priority and defaults.

    1:N — every plugin answers; a plugin that hosts no backend returns ``None``. Must be cheap:
    no device is opened and no heavy library is imported here.

    :returns: the backend's :class:`accelkit.sdk.BackendInfo`.

    Implemented by: backends. Called by the core once, when plugins are loaded.
    """


@hookspec(firstresult=True)
def accelkit_probe(name: str) -> DeviceProbe | None:
    """Tell whether the backend ``name`` can run here, on real hardware or simulated.

    Stops at first non-``None`` result. Called once per process, before selection and by
    ``accelkit devices``; it may look for hardware but must not allocate device memory. Raising
    is allowed: the core records the exception as the reason the backend is unavailable.

    :param name: the backend's name.
    :returns: a :class:`accelkit.sdk.DeviceProbe` (available, simulated, device count, reason).
    """


# ---------------------------------------------------------------------------------------------
# Device
# ---------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def accelkit_device_model(name: str) -> DeviceModel | None:
    """Describe the target the backend runs as: capacity, bandwidth, peak FLOPs, dtypes.

    Stops at first non-``None`` result. The returned record is data with a source per figure;
    it backs ``torch.<name>.get_device_properties()`` and the allocator's capacity.

    :param name: the backend's name.
    :returns: a :class:`accelkit.sdk.DeviceModel`.
    """


@hookspec
def accelkit_backend_activated(name: str, device: torch.device) -> None:
    """React to ``name`` becoming this process's PrivateUse1 device.

    1:N, called on the owning plugin only. The place for lazy initialisation that must not
    happen at load time (opening a PJRT client, say). It runs after PrivateUse1 is taken: if it
    raises, the activation fails and no backend can be activated in this process.

    :param name: the activated backend.
    :param device: ``torch.device(name, 0)``.
    """


# ---------------------------------------------------------------------------------------------
# Allocator / buffers
# ---------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def accelkit_make_allocator(name: str, device_model: DeviceModel) -> DeviceAllocator | None:
    """Create the allocator that owns the backend's device memory.

    Stops at first non-``None`` result. Required for a backend to be activated. The allocator
    subclasses :class:`accelkit.sdk.DeviceAllocator`, which adds caching, statistics and the
    capacity check (``torch.OutOfMemoryError``) around the backend's raw primitives.

    :param name: the backend's name.
    :param device_model: the record from :func:`accelkit_device_model`; its ``memory_bytes`` is
        the capacity.
    """


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def accelkit_kernels(name: str) -> KernelTable | None:
    """Return the backend's native kernels, keyed by aten overload.

    Stops at first non-``None`` result; ``None`` means no native kernels (everything goes
    through decompositions and the CPU fallback). Kernels compute on backend arrays, never on
    torch tensors; the runtime derives in-place and ``out=`` variants of functional kernels.
    """


@hookspec(firstresult=True)
def accelkit_decompositions(name: str) -> Mapping[Any, Callable] | None:
    """Return the decompositions the runtime may use for ops without a native kernel.

    Stops at first non-``None`` result; ``None`` means the runtime default,
    :func:`accelkit.sdk.default_decompositions` (PyTorch's core-ATen decomposition table).
    Return an empty mapping to disable decomposition.
    """


@hookspec(firstresult=True)
def accelkit_dtype_rules(name: str) -> DtypeRules | None:
    """State which dtypes the device holds and what happens to the others.

    Stops at first non-``None`` result; ``None`` means every dtype is supported. The runtime
    enforces the rules when device memory is allocated, so an unsupported dtype fails with a
    message naming it and the fix, and never silently changes results.
    """


@hookspec(firstresult=True)
def accelkit_autocast_policy(name: str) -> AutocastPolicy | None:
    """Return the lower-precision policy for ``torch.autocast(<name>)``.

    Stops at first non-``None`` result; ``None`` means :data:`accelkit.sdk.CUDA_LIKE_AUTOCAST`
    (matmul/linear/conv/bmm/baddbmm in the low dtype, reductions and losses in float32).
    """


# ---------------------------------------------------------------------------------------------
# Compiler
# ---------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def accelkit_make_compiler(name: str) -> Callable | None:
    """Return a ``torch.compile`` backend for graphs on this device.

    Stops at first non-``None`` result; ``None`` means compilation is not supported on this
    backend (reported as such; ``torch.compile(backend=name)`` then fails with that message).
    Called at activation, so it must be cheap: import compiler machinery inside the returned
    callable. The callable has the ``torch.compile`` backend signature
    ``(gm, example_inputs) -> callable``. For ``backend="<name>"`` to resolve, the backend's
    package declares ``<name> = "accelkit._runtime._compiler:<name>"`` in the entry-point
    group ``torch_dynamo_backends``.
    """


# ---------------------------------------------------------------------------------------------
# Collectives
# ---------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def accelkit_make_process_group(
    name: str, store: Any, rank: int, world_size: int, timeout: Any
) -> Any | None:
    """Create a c10d process group for tensors on this device.

    Stops at first non-``None`` result; ``None`` means collectives are not supported on this
    backend. The returned object is a ``torch.distributed.ProcessGroup`` implementing
    allreduce, allgather, reduce_scatter, broadcast, all_to_all and barrier.
    """


# ---------------------------------------------------------------------------------------------
# Conformance and reporting
# ---------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def accelkit_conformance_expectations(name: str) -> Expectations | None:
    """Declare what the backend knowingly does not support, each entry with a reason.

    Stops at first non-``None`` result; ``None`` means no declared gaps. The conformance suite
    turns each entry into a declared skip or expected failure.
    """


@hookspec
def accelkit_stats(name: str) -> dict[str, Any] | None:
    """Contribute backend-specific sections to :func:`accelkit.stats`.

    1:N, called on the owning plugin only: it may return a dict merged into the stats under its
    keys (compile-cache counts, estimated device time, ...).
    """


@hookspec
def accelkit_reset_stats(name: str) -> None:
    """Zero the backend-specific statistics contributed by :func:`accelkit_stats`.

    1:N, called by :func:`accelkit.reset_stats` on the owning plugin only.
    Compile caches are not statistics and stay.
    """
