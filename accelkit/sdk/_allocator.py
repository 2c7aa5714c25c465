"""Device memory: the allocator base every backend subclasses.

The base owns what every backend needs the same way — size classes, a cache of freed blocks,
statistics, the capacity check and the out-of-memory message. A backend supplies the raw
primitives: how to get and drop a block, and how to move data between a block, its own array
type and the host.
"""

from __future__ import annotations

import threading
import types
from typing import Any, NamedTuple

import torch

_SMALL_LIMIT = 1 << 20  # requests up to 1 MiB are rounded to 512 bytes
_SMALL_ROUND = 512

# Device addresses (Buffer.address) come from [_ADDRESS_BASE, _ADDRESS_LIMIT): no host pointer
# can lie there. On x86-64 the range is non-canonical; on arm64, whose loads ignore the top
# byte, what remains is above any user address. So code that wrongly dereferences one faults
# at once instead of reading or writing someone's memory.
_ADDRESS_BASE = 0x40F0 << 48
_ADDRESS_LIMIT = 0x4100 << 48


def size_class(nbytes: int) -> int:
    """Round a request to its block size.

    Small requests round up to 512 bytes; larger ones to one of four steps per power of two
    (1, 1.25, 1.5, 1.75 × 2**k), so a freed block is reused by any request of the same class
    and at most a fifth of a block is slack.
    """
    if nbytes <= _SMALL_LIMIT:
        return max(_SMALL_ROUND, -(-nbytes // _SMALL_ROUND) * _SMALL_ROUND)
    step = 1 << (nbytes.bit_length() - 3)
    return -(-nbytes // step) * step


_SPANS: dict[int, int] = {}  # request -> size class, for the requests met so far (bounded)


def _span(nbytes: int) -> int:
    """:func:`size_class` of ``nbytes``, remembered: every kernel result claims and frees a
    device address of its size class, and results repeat their sizes."""
    span = _SPANS.get(nbytes)
    if span is None:
        if len(_SPANS) >= 4096:
            _SPANS.clear()
        span = _SPANS[nbytes] = size_class(nbytes)
    return span


def format_bytes(n: float) -> str:
    """``1536`` → ``"1.50 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


_new_tuple = tuple.__new__


class ViewSpec(NamedTuple):
    """How a tensor reads its storage: dtype, sizes, strides and offset (in elements)."""

    dtype: torch.dtype
    size: tuple[int, ...]  # a torch.Size (a tuple) when taken from a tensor
    stride: tuple[int, ...]
    offset: int

    @classmethod
    def of(cls, tensor: torch.Tensor) -> ViewSpec:
        # tuple.__new__ skips NamedTuple's generated __new__: this runs for every tensor
        # argument of every op.
        return _new_tuple(cls, (tensor.dtype, tensor.shape, tensor.stride(), tensor.storage_offset()))

    @classmethod
    def contiguous(cls, dtype: torch.dtype, size: tuple[int, ...]) -> ViewSpec:
        stride, acc = [], 1
        for s in reversed(size):
            stride.append(acc)
            acc *= max(s, 1)
        return cls(dtype, tuple(size), tuple(reversed(stride)), 0)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.size:
            n *= s
        return n


class Buffer:
    """One device allocation: the payload kept on a device tensor's storage.

    It returns its block to the allocator when the storage (and so the last tensor using it)
    is gone. ``block`` is the backend's raw block; ``nbytes`` what was asked for.
    ``cacheable`` is False for adopted blocks, which go back to the backend when freed.
    ``address`` is the buffer's device address, what ``data_ptr()`` reports: 0 for an empty
    buffer, otherwise unique among live buffers, aligned to 512 bytes, with ``nbytes`` of
    address space that no other live buffer overlaps. Nothing can be read through it.
    """

    __slots__ = ("block", "nbytes", "block_bytes", "cacheable", "address", "_allocator", "__weakref__")

    def __init__(self, allocator: DeviceAllocator, block: Any, nbytes: int, block_bytes: int,
                 cacheable: bool = True, address: int = 0):
        self.block = block
        self.nbytes = nbytes
        self.block_bytes = block_bytes
        self.cacheable = cacheable
        self.address = address
        self._allocator = allocator

    def __del__(self) -> None:
        allocator = self._allocator
        if allocator is not None:
            self._allocator = None
            try:
                allocator._release(self.block, self.block_bytes, self.nbytes, self.cacheable, self.address)
            except Exception:  # interpreter shutdown may have torn the allocator down already
                pass

    def __repr__(self) -> str:
        return f"Buffer({format_bytes(self.nbytes)} on {self._allocator and self._allocator.device})"


class _Books:
    """An allocator's counters, in one object so that accelkit's native extension can keep them
    in C (``_native/books.cpp``'s ``Books`` has the same fields): what adopting a kernel result
    and releasing a buffer update on every op. Read and written under the allocator's lock."""

    __slots__ = ("allocated", "requested", "live", "cached_bytes", "cached_blocks", "peak_allocated",
                 "peak_reserved", "peak_requested", "peak_live", "peak_segments", "freed_bytes",
                 "freed_requested", "released_bytes", "frees", "device_frees", "cache_hits", "ooms",
                 "alloc_retries", "capacity")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity  # the device's bytes
        # Cached (free) blocks, and live buffers: their blocks' bytes (size classes), the bytes
        # they asked for, how many; each one's highest value since the last peak reset.
        self.cached_bytes = self.cached_blocks = 0
        self.allocated = self.requested = self.live = 0
        self.peak_allocated = self.peak_reserved = self.peak_requested = self.peak_live = 0
        self.peak_segments = 0  # segments: blocks taken from the backend, = live + cached blocks
        # Running totals of what went away; what came is what went plus what is there now.
        self.freed_bytes = 0  # blocks of freed buffers
        self.freed_requested = 0  # what freed buffers had asked for
        self.released_bytes = 0  # blocks given back to the backend
        self.frees = self.device_frees = self.cache_hits = self.ooms = self.alloc_retries = 0  # events


def _count_new_buffer(books: Any, block_bytes: int, nbytes: int) -> None:
    """Count a new live buffer of ``block_bytes`` (asked for ``nbytes``) in ``books`` and raise
    the peaks it passes (the allocator's lock held). ``books.cpp``'s ``adopt_buffer`` does the
    same in C."""
    allocated = books.allocated = books.allocated + block_bytes
    requested = books.requested = books.requested + nbytes
    live = books.live = books.live + 1
    if allocated > books.peak_allocated:
        books.peak_allocated = allocated
    if allocated + books.cached_bytes > books.peak_reserved:
        books.peak_reserved = allocated + books.cached_bytes
    if requested > books.peak_requested:
        books.peak_requested = requested
    if live > books.peak_live:
        books.peak_live = live
    if live + books.cached_blocks > books.peak_segments:
        books.peak_segments = live + books.cached_blocks


class DeviceAllocator:
    """Base of every backend allocator: caching, statistics, capacity and OOM errors.

    Subclasses implement the raw primitives below. The runtime calls only the public methods.

    Raw primitives (backend):

    - ``_alloc_block(nbytes) -> block`` and ``_free_block(block)``;
    - ``read(block, view) -> array``: the view's elements as a backend array of ``view.size``;
    - ``write(block, view, array)``: store an array of ``view.size`` and ``view.dtype`` into
      the view's elements; other elements of the block are unchanged;
    - ``to_host(array) -> torch.Tensor`` and ``from_host(tensor) -> array``, each sharing no
      memory with its argument (the runtime hands ``from_host`` the caller's own tensors, which
      may change afterwards, with any strides: the array holds their values in row-major
      order);
    - ``array_meta(array) -> (shape, torch.dtype)``.

    Optional: ``_block_from_array(array)`` to adopt kernel results without a copy (and
    ``_adoption_refused(array)`` to hear of one refused for lack of room),
    ``adopt_host(tensor)`` to keep a host tensor's memory without a copy,
    ``lend_host(block, view)`` to let a collective rewrite a view's memory in place,
    ``cast(array, dtype)`` (default: through the host), ``read_bytes`` /
    ``write_bytes`` for whole-block host copies (default: through ``read``/``write``) and
    ``synchronize()`` for backends that queue work (default: nothing to wait for).

    :param device: the device string used in messages (``"ref:0"``).
    :param capacity: bytes the device holds; requests beyond it raise ``torch.OutOfMemoryError``.
    :param max_cached: bytes of freed blocks kept for reuse (default: a quarter of capacity).
    """

    #: Which device of the backend this allocator owns (set by the runtime at activation).
    index: int = 0

    def __init__(self, device: str, capacity: int, max_cached: int | None = None):
        if capacity <= 0:
            raise ValueError(f"{device}: allocator capacity must be positive, got {capacity}")
        self.device = device
        self._books: Any = _Books(capacity)  # the counters (see _Books)
        self.max_cached = capacity // 4 if max_cached is None else max_cached
        # Reentrant: a buffer freed by the garbage collector while this thread holds the lock
        # (a collection can start at any allocation) releases its block from inside it.
        self._lock = threading.RLock()
        self._cache: dict[int, list[Any]] = {}
        # Device addresses: freed ones by size class for reuse, and the start of the unused rest.
        self._free_addresses: dict[int, list[int]] = {}
        self._next_address = _ADDRESS_BASE
        # Whether the backend does anything to drop a block (every kernel result's release asks).
        self._frees_blocks = type(self)._free_block is not DeviceAllocator._free_block
        # The buffer type: the native extension's once the runtime has loaded it
        # (_use_native_books), which keeps the books in C (and adopt with them).
        self._buffer_type: Any = Buffer

    def _use_native_books(self, native: Any) -> None:
        """Keep the books in accelkit's native extension (``_native/books.cpp``) from now on:
        its ``Books`` takes over this allocator's counters (their values so far), adopting a
        kernel result and releasing a buffer update them in C in the common case, under the same
        lock, and every other path reads and writes them as before. An allocator that caches
        nothing (``max_cached=0``) also allocates in C, as it adopts."""
        with self._lock:
            books = native.Books()
            for name in _Books.__slots__:
                setattr(books, name, getattr(self._books, name))
            books.frees_blocks = self._frees_blocks
            books.lock = self._lock
            books.free_addresses = self._free_addresses
            self._books = books
            self._buffer_type = native.Buffer
            if type(self).adopt is DeviceAllocator.adopt:  # a backend's own adopt stays
                self.adopt = types.MethodType(native.adopt, self)  # type: ignore[method-assign]
            if type(self).allocate is DeviceAllocator.allocate and not self.max_cached:
                self.allocate = types.MethodType(native.allocate, self)  # type: ignore[method-assign]

    @property
    def capacity(self) -> int:
        """The bytes the device holds: requests beyond them raise ``torch.OutOfMemoryError``."""
        return self._books.capacity

    @capacity.setter
    def capacity(self, capacity: int) -> None:
        self._books.capacity = capacity

    # -- backend primitives ----------------------------------------------------------------

    def _alloc_block(self, nbytes: int) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement _alloc_block")

    def _free_block(self, block: Any) -> None:
        """Drop a block for good. The default lets garbage collection reclaim it."""

    def read(self, block: Any, view: ViewSpec) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement read")

    def write(self, block: Any, view: ViewSpec, array: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement write")

    def to_host(self, array: Any) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement to_host")

    def from_host(self, tensor: torch.Tensor) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement from_host")

    def adopt_host(self, tensor: torch.Tensor) -> Any:
        """An array with a contiguous host tensor's values, where the caller hands the tensor's
        memory over: the array may keep that memory instead of copying it (collectives hand
        their received host buffers over this way). The runtime never writes the tensor again,
        and reuses its memory once the tensor object is gone, so an array that keeps the memory
        must hold a reference to ``tensor`` itself (not only to its storage, as
        ``tensor.numpy()`` does) for as long as it does. Default: ``from_host(tensor)``, a copy."""
        return self.from_host(tensor)

    def lend_host(self, block: Any, view: ViewSpec) -> torch.Tensor | None:
        """The view's memory itself as a writable, contiguous host tensor of ``view.size`` and
        ``view.dtype``, or None (the default) where the device cannot lend it.

        Collectives that rewrite a tensor in place (all-reduce, broadcast, reduce) ask first, so
        gloo can work on device memory that is host memory without a staging copy in and out.
        What is written into the tensor is, from then on, the view's values. Lend only memory
        that nothing else can observe: no other block, array, pending kernel or host view may
        see the writes (as a view of the same block may: it shares the storage). The runtime
        drops the tensor when the collective ends. A transport failure midway leaves the view
        partly rewritten, as gloo leaves a CPU tensor."""
        return None

    def to_host_into(self, array: Any, out: torch.Tensor) -> None:
        """Copy an array's values into ``out``, an existing contiguous host tensor of its shape
        and dtype (collectives stage through reused host buffers: a fresh buffer per call costs
        its page faults). Default: ``out.copy_(self.to_host(array))``."""
        out.copy_(self.to_host(array))

    def array_meta(self, array: Any) -> tuple[tuple[int, ...], torch.dtype]:
        raise NotImplementedError(f"{type(self).__name__} must implement array_meta")

    def cast(self, array: Any, dtype: torch.dtype) -> Any:
        """Convert an array to ``dtype``; the default goes through the host."""
        return self.from_host(self.to_host(array).to(dtype))

    def synchronize(self) -> None:
        """Wait for queued device work (``torch.<name>.synchronize``); default: nothing queued."""

    def settle(self, results: Any) -> None:
        """Raise now any error still pending for the kernel that produced ``results`` (its
        arrays, as the kernel returned them).

        The runtime calls this before it stores a kernel's results into a caller's ``out=``
        tensor. A backend that checks values on the device and reports failures at the next
        synchronisation (tpu) waits for that kernel here, so that a refused op leaves ``out``
        unchanged; in-place variants need no such wait, as their kernel returns the old value
        of ``self`` when it refuses. Default: nothing is ever pending.
        """

    def read_bytes(self, block: Any, nbytes: int) -> torch.Tensor:
        """The first ``nbytes`` of a block as a new host ``uint8`` tensor."""
        return self.to_host(self.read(block, ViewSpec(torch.uint8, (nbytes,), (1,), 0))).clone()

    def write_bytes(self, block: Any, data: torch.Tensor) -> None:
        """Overwrite the start of a block with host ``uint8`` bytes."""
        view = ViewSpec(torch.uint8, (data.numel(),), (1,), 0)
        self.write(block, view, self.from_host(data))

    # -- the public allocator --------------------------------------------------------------

    def allocate(self, nbytes: int) -> Buffer:
        """Return a buffer of at least ``nbytes``, reusing a cached block when one fits.

        :raises torch.OutOfMemoryError: when the request does not fit in the capacity even
            after the cache is emptied. The message names the device, the request, what is in
            use and the capacity.
        """
        if nbytes < 0:
            raise ValueError(f"{self.device}: cannot allocate a negative size ({nbytes} bytes)")
        # Size classes let a freed block serve the next request of its class. An allocator that
        # caches nothing gets exactly what was asked, so a whole-tensor write covers its block.
        block_bytes = size_class(nbytes) if self.max_cached else nbytes
        block, address = self._reserve(nbytes, block_bytes, use_cache=True)
        if block is None:
            try:
                block = self._alloc_block(block_bytes)
            except BaseException:
                self._unreserve(nbytes, block_bytes, address)
                raise
        return self._buffer_type(self, block, nbytes, block_bytes, address=address)

    def _unreserve(self, nbytes: int, block_bytes: int, address: int) -> None:
        """Undo a reservation whose block the backend failed to make."""
        books = self._books
        with self._lock:
            books.allocated -= block_bytes
            books.requested -= nbytes
            books.live -= 1
            self._free_address(address, nbytes)

    def adopt(self, array: Any) -> Buffer | None:
        """Make a freshly computed array the block of a new buffer, without a copy.

        :returns: the buffer, or None when the backend cannot adopt this array (the runtime
            then allocates and writes). The bytes count against the capacity like any other.
        """
        adopted = self._block_from_array(array)
        if adopted is None:
            return None
        return self._adopt_block(array, *adopted)

    def _adopt_block(self, array: Any, block: Any, nbytes: int) -> Buffer:
        """:meth:`adopt` once the backend has made ``array``'s block (the native books' adopt
        takes the common case in C and comes here for the rest)."""
        books = self._books
        with self._lock:
            # The common case inline (a kernel result on every op); a result that needs the
            # cache emptied, or does not fit, takes the general path.
            if books.allocated + books.cached_bytes + nbytes > self.capacity:
                try:
                    _, address = self._reserve(nbytes, nbytes, use_cache=False)
                except torch.OutOfMemoryError:
                    self._adoption_refused(array)
                    raise
            else:
                free = self._free_addresses.get(_SPANS.get(nbytes) or _span(nbytes)) if nbytes else None
                address = free.pop() if free else self._claim_address(nbytes)
                _count_new_buffer(books, nbytes, nbytes)
        return self._buffer_type(self, block, nbytes, nbytes, False, address)

    def hold(self, array: Any) -> Buffer:
        """Count ``array``, which a backend keeps across calls outside any tensor (a compiled
        program's prepared copy of a parameter), as device memory until the returned buffer is
        dropped: adopted without a copy where the backend can, else as an allocation of its
        size (the backend keeps using ``array`` itself).

        :raises torch.OutOfMemoryError: when it does not fit, as for any allocation.
        """
        buffer = self.adopt(array)
        if buffer is not None:
            return buffer
        shape, dtype = self.array_meta(array)
        numel = 1
        for size in shape:
            numel *= size
        return self.allocate(numel * dtype.itemsize)

    def block_writes(self, block: Any) -> Any:
        """Backend hook: a value that changes whenever ``block`` is written in place (through
        :meth:`write` or :meth:`write_bytes`, whichever tensor the write came through), for
        compiled programs that keep prepared copies of parameters; None (the default): the
        backend does not count, and a write through ``param.data`` goes unseen by them."""
        return None

    def _block_from_array(self, array: Any) -> tuple[Any, int] | None:
        """Backend hook for :meth:`adopt`: ``(block, nbytes)`` viewing ``array``, or None."""
        return None

    def _adoption_refused(self, array: Any) -> None:
        """Backend hook: :meth:`adopt` is about to raise ``torch.OutOfMemoryError`` for
        ``array``. A backend that computes lazily forgets the work that would produce it here,
        so that a refused op leaves nothing behind (the default: nothing to forget)."""

    def ensure_room(self, nbytes: int) -> None:
        """Raise ``torch.OutOfMemoryError`` (counted, with :meth:`allocate`'s message) when
        ``nbytes`` more could not be held even with the cache emptied; otherwise change
        nothing. For backends that know a result's size before computing it: refusing then
        spares the host the work (and, on a simulated device, the memory) of a result the
        device could never hold."""
        if self._books.allocated + nbytes > self.capacity:
            with self._lock:
                raise self._out_of_memory(nbytes)

    def _reserve(self, nbytes: int, block_bytes: int, use_cache: bool) -> tuple[Any, int]:
        """Account for a new buffer; return a cached block to reuse (or None) and the buffer's
        device address."""
        books = self._books
        with self._lock:
            address = self._claim_address(nbytes)  # first: it can fail, and then nothing changed
            cached = self._cache.get(block_bytes) if use_cache else None
            if cached:
                block = cached.pop()
                books.cached_bytes -= block_bytes
                books.cached_blocks -= 1
                books.cache_hits += 1
            else:
                block = None
                if self._reserved() + block_bytes > self.capacity and books.cached_blocks:
                    # CUDA's "alloc retry": the request does not fit beside the cached blocks,
                    # so they go back to the backend and the request is tried again.
                    books.alloc_retries += 1
                    self._empty_cache_locked()
                if books.allocated + block_bytes > self.capacity:
                    self._free_address(address, nbytes)
                    raise self._out_of_memory(nbytes)
            _count_new_buffer(books, block_bytes, nbytes)
            return block, address

    def _claim_address(self, nbytes: int) -> int:
        """A device address for a new buffer of ``nbytes`` (lock held): a freed one of its size
        class, else the next unused range. Empty buffers have none (0), as on the CPU."""
        if not nbytes:
            return 0
        span = size_class(nbytes)
        free = self._free_addresses.get(span)
        if free:
            return free.pop()
        address = self._next_address
        if address + span > _ADDRESS_LIMIT:
            raise RuntimeError(f"{self.device}: the allocator ran out of device addresses")
        self._next_address = address + span
        return address

    def _free_address(self, address: int, nbytes: int) -> None:
        if address:
            self._free_addresses.setdefault(size_class(nbytes), []).append(address)

    def _release(self, block: Any, block_bytes: int, nbytes: int, cacheable: bool = True,
                 address: int = 0) -> None:
        books = self._books
        with self._lock:
            books.allocated -= block_bytes
            books.requested -= nbytes
            books.live -= 1
            books.freed_bytes += block_bytes
            books.freed_requested += nbytes
            books.frees += 1
            if address:  # _free_address, inline (every kernel result comes through here)
                span = _SPANS.get(nbytes) or _span(nbytes)
                free = self._free_addresses.get(span)
                if free is None:
                    free = self._free_addresses[span] = []
                free.append(address)
            # Adopted blocks are never cached: adoption does not draw on the cache, so caching
            # them would grow it by one block per kernel result until max_cached is reached.
            if cacheable and books.cached_bytes + block_bytes <= self.max_cached:
                self._cache.setdefault(block_bytes, []).append(block)
                books.cached_bytes += block_bytes
                books.cached_blocks += 1
                return
            books.device_frees += 1
            books.released_bytes += block_bytes
        if self._frees_blocks:
            self._free_block(block)

    def _reserved(self) -> int:
        return self._books.allocated + self._books.cached_bytes

    def _empty_cache_locked(self) -> list[Any]:
        books = self._books
        # Detach the cache first: a block released while we iterate lands in the new one.
        books.device_frees += books.cached_blocks
        books.released_bytes += books.cached_bytes
        cache, self._cache, books.cached_bytes, books.cached_blocks = self._cache, {}, 0, 0
        blocks = [b for bucket in cache.values() for b in bucket]
        for block in blocks:
            self._free_block(block)
        return blocks

    def empty_cache(self) -> None:
        """Give every cached (free) block back; live tensors are untouched."""
        with self._lock:
            self._empty_cache_locked()

    def _out_of_memory(self, nbytes: int) -> torch.OutOfMemoryError:
        """The error refusing a request of ``nbytes``, counted as an OOM (lock held)."""
        self._books.ooms += 1
        return torch.OutOfMemoryError(
            f"{self.device} out of memory: tried to allocate {format_bytes(nbytes)}, "
            f"but {format_bytes(self._books.allocated)} of the device's {format_bytes(self.capacity)} "
            f"are held by live tensors ({format_bytes(self._reserved())} reserved). "
            "Free tensors you no longer need, use a smaller batch, or pick a target "
            "with more memory."
        )

    # -- statistics ------------------------------------------------------------------------

    def memory_allocated(self) -> int:
        return self._books.allocated

    def memory_reserved(self) -> int:
        return self._reserved()

    def max_memory_allocated(self) -> int:
        return self._books.peak_allocated

    def max_memory_reserved(self) -> int:
        return self._books.peak_reserved

    def reset_peak_stats(self) -> None:
        """Make every peak, of bytes and of counts, its current value (CUDA's
        ``reset_peak_memory_stats``)."""
        books = self._books
        with self._lock:
            books.peak_allocated = books.allocated
            books.peak_reserved = self._reserved()
            books.peak_requested = books.requested
            books.peak_live = books.live
            books.peak_segments = books.live + books.cached_blocks

    def memory_stats(self) -> dict[str, int]:
        """The allocator's figures under ``torch.cuda.memory_stats()``'s keys, and accelkit's own.

        CUDA's layout, for the ``all`` pool only (the base keeps no separate small and large
        pools): ``<stat>.all.{current,peak,allocated,freed}`` — the value now, its highest since
        :meth:`reset_peak_stats`, and the running totals of its increases and decreases since
        the allocator was made — for

        - ``allocated_bytes``: the blocks of live buffers (size classes);
        - ``requested_bytes``: what those buffers asked for;
        - ``reserved_bytes``: allocated plus cached: the blocks taken from the backend and not
          given back;
        - ``active_bytes``: equal to ``allocated_bytes``: a block is released the moment its
          buffer is gone, as each device has one in-order queue (CUDA's active blocks also
          count freed blocks that another stream may still use);
        - ``allocation`` and ``active``: live buffers, counted;
        - ``segment``: blocks taken from the backend (``_alloc_block`` and adopted kernel
          results) and not given back, counted; the base never splits a block.

        Event counters: ``num_alloc_retries`` (requests that fitted only once the cached blocks
        were given back), ``num_ooms``, ``num_device_alloc`` and ``num_device_free`` (blocks taken
        from and given back to the backend).

        accelkit's flat keys (``accelkit.stats()``, the run report): ``allocated_bytes.current``
        and ``.peak``, ``requested_bytes.current``, ``reserved_bytes.current`` and ``.peak``,
        ``cached_bytes.current``, ``capacity_bytes``, ``num_allocations``, ``num_frees``,
        ``num_cache_hits``.
        """
        with self._lock:
            books = self._books
            live, frees = books.live, books.frees
            segments, released = live + books.cached_blocks, books.device_frees
            reserved = self._reserved()
            figures = {  # current, peak, freed
                "allocation": (live, books.peak_live, frees),
                "segment": (segments, books.peak_segments, released),
                "allocated_bytes": (books.allocated, books.peak_allocated, books.freed_bytes),
                "requested_bytes": (books.requested, books.peak_requested, books.freed_requested),
                "reserved_bytes": (reserved, books.peak_reserved, books.released_bytes),
            }
            figures["active"] = figures["allocation"]
            figures["active_bytes"] = figures["allocated_bytes"]
            stats = {}
            for name, (current, peak, freed) in figures.items():
                stats[f"{name}.all.current"] = current
                stats[f"{name}.all.peak"] = peak
                stats[f"{name}.all.allocated"] = current + freed
                stats[f"{name}.all.freed"] = freed
            stats.update({
                "num_alloc_retries": books.alloc_retries,
                "num_ooms": books.ooms,
                "num_device_alloc": segments + released,
                "num_device_free": released,
                "allocated_bytes.current": books.allocated,
                "allocated_bytes.peak": books.peak_allocated,
                "requested_bytes.current": books.requested,
                "reserved_bytes.current": reserved,
                "reserved_bytes.peak": books.peak_reserved,
                "cached_bytes.current": books.cached_bytes,
                "capacity_bytes": self.capacity,
                "num_allocations": live + frees,
                "num_frees": frees,
                "num_cache_hits": books.cache_hits,
            })
            return stats
