"""What a backend may ask of the runtime once it is active: its device model, the device
generator, kernels registered after activation, and the Meta geometry of an op."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from accelkit.sdk._records import DeviceModel
from accelkit.sdk.random_stream import RandomDraw


from accelkit.sdk import _runtime_link as runtime

_context = runtime.require_context


def active_backend() -> str | None:
    """The name of this process's active backend, or ``None`` before activation."""
    ctx = runtime.active_context()
    return None if ctx is None else ctx.name


def active_device_model() -> DeviceModel:
    """The active backend's device model (the record its ``accelkit_device_model`` returned).

    :raises accelkit.AccelkitError: no backend is active.
    """
    return _context("the device model").model


def device_generator() -> Any:
    """The active device's default random generator, the one ``torch.manual_seed`` and
    ``torch.<name>.manual_seed`` seed; random kernels draw from it when the op gets none (a
    Philox state: ``get_state()`` is 16 bytes, see :mod:`accelkit.sdk.random_stream`).

    :raises accelkit.AccelkitError: no backend is active.
    """
    return _context("the device generator").generator


def device_draw(count: int) -> RandomDraw:
    """The counters a random op that takes no generator argument (``native_dropout``) draws from
    the device generator: ``count`` of them (one per element of its random result); the
    generator's offset advances past them. Ops with a generator argument get their draw from the
    runtime in that argument instead (see :mod:`accelkit.sdk.random_stream`).

    :raises accelkit.AccelkitError: no backend is active.
    """
    return runtime.reserve_draw(_context("a random draw"), count)


def as_overload(op: Any) -> torch._ops.OpOverload:
    """``op`` as an ``OpOverload``: an overload itself, a packet's ``default``, or the overload
    behind a ``torch.library.custom_op`` object.

    :raises TypeError: ``op`` is none of these.
    """
    if isinstance(op, torch._ops.OpOverload):
        return op
    if isinstance(op, torch._ops.OpOverloadPacket):
        return op.default
    overload = getattr(op, "_opoverload", None)
    if isinstance(overload, torch._ops.OpOverload):
        return overload
    raise TypeError(f"expected an aten overload or a torch.library custom op, got {op!r}")


def register_kernel(op: Any, fn: Callable[..., Any]) -> None:
    """Give ``op`` (an overload, packet or ``torch.library`` custom op) the native kernel ``fn``
    on the active backend, after activation; ``fn`` has the contract of a
    :class:`~accelkit.sdk.KernelTable` entry (backend arrays in and out) and runs through the
    same dispatch pipeline. An in-place overload is given as such; no variants are derived.

    :raises accelkit.AccelkitError: no backend is active, or ``op`` already has a kernel there.
    :raises TypeError: ``op`` is not an op.
    """
    runtime.register_kernel(as_overload(op), fn)


def op_coverage() -> dict[str, dict[str, str]]:
    """How the active backend runs each ``aten`` overload that has a CPU kernel, read from its
    registrations and the dispatch pipeline's plan; nothing runs.

    :returns: ``{"aten.add.Tensor": {"path": ..., "detail": ...}}``, ``path`` one of
        ``native``, ``derived`` (an in-place/``out=`` variant derived from a native kernel),
        ``decomposed``, ``fallback`` (the CPU), ``cpu_by_design`` (the CPU, for an op the backend
        declared with :meth:`KernelTable.on_cpu`; ``detail`` is its reason) and ``refused``
        (sparse, quantized, MKL-DNN or nested layouts); ``detail`` says which kernel,
        decomposition or reason.
    :raises AccelkitError: no backend is active.
    """
    return runtime.op_paths()


def meta_tensor(shape: tuple[int, ...], dtype: torch.dtype, stride: tuple[int, ...] | None = None) -> torch.Tensor:
    """A tensor on PyTorch's ``meta`` device with this geometry: no memory, for asking PyTorch's
    Meta kernels what an op would return."""
    if stride is None:
        return torch.empty(tuple(shape), dtype=dtype, device="meta")
    return torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype, device="meta")


def meta_call(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    """Run ``op``'s Meta kernel: its results' shapes, strides and dtypes, computing nothing.

    Tensor arguments must already be meta tensors (:func:`meta_tensor`); a ``device`` argument
    (factories) is replaced by ``meta``. Ops PyTorch leaves to device hooks
    (``convolution_overrideable``, which has no Meta kernel) are asked through the CPU op the
    runtime runs in their place, which has the same geometry.
    """
    if "device" in kwargs:
        kwargs = {**kwargs, "device": "meta"}
    return runtime.cpu_equivalent(op)(*args, **kwargs)
