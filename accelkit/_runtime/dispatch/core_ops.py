"""The ops the runtime owns for every backend: allocation, geometry, copies and scalars.

These are not kernels a backend chooses to provide; they are what makes a PrivateUse1 tensor
a tensor at all. Each is registered directly on PrivateUse1.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from accelkit._runtime.device import tensors as T
from accelkit._runtime.device.context import BackendContext
from accelkit._runtime.dispatch.pipeline import META

aten = torch.ops.aten
_as_strided_meta = functools.partial(aten.as_strided.default._handle.redispatch_boxed, META)

_MEMORY_FORMAT_STRIDES = {
    torch.channels_last: 4,
    torch.channels_last_3d: 5,
}


def _check_index(ctx: BackendContext, device: Any) -> None:
    """A factory's ``device=`` names a device this process has (the runtime has already made it
    the current one, see :mod:`accelkit._runtime.device.devices`)."""
    if device is None:
        return
    index = torch.device(device).index
    if index is not None and not 0 <= index < ctx.device_count:
        upper = ctx.name.upper()
        raise RuntimeError(
            f"{ctx.name}:{index} does not exist: this process has {ctx.device_count} {ctx.name} "
            f"device(s) ({ctx.name}:0 to {ctx.name}:{ctx.device_count - 1}). Set "
            f"ACCELKIT_{upper}_DEVICES to the number of devices a simulated {ctx.name} should have, "
            "or run one process per device (torch.distributed)."
        )


def _check_geometry(size: tuple[int, ...], stride: tuple[int, ...] | None = None) -> None:
    """PyTorch's own checks (and wording) for a factory's sizes and strides, made before any
    memory is reserved."""
    if size and min(size) < 0:
        dim = next(s for s in size if s < 0)
        raise RuntimeError(f"Trying to create tensor with negative dimension {dim}: {list(size)}")
    if stride is None:
        return
    if len(size) != len(stride):
        raise RuntimeError(
            f"dimensionality of sizes ({len(size)}) must match dimensionality of strides ({len(stride)})"
        )
    if stride and min(stride) < 0:
        raise RuntimeError(
            f"Storage size calculation overflowed with sizes={list(size)} and strides={list(stride)}"
        )


def _storage_size_overflows(size, stride, offset: int, itemsize: int) -> bool:
    """Whether PyTorch's storage-size computation (``computeStorageNbytes``, in unsigned 64-bit
    arithmetic) overflows for this geometry, as it does for a negative size with a stride."""
    wrap = 1 << 64
    total, overflowed = offset + 1, False
    for s, st in zip(size, stride):
        if s == 0:
            return False
        step = (st % wrap) * ((s - 1) % wrap)
        total += step % wrap
        overflowed |= step >= wrap or total >= wrap
        total %= wrap
    return overflowed or total * itemsize >= wrap


def _strides_for(size: tuple[int, ...], memory_format: Any) -> tuple[int, ...] | None:
    if memory_format in _MEMORY_FORMAT_STRIDES and len(size) == _MEMORY_FORMAT_STRIDES[memory_format]:
        return torch.empty(size, device="meta", memory_format=memory_format).stride()
    return None


_COMPOSITE = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)


def _conjugates_on_device(ctx: BackendContext, dst: torch.Tensor, src: torch.Tensor) -> bool:
    """Whether copying ``src`` into ``dst`` (both on the device) is one conjugation of the
    stored elements that the backend has a kernel for: same shape and complex dtype, one of
    them a conjugate view, the same negative bit."""
    return (src.is_conj() != dst.is_conj() and src.dtype == dst.dtype and src.shape == dst.shape
            and src.is_neg() == dst.is_neg() and aten._conj_physical.default in ctx.kernels)


def core_ops(ctx: BackendContext) -> dict[Any, Callable]:
    """The runtime-owned kernels for ``ctx``'s backend, keyed by aten overload."""
    allocator = ctx.allocator

    def empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
        _check_index(ctx, device)
        size = tuple(size)
        _check_geometry(size)
        return T.new_tensor(ctx, size, dtype or torch.get_default_dtype(), _strides_for(size, memory_format))

    def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
        _check_index(ctx, device)
        size, stride = tuple(size), tuple(stride)
        _check_geometry(size, stride)
        return T.new_tensor(ctx, size, dtype or torch.get_default_dtype(), stride)

    def as_strided(self, size, stride, storage_offset=None):
        try:
            view = _as_strided_meta(self, size, stride, storage_offset)
        except RuntimeError:
            # Where CPU's bounds check overflows (a negative size), Meta reports a numel overflow.
            offset = self.storage_offset() if storage_offset is None else storage_offset
            if (len(size) == len(stride) and min(stride, default=0) >= 0 and offset >= 0
                    and _storage_size_overflows(size, stride, offset, self.dtype.itemsize)):
                raise RuntimeError(
                    f"Storage size calculation overflowed with sizes={list(size)} and strides={list(stride)}"
                ) from None
            raise
        # The Meta kernel skips the CPU's bounds check: a view past its storage would read and
        # write bytes that are not the tensor's.
        offset = view.storage_offset() if storage_offset is None else storage_offset
        last = offset
        for s, st in zip(size, stride):
            if s == 0:
                return view
            last += (s - 1) * st
        itemsize = self.dtype.itemsize
        if (last + 1) * itemsize > (nbytes := self.untyped_storage().nbytes()):
            raise RuntimeError(
                f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {offset}, and "
                f"itemsize {itemsize} requiring a storage size of {(last + 1) * itemsize} are out of "
                f"bounds for storage of size {nbytes}"
            )
        return view

    def meta(op):
        def run(*args, **kwargs):
            return op.redispatch(META, *args, **kwargs)

        return run

    def set_storage(self, source, storage_offset=0, size=None, stride=None):
        if not hasattr(source, "payload"):
            raise RuntimeError(
                f"set_() on a {ctx.name} tensor needs a {ctx.name} storage; got one on "
                f"{source.device}. Move the source with .to('{ctx.name}') first."
            )
        if size is None:
            size = (source.nbytes() // self.dtype.itemsize,)
        size = tuple(size)
        stride = tuple(stride) if stride else T.contiguous_strides(size)  # [] means contiguous
        # PyTorch's checks and wording, made before anything changes.
        if len(size) != len(stride):
            raise RuntimeError(f"unequal size length ({len(size)}) and stride length ({len(stride)})")
        if storage_offset < 0:
            raise RuntimeError(f"Tensor: invalid storage offset {storage_offset}")
        if size and min(size) < 0:
            raise RuntimeError("numel: integer multiplication overflow")
        if stride and min(stride) < 0:
            raise RuntimeError(
                f"Storage size calculation overflowed with sizes={list(size)} and strides={list(stride)}"
            )
        return T.attach_storage(ctx, self, source, size, stride, storage_offset)

    def set_tensor(self, source):
        T.buffer_of(source)
        return aten.set_.source_Tensor.redispatch(META, self, source)

    def set_empty(self):
        fresh = T.new_tensor(ctx, (0,), self.dtype)
        return aten.set_.source_Tensor.redispatch(META, self, fresh)

    def resize_(self, size, memory_format=None):
        size = tuple(size)
        if size and min(size) < 0:
            # PyTorch's wording; unlike the CPU, which keeps the negative size, self is unchanged.
            raise RuntimeError("numel: integer multiplication overflow")
        if memory_format is None and size == tuple(self.shape):
            return self  # as on CPU: the same shape keeps its strides (factories' out= write through them)
        stride = _strides_for(size, memory_format) or T.contiguous_strides(size)
        return T.set_geometry(ctx, self, size, stride, self.storage_offset())

    def copy_(dst, src, non_blocking=False):
        name = ctx.name
        if dst.device.type == name:
            if dst.numel() == 0:
                return dst
            if any(st == 0 and sz > 1 for sz, st in zip(dst.shape, dst.stride())):
                raise RuntimeError(  # PyTorch's own check (assert_no_internal_overlap)
                    "unsupported operation: more than one element of the written-to tensor refers "
                    "to a single memory location. Please clone() the tensor before performing the "
                    "operation."
                )
            if src.device.type == name and src.device != dst.device:
                with ctx.on_device(src.device.index):  # between two devices: through the host
                    src = T.to_host(ctx, src)
                with ctx.on_device(dst.device.index):
                    T.write(ctx, dst, ctx.allocator.from_host(T.stored_form(dst, src)))
                return dst
            if src.device.type == name:
                if _conjugates_on_device(ctx, dst, src):
                    # The stored elements differ by a conjugation (one of the two is a conjugate
                    # view): the backend's kernel conjugates src's stored elements into dst's.
                    stored = aten._conj_physical.default(torch._conj(src) if src.is_conj() else src)
                    T.write(ctx, dst, T.read(ctx, stored))
                    return dst
                # Complex to real stays on the host path, which warns that the imaginary part
                # goes; so do copies between views with different conjugate/negative bits that
                # the backend cannot conjugate.
                if (
                    src.shape == dst.shape
                    and (dst.is_complex() or not src.is_complex())
                    and src.is_conj() == dst.is_conj()
                    and src.is_neg() == dst.is_neg()
                ):
                    array = T.read(ctx, src)  # equal bits: the stored elements copy as they are
                    if src.dtype != dst.dtype:  # a dtype conversion (.to(dtype)): on the device
                        array = allocator.cast(array, dst.dtype)
                    T.write(ctx, dst, array)
                    return dst
                src = T.to_host(ctx, src)
            T.write(ctx, dst, allocator.from_host(T.stored_form(dst, src)))
            return dst
        with ctx.on_device(src.device.index):
            dst.copy_(T.to_host(ctx, src))
        return dst

    def copy_from(self, dst, non_blocking=False):
        with ctx.on_device(dst.device.index if dst.device.type == ctx.name else self.device.index):
            return copy_(dst, self, non_blocking)

    def copy_from_and_resize(self, dst):
        if dst.device.type == ctx.name:
            resize_(dst, self.shape)
        else:
            dst.resize_(self.shape)
        return copy_(dst, self)

    def local_scalar_dense(self):
        return T.to_host(ctx, self).item()

    def to_copy(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
                memory_format=None):
        # A non-blocking copy to the host asks PyTorch for a pinned host tensor, which a Python
        # backend cannot allocate (the pinned allocator is a C++ hook). The copy is synchronous
        # anyway, so it is made blocking, into ordinary host memory.
        if non_blocking and device is not None and torch.device(device).type == "cpu":
            non_blocking = False
        return aten._to_copy.default.redispatch(
            _COMPOSITE, self, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory,
            non_blocking=non_blocking, memory_format=memory_format,
        )

    def record_stream(self, stream):
        # Every stream is the device's one in-order queue, and the allocator frees in program
        # order, so a tensor used on "another" stream is never reused too early.
        return None

    return {
        aten.record_stream.default: record_stream,
        aten._to_copy.default: to_copy,
        aten.empty.memory_format: empty,
        aten.empty_strided.default: empty_strided,
        aten.as_strided.default: as_strided,
        aten.view.default: meta(aten.view.default),
        aten._reshape_alias.default: meta(aten._reshape_alias.default),
        aten.alias.default: meta(aten.alias.default),
        aten.set_.source_Storage_storage_offset: set_storage,
        aten.set_.source_Storage: set_storage,
        aten.set_.source_Tensor: set_tensor,
        aten.set_.default: set_empty,
        aten.resize_.default: resize_,
        aten.copy_.default: copy_,
        aten._copy_from.default: copy_from,
        aten._copy_from_and_resize.default: copy_from_and_resize,
        aten._local_scalar_dense.default: local_scalar_dense,
    }
