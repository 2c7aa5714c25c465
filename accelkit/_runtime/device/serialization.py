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
  other storage goes straight to PyTorch's own method. Besides tensor formatting and, on a
  device without float64, ``GradScaler.unscale_`` (:mod:`accelkit._runtime.device.grad_scaler`), this is the one global
  patch accelkit makes to torch objects; it is installed once, on activation.
"""

from __future__ import annotations

from typing import Any

import torch

from accelkit._runtime.device import tensors as T
from accelkit._runtime.device.context import BackendContext


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


def location_index(ctx: BackendContext, location: str) -> int | None:
    """The device index a checkpoint's storage location names on this backend, checked.

    ``None`` when the location is not this backend's (another deserializer's: ``cpu``,
    ``cuda:0``, ``meta``). This backend's locations are ``<name>`` and ``<name>:<index>`` with an
    index below ``torch.<name>.device_count()``; anything else that starts with the name
    (``ref:7``, ``refzz``, ``ref:0:../x``, ``ref:-1``) is refused, as PyTorch's CUDA loader
    refuses a CUDA device that does not exist, and so is a location naming another accelkit
    backend: PyTorch would only say it does not know the location.

    :raises RuntimeError: the location is malformed, names a missing device or another backend;
        the message names it, the device count and the fix (``map_location``).
    """
    name = ctx.name
    count = getattr(torch, name).device_count()
    fix = (
        "Please use torch.load with map_location to map your storages to an existing device "
        f"(e.g. map_location='{name}:0', or map_location='cpu')."
    )
    kind, colon, index = location.partition(":")
    if kind == name:
        if not colon:
            return 0
        if index.isdigit() and (index == "0" or not index.startswith("0")):  # as torch.device parses
            if int(index) < count:
                return int(index)
            raise RuntimeError(
                f"Attempting to deserialize object on {name.upper()} device {int(index)} but "
                f"torch.{name}.device_count() is {count}. {fix}"
            )
    elif not kind.startswith(name) or _torch_parses(kind):
        if kind in _other_backends(name):
            raise RuntimeError(
                f"Attempting to deserialize object on a {kind!r} device (storage location "
                f"{location!r}), but this process runs {name!r}: accelkit activates one backend per "
                f"process. {fix}"
            )
        return None
    raise RuntimeError(
        f"Attempting to deserialize object on an invalid {name.upper()} location {location!r}: a "
        f"{name} storage location is {name!r} or '{name}:<index>' with an index below "
        f"torch.{name}.device_count(), which is {count}. {fix}"
    )


def _torch_parses(kind: str) -> bool:
    try:
        torch.device(kind)
    except RuntimeError:
        return False
    return True


def _other_backends(active: str) -> set[str]:
    from accelkit._plugins import registry

    return {record.name for record in registry().records() if record.name != active}


def install_serialization(ctx: BackendContext) -> None:
    """Register the deserializer and wrap the three storage methods for ``ctx``'s device."""
    allocator = ctx.allocator

    def tagger(storage: Any) -> None:
        return None  # PyTorch's own tagger already writes "<name>:<index>"

    def deserializer(storage: Any, location: str) -> torch.UntypedStorage | None:
        index = location_index(ctx, location)
        if index is None:
            return None
        if isinstance(storage, torch.storage.TypedStorage):
            storage = storage.untyped()
        with ctx.on_device(index):
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
        with ctx.on_device(self.device.index):
            return allocator.read_bytes(payload.block, nbytes).untyped_storage()

    def clone(self: Any) -> Any:
        payload = _payload(self, ctx)
        if payload is None:
            return original_clone(self)
        with ctx.on_device(self.device.index):
            return _device_storage(ctx, cpu(self))

    def new(self: Any) -> Any:
        if _payload(self, ctx) is None:
            return original_new(self)
        with ctx.on_device(self.device.index):
            return T.new_tensor(ctx, (0,), torch.uint8).untyped_storage()

    def _byteswap(self: Any, elem_size: int) -> None:
        payload = _payload(self, ctx)
        if payload is None:
            return original_byteswap(self, elem_size)
        host = cpu(self)
        original_byteswap(host, elem_size)  # checks elem_size with PyTorch's own message
        if host.nbytes():
            with ctx.on_device(self.device.index):
                allocator.write_bytes(payload.block, torch.empty(0, dtype=torch.uint8).set_(host))
        return None

    for wrapper, original in ((cpu, original_cpu), (clone, original_clone), (new, original_new),
                              (_byteswap, original_byteswap)):
        wrapper.__doc__ = original.__doc__
        setattr(storage_cls, wrapper.__name__, wrapper)
