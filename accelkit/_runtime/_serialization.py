"""``torch.save`` / ``torch.load`` / ``copy.deepcopy`` for device tensors, storage sharing kept.

Device storages have a device address but no memory PyTorch can reach, and no allocator,
which PyTorch's serializer, ``deepcopy`` and a few storage methods need. Two things make them
work:

- a storage *deserializer* registered with ``torch.serialization.register_package`` builds a
  device storage from the loaded bytes (for ``map_location=None`` and ``map_location=<dev>``);
- four methods of ``torch.UntypedStorage`` are wrapped so that, **for this device's storages
  only**, they work from the payload: ``cpu`` and ``clone`` copy it, ``new`` makes an empty
  device storage and ``_byteswap`` (behind ``byteswap``) swaps the bytes through the host —
  PyTorch's own methods would allocate with, or write through, the storage's address. Every
  other storage goes straight to PyTorch's own method. This is the one global patch accelkit
  makes to torch objects besides tensor formatting; it is installed once, on activation.
"""

from __future__ import annotations

from typing import Any

import torch

from accelkit._runtime import _tensors as T
from accelkit._runtime._context import BackendContext


def _payload(storage: Any, ctx: BackendContext) -> Any:
    if storage.device.type != ctx.name:
        return None
    return getattr(storage, "payload", None)


def _device_storage(ctx: BackendContext, host: torch.UntypedStorage) -> torch.UntypedStorage:
    nbytes = host.nbytes()
    tensor = T.new_tensor(ctx, (nbytes,), torch.uint8)
    if nbytes:
        data = torch.empty(0, dtype=torch.uint8).set_(host, 0, (nbytes,), (1,))
        ctx.allocator.write_bytes(T.buffer_of(tensor).block, data)
    return tensor.untyped_storage()


def install_serialization(ctx: BackendContext) -> None:
    """Register the deserializer and wrap the three storage methods for ``ctx``'s device."""
    allocator = ctx.allocator

    def tagger(storage: Any) -> None:
        return None  # PyTorch's own tagger already writes "<name>:0"

    def deserializer(storage: Any, location: str) -> torch.UntypedStorage | None:
        if not location.startswith(ctx.name):
            return None
        if isinstance(storage, torch.storage.TypedStorage):
            storage = storage.untyped()
        return _device_storage(ctx, storage)

    torch.serialization.register_package(11, tagger, deserializer)

    storage_cls = torch.UntypedStorage
    original_cpu = storage_cls.cpu
    original_clone = storage_cls.clone
    original_new = storage_cls.new
    original_byteswap = storage_cls._byteswap

    def cpu(self: Any) -> Any:
        payload = _payload(self, ctx)
        if payload is None:
            return original_cpu(self)
        nbytes = self.nbytes()
        if not nbytes:
            return torch.UntypedStorage(0)
        return allocator.read_bytes(payload.block, nbytes).untyped_storage()

    def clone(self: Any) -> Any:
        payload = _payload(self, ctx)
        if payload is None:
            return original_clone(self)
        return _device_storage(ctx, cpu(self))

    def new(self: Any) -> Any:
        if _payload(self, ctx) is None:
            return original_new(self)
        return T.new_tensor(ctx, (0,), torch.uint8).untyped_storage()

    def _byteswap(self: Any, elem_size: int) -> None:
        payload = _payload(self, ctx)
        if payload is None:
            return original_byteswap(self, elem_size)
        host = cpu(self)
        original_byteswap(host, elem_size)  # checks elem_size with PyTorch's own message
        if host.nbytes():
            allocator.write_bytes(payload.block, torch.empty(0, dtype=torch.uint8).set_(host))
        return None

    for wrapper, original in ((cpu, original_cpu), (clone, original_clone), (new, original_new),
                              (_byteswap, original_byteswap)):
        wrapper.__doc__ = original.__doc__
        setattr(storage_cls, wrapper.__name__, wrapper)
