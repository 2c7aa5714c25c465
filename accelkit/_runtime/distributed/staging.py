"""How a host-staged process group hands tensors to gloo: host buffers kept between collectives,
and each tensor's host stand-in (the tensor itself, a filled buffer, or memory its device
lends)."""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Sequence

import torch

from accelkit._runtime.device import tensors
from accelkit._runtime.distributed.stats import STATS
from accelkit.sdk import ViewSpec


class HostPool:
    """Host staging buffers kept between collectives, by byte size (a fresh 64 MiB buffer costs
    more in page faults than the copy into it).

    A buffer handed out by :meth:`take` comes back by itself once the last reference to the
    host tensor is gone: when the collective has finished with it, or, for a received buffer
    that the device adopted as its memory (:meth:`DeviceAllocator.adopt_host`), when the device
    has let go of it. At most ``limit`` bytes are kept.
    """

    def __init__(self, limit: int = 512 << 20):
        self._free: dict[int, list[torch.Tensor]] = {}
        self._kept = 0
        self._limit = limit
        self._lock = threading.Lock()

    def take(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        nbytes = math.prod(shape) * dtype.itemsize
        if not nbytes:
            return torch.empty(shape, dtype=dtype)
        with self._lock:
            free = self._free.get(nbytes)
            if free:
                self._kept -= nbytes
                raw = free.pop()
            else:
                raw = None
        if raw is None:
            raw = torch.empty(nbytes, dtype=torch.uint8)
        host = raw.view(dtype).view(shape)
        weakref.finalize(host, self._give, raw)
        return host

    def _give(self, raw: torch.Tensor) -> None:
        nbytes = raw.numel()
        with self._lock:
            if self._kept + nbytes <= self._limit:
                self._free.setdefault(nbytes, []).append(raw)
                self._kept += nbytes


class Staged:
    """A tensor's host stand-in for gloo, ready once :meth:`fill` has run (the group fills while
    the ranks' agreement check is in flight):

    - a contiguous CPU tensor is its own;
    - a tensor the collective rewrites in place (``in_place``) is first offered to its device's
      :meth:`DeviceAllocator.lend_host`: where the device lends its memory as host memory, gloo
      works on that memory itself, with nothing to copy in or write back;
    - anything else gets a host buffer from the group's pool, filled with the tensor's values
      when ``copy_in`` (an input) and written back by :meth:`write_back` (an output).

    Tensors of the active backend are read and written through their device's allocator
    directly, with no dispatch and no version-counter bump (a collective is not an autograd
    in-place op, as with gloo on CPU or NCCL on CUDA): one copy in, and the received host
    buffer handed to the device (:meth:`DeviceAllocator.adopt_host`, no copy where the
    substrate can keep host memory). :meth:`release` drops the buffer, which returns to the
    pool once nothing holds it."""

    __slots__ = ("tensor", "host", "_ctx", "_pool", "_pooled", "_unfilled", "_lendable", "_lent")

    def __init__(self, tensor: torch.Tensor, copy_in: bool, pool: HostPool | None = None,
                 host: torch.Tensor | None = None, in_place: bool = False):
        from accelkit._runtime import active

        self.tensor = tensor
        ctx = active()
        self._ctx = ctx if ctx is not None and tensor.device.type == ctx.name else None
        self._pool = pool
        self._pooled = self._unfilled = self._lendable = self._lent = False
        if host is not None:  # values already on the host, to write back
            self.host = host
            return
        if tensor.device.type == "cpu" and tensor.is_contiguous():
            self.host = tensor
            return
        if in_place and self._ctx is not None and not tensors.has_math_bits(tensor):
            self.host, self._lendable, self._unfilled = None, True, True  # decided by fill()
            return
        if self._ctx is not None:
            STATS.staged(lent=False)
        self._take_buffer()
        self._unfilled = copy_in

    def _take_buffer(self) -> None:
        tensor, pool = self.tensor, self._pool
        self._pooled = pool is not None
        self.host = pool.take(tensor.shape, tensor.dtype) if pool is not None else torch.empty(tensor.shape, dtype=tensor.dtype)

    def fill(self) -> None:
        """Make the host stand-in ready: borrow the device's memory, or copy the tensor's values
        into the host buffer (once; nothing to do for an output or a tensor that is its own host
        buffer)."""
        if not self._unfilled:
            return
        self._unfilled = False
        tensor, ctx = self.tensor, self._ctx
        if self._lendable:
            with ctx.on_device(tensor.device.index):
                lent = ctx.allocator.lend_host(tensors.buffer_of(tensor).block, ViewSpec.of(tensor))
            STATS.staged(lent=lent is not None)
            if lent is not None:
                self.host, self._lent = lent, True
                return
            self._take_buffer()
        if ctx is not None and not tensors.has_math_bits(tensor):
            with ctx.on_device(tensor.device.index):
                ctx.allocator.to_host_into(tensors.read(ctx, tensor), self.host)
        else:
            self.host.copy_(tensor.detach())

    def write_back(self) -> None:
        if self.host is self.tensor or self._lent:
            return
        if self._ctx is not None:
            ctx = self._ctx
            with ctx.on_device(self.tensor.device.index):
                tensors.write_values(ctx, self.tensor, ctx.allocator.adopt_host(self.host))
        else:
            _copy_keeping_version(self.tensor, self.host)

    def release(self) -> None:
        """Drop the host buffer (after gloo and the write-back are done): a pooled one returns
        to the pool once the device, too, has let go of it."""
        if self._pooled or self._lent:
            self.host = None
            self._pooled = self._lent = False


def assign(tensor: torch.Tensor, values: torch.Tensor) -> None:
    """Write ``values`` (a tensor of ``tensor``'s shape and dtype, on its device) into ``tensor``
    as a collective writes its results: for the active backend's tensors through the device's
    allocator, with no dispatch; in any case with no version-counter bump."""
    from accelkit._runtime import active

    ctx = active()
    if ctx is not None and tensor.device.type == ctx.name:
        with ctx.on_device(tensor.device.index):
            tensors.write_values(ctx, tensor, tensors.read(ctx, values))
    else:
        _copy_keeping_version(tensor, values)


def _copy_keeping_version(tensor: torch.Tensor, values: torch.Tensor) -> None:
    version = tensor._version
    with torch.no_grad():
        tensor.copy_(values)
    torch._C._autograd._unsafe_set_version_counter((tensor,), (version,))


def hosts(staged: Sequence[Staged]) -> list[torch.Tensor]:
    return [s.host for s in staged]
