"""Storage emulation: device tensors with real sizes, strides and offsets over a backend buffer.

A device tensor is a PrivateUse1 tensor whose ``UntypedStorage`` Python object carries the
backend :class:`~accelkit.sdk.Buffer` as ``payload``. Every view PyTorch makes shares the
StorageImpl — and with it the payload — exactly as on CPU.

The StorageImpl's data pointer is the buffer's device address (:attr:`Buffer.address`), so
``data_ptr()`` is unique per storage, shared by its views and kept by in-place ops, as on the
CPU. It comes from ``torch._C._construct_storage_from_data_pointer`` and is swapped into the
tensor's fresh storage; PyTorch cannot read through it (no allocator, and the address lies
where no host memory can be). Such a storage is not *resizable* to PyTorch, so geometry is set
with the Meta kernel of ``as_strided_`` (bounds-checked against the storage), and a storage
that must grow gets a new buffer and a new address, as a CPU reallocation does.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch._C import DispatchKey, DispatchKeySet

from accelkit._runtime.device.context import BackendContext
from accelkit.sdk import Buffer, ViewSpec

META = DispatchKeySet(DispatchKey.Meta)
_set_geometry_meta = functools.partial(torch.ops.aten.as_strided_.default._handle.redispatch_boxed, META)
_set_storage_meta = functools.partial(
    torch.ops.aten.set_.source_Storage_storage_offset._handle.redispatch_boxed, META
)
_create_empty = torch._C._acc.create_empty_tensor  # contiguous, with an empty resizable storage
_storage_at = torch._C._construct_storage_from_data_pointer  # (address, device, nbytes)
_DEVICE = torch.device("privateuseone", 0)
#: accelkit's native maker of tensors at any device index, set when the process has several
#: devices (:func:`use_native_devices`); index 0 keeps the path above.
_device_tensor: Any = None


def use_native_devices(native: Any) -> None:
    """Make tensors of buffers whose allocator is not device 0's on that device's index."""
    global _device_tensor
    _device_tensor = native.device_tensor


def contiguous_strides(size: Sequence[int]) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(size):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


@functools.lru_cache(maxsize=1024)
def _dense_strides(size: tuple[int, ...]) -> tuple[int, ...]:
    """:func:`contiguous_strides` of a hashable shape, remembered (kernel results repeat shapes)."""
    return contiguous_strides(size)


def storage_bytes(size: Sequence[int], stride: Sequence[int], offset: int, itemsize: int) -> int:
    """Bytes of storage a view with this geometry needs."""
    if any(s == 0 for s in size):
        return offset * itemsize
    return (offset + 1 + sum((s - 1) * st for s, st in zip(size, stride))) * itemsize


def buffer_of(tensor: torch.Tensor) -> Buffer:
    """The backend buffer behind a device tensor."""
    try:
        return tensor.untyped_storage().payload
    except AttributeError:
        raise RuntimeError(
            f"a {tensor.device} tensor without device memory reached accelkit; it was made by "
            "an API that bypasses the runtime: torch.UntypedStorage(n, device=...), or a tensor "
            "rebuilt over a storage's raw address (DLPack, pickle and the legacy "
            "torch.save(..., _use_new_zipfile_serialization=False) do that). Create device "
            "tensors with torch.empty/zeros/tensor(..., device=...) or .to(device), and save "
            "them with torch.save."
        ) from None


def _wrap(
    payload: Buffer, size: tuple[int, ...], dtype: torch.dtype, stride: tuple[int, ...] | None
) -> torch.Tensor:
    """A new device tensor over ``payload``: its storage has the payload, the payload's byte
    size and its address; ``stride`` None means contiguous. The tensor is on the device of the
    payload's allocator."""
    if _device_tensor is not None and (index := payload._allocator.index):
        tensor = _device_tensor(size, _dense_strides(size) if stride is None else stride, dtype, index,
                                payload.address, payload.nbytes)
        tensor.untyped_storage().payload = payload
        return tensor
    tensor = _create_empty(size, dtype)
    storage = tensor.untyped_storage()
    if payload.address:
        storage._swap_data_ptr_(_storage_at(payload.address, _DEVICE, payload.nbytes))
    storage.payload = payload
    # create_empty's strides are contiguous but for zero-size dimensions (which PyTorch counts
    # as 1); other strides are set on the new storage.
    if stride is None:
        if 0 in size:
            _set_geometry_meta(tensor, size, _dense_strides(size), 0)
    elif 0 in size or stride != _dense_strides(size):
        _set_geometry_meta(tensor, size, stride, 0)
    return tensor


def new_tensor(
    ctx: BackendContext,
    size: Sequence[int],
    dtype: torch.dtype,
    stride: Sequence[int] | None = None,
) -> torch.Tensor:
    """Allocate a device tensor of this geometry (contiguous unless ``stride`` is given).

    Device memory is reserved before the tensor exists, so an out-of-memory error leaves
    nothing half-built.
    """
    ctx.check_dtype(dtype)
    size = tuple(size)
    if stride is not None:
        stride = tuple(stride)
    nbytes = storage_bytes(size, _dense_strides(size) if stride is None else stride, 0, dtype.itemsize)
    return _wrap(ctx.allocator.allocate(nbytes), size, dtype, stride)


def _grow(ctx: BackendContext, storage: torch.UntypedStorage, old: Buffer, needed: int) -> None:
    """Give ``storage`` (whose buffer is ``old``) at least ``needed`` bytes (see
    :func:`resize_storage`). Nothing changes if the allocation fails."""
    if needed > old.nbytes:
        resize_storage(ctx, storage, needed)


def resize_storage(ctx: BackendContext, storage: torch.UntypedStorage, nbytes: int) -> None:
    """``storage.resize_(nbytes)`` as a CPU storage's: a new buffer that keeps the first bytes
    the storage held, so a new byte size and address, which every tensor on the storage sees
    (FSDP2 frees a parameter's memory with ``resize_(0)`` and brings it back the same way).
    Nothing changes if the allocation fails."""
    old: Buffer = storage.payload
    allocator = ctx.allocator_of(storage.device.index or 0)
    new = allocator.allocate(nbytes)
    kept = min(old.nbytes, nbytes)
    if kept:
        allocator.write_bytes(new.block, allocator.read_bytes(old.block, kept))
    device = storage.device
    placeholder = _storage_at(0, device, 0)
    storage._swap_data_ptr_(placeholder)  # byte sizes must match or one be 0: empty it first
    if nbytes:
        storage._swap_data_ptr_(_storage_at(new.address, device, new.nbytes))
    del placeholder  # it holds the old address, which the old buffer gives back when it goes
    storage.payload = new


def install_storage_resize(ctx: BackendContext) -> None:
    """Route ``UntypedStorage.resize_`` of device storages to :func:`resize_storage`: PyTorch
    reaches PrivateUse1 storages' resize only through a C++ hook Python cannot implement."""
    original = torch.UntypedStorage.resize_

    def resize_(self: torch.UntypedStorage, size: int) -> torch.UntypedStorage:
        if self.device.type != ctx.name:
            return original(self, size)
        if int(size) < 0:
            raise RuntimeError(f"resize_ of a {ctx.name} storage needs a byte size >= 0, got {size}")
        resize_storage(ctx, self, int(size))
        return self

    resize_.__doc__ = original.__doc__
    torch.UntypedStorage.resize_ = resize_


def set_geometry(
    ctx: BackendContext,
    tensor: torch.Tensor,
    size: Sequence[int],
    stride: Sequence[int],
    offset: int,
) -> torch.Tensor:
    """Give ``tensor`` a new geometry on its own storage, growing device memory if needed.

    Growth keeps the bytes already stored (``resize_`` semantics); every other tensor sharing
    the storage sees the new buffer.
    """
    size, stride = tuple(size), tuple(stride)
    needed = storage_bytes(size, stride, offset, tensor.dtype.itemsize)
    _grow(ctx, tensor.untyped_storage(), buffer_of(tensor), needed)
    _set_geometry_meta(tensor, size, stride, offset)
    return tensor


def attach_storage(
    ctx: BackendContext,
    tensor: torch.Tensor,
    storage: torch.UntypedStorage,
    size: Sequence[int],
    stride: Sequence[int],
    offset: int,
) -> torch.Tensor:
    """``tensor.set_(storage, offset, size, stride)`` for a device ``storage``: growing it as the
    CPU does when the geometry needs more bytes. Nothing changes if that allocation fails."""
    size, stride = tuple(size), tuple(stride)
    _grow(ctx, storage, storage.payload, storage_bytes(size, stride, offset, tensor.dtype.itemsize))
    # The Meta set_ insists on a resizable storage unless the geometry is empty: attach with an
    # empty one, then set the real one.
    _set_storage_meta(tensor, storage, offset, (0,), (1,))
    return _set_geometry_meta(tensor, size, stride, offset)


def read(ctx: BackendContext, tensor: torch.Tensor) -> Any:
    """The tensor's elements as a backend array of its shape."""
    return ctx.allocator.read(buffer_of(tensor).block, ViewSpec.of(tensor))


def write(ctx: BackendContext, tensor: torch.Tensor, array: Any) -> None:
    """Store a backend array of the tensor's shape and dtype into the tensor's elements."""
    ctx.allocator.write(buffer_of(tensor).block, ViewSpec.of(tensor), array)


def from_array(ctx: BackendContext, array: Any) -> torch.Tensor:
    """A new contiguous device tensor holding a backend array (adopted without a copy if the
    backend can)."""
    allocator = ctx.allocator
    shape, dtype = allocator.array_meta(array)
    ctx.check_dtype(dtype)
    payload = allocator.adopt(array)
    if payload is not None:
        return _wrap(payload, tuple(shape), dtype, None)
    tensor = new_tensor(ctx, shape, dtype)
    if tensor.numel():
        write(ctx, tensor, array)
    return tensor


def adopted_tensor(payload: Buffer, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A new contiguous device tensor of ``shape`` (a tuple) over an adopted buffer: what
    :func:`_wrap` makes, with its common case inline (a kernel result on every op)."""
    if 0 in shape or (_device_tensor is not None and payload._allocator.index):
        return _wrap(payload, shape, dtype, None)
    tensor = _create_empty(shape, dtype)
    storage = tensor.untyped_storage()
    if payload.address:
        storage._swap_data_ptr_(_storage_at(payload.address, _DEVICE, payload.nbytes))
    storage.payload = payload
    return tensor


def has_math_bits(tensor: torch.Tensor) -> bool:
    """True when ``tensor`` is a conjugate or negative view: its elements are stored conjugated
    or negated, and every reader must undo that (``resolve_conj``/``resolve_neg``)."""
    return tensor.is_conj() or tensor.is_neg()


def with_math_bits_of(host: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``host`` (a CPU tensor holding ``like``'s stored elements) as an alias carrying
    ``like``'s conjugate and negative bits, so it reads as ``like``'s values; ``host`` itself
    is returned unchanged when ``like`` has neither bit."""
    if not has_math_bits(like):
        return host
    alias = host.view(host.shape)
    torch._C._set_conj(alias, like.is_conj())
    torch._C._set_neg(alias, like.is_neg())
    return alias


def stored_form(tensor: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The CPU tensor a device ``tensor`` must store so that it reads as ``values`` (a CPU
    tensor, broadcast and cast to ``tensor``): conjugated or negated when ``tensor`` is a
    conjugate or negative view, as PyTorch's ``copy_`` does. That is ``values`` itself when
    it already is: a plain CPU tensor of ``tensor``'s shape and dtype, and ``tensor`` without
    a math bit."""
    if (values.dtype == tensor.dtype and values.shape == tensor.shape and values.device.type == "cpu"
            and not has_math_bits(values) and not has_math_bits(tensor) and not values._is_zerotensor()):
        return values
    host = torch.empty(tensor.shape, dtype=tensor.dtype)
    with_math_bits_of(host, tensor).copy_(values)  # the CPU copy_ applies the bits
    return host


def write_values(ctx: BackendContext, tensor: torch.Tensor, array: Any) -> None:
    """Like :func:`write`, for a ``tensor`` that may be a conjugate or negative view (an
    ``out=`` argument): afterwards it reads as ``array``."""
    if has_math_bits(tensor):
        array = ctx.allocator.from_host(stored_form(tensor, ctx.allocator.to_host(array)))
    write(ctx, tensor, array)


def to_host(ctx: BackendContext, tensor: torch.Tensor) -> torch.Tensor:
    """A CPU copy of a device tensor's values (same shape and dtype, contiguous, no conjugate
    or negative bit: those of ``tensor`` are resolved)."""
    host = ctx.allocator.to_host(read(ctx, tensor))
    if has_math_bits(tensor):
        host = with_math_bits_of(host, tensor).resolve_conj().resolve_neg()
    return host


def host_values(host: torch.Tensor) -> torch.Tensor:
    """A CPU tensor's values as a backend's ``from_host`` may read them: no conjugate or
    negative bit, and autograd's symbolic zero tensors (which have no memory) as real zeros."""
    if host._is_zerotensor():
        return torch.zeros(host.shape, dtype=host.dtype)
    return host.resolve_conj().resolve_neg()
