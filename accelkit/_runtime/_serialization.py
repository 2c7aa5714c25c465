"""``torch.save`` / ``torch.load`` / ``copy.deepcopy`` for device tensors, storage sharing kept.

Device storages have no host data pointer, which PyTorch's serializer and ``deepcopy`` need.
Two things make them work:

- a storage *deserializer* registered with ``torch.serialization.register_package`` builds a
  device storage from the loaded bytes (for ``map_location=None`` and ``map_location=<dev>``);
- three methods of ``torch.UntypedStorage`` — ``data_ptr``, ``cpu`` and ``clone`` — are
  wrapped so that, **for this device's storages only**, they answer from the payload. Every
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
    original_data_ptr = storage_cls.data_ptr
    original_cpu = storage_cls.cpu
    original_clone = storage_cls.clone

    def data_ptr(self: Any) -> int:
        payload = _payload(self, ctx)
        if payload is None:
            return original_data_ptr(self)
        return id(payload)  # unique while the storage lives; what sharing checks compare

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

    data_ptr.__doc__ = original_data_ptr.__doc__
    cpu.__doc__ = original_cpu.__doc__
    clone.__doc__ = original_clone.__doc__
    storage_cls.data_ptr = data_ptr
    storage_cls.cpu = cpu
    storage_cls.clone = clone
