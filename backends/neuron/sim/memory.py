"""On-chip memories (SBUF, PSUM) and tiles.

A tile is a tensor in SBUF or PSUM whose dim 0 is the partition dim (at most 128) and whose
other dims are free dims (N-tile). It occupies the same byte range ``[offset, offset + free
bytes)`` in each of its partitions. SBUF is allocated per byte; PSUM in whole 2 KiB banks, and a
matmul accumulator must fit one bank (512 fp32, N-arch2). Running out is an error that names
the kernel, the request and what is alive — never a silent success.

Allocation is next-fit: a tile goes in the first gap at or after the end of the tile allocated
before it, wrapping to the lowest gap at the top. A compiler assigns a program's buffers so that
independent work does not wait to reuse memory another instruction still reads; first-fit would
hand the memory a tile freed a moment ago to the next tile, a write-after-read dependency the
compiled program does not have. A multi-buffered pool (``Kernel.pool``) is the exception: its
``bufs`` buffers are its own, each new tile takes the memory of the oldest, so the pool's depth
still bounds how far its loads run ahead.

Tiles carry scheduling state (when their data is ready, when they were last read) so the core
can order instructions by their data dependencies, including reuse of freed memory.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from accelkit_backends.neuron.sim.errors import PsumOverflowError, SbufOverflowError, TileShapeError

_NO_TIME = 0.0


class Tile:
    """A tensor in SBUF or PSUM. ``tile[a:b, c:d]`` is a sub-tile sharing memory and state."""

    __slots__ = ("memory", "data", "_base", "offset", "nbytes", "name", "ready_at", "read_until", "freed",
                 "checked")

    def __init__(self, memory: OnChipMemory, data: np.ndarray, offset: int, nbytes: int, name: str,
                 base: Tile | None = None, available_at: float = _NO_TIME):
        self.memory = memory
        self.data = data
        # None for a base tile: a reference to itself would make every tile a cycle, its data
        # freed by the cyclic collector only, long after the kernel.
        self._base = base
        self.offset = offset
        self.nbytes = nbytes
        self.name = name
        self.ready_at = available_at   # end of the last write (or when the memory became free)
        self.read_until = available_at  # end of the last read
        self.freed = False
        #: Holds int64 data on the 32-bit datapath: a result outside int32 is an error, where a
        #: plain int32 tile wraps as two's-complement hardware does.
        self.checked = base.checked if base is not None else False

    @property
    def base(self) -> Tile:
        """The tile this one is a sub-tile of (itself for a tile allocated as such)."""
        return self._base if self._base is not None else self

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def partitions(self) -> int:
        return self.data.shape[0]

    @property
    def free_size(self) -> int:
        """Elements per partition."""
        return math.prod(self.data.shape[1:])

    def __getitem__(self, index: Any) -> Tile:
        view = self.data[index]
        if view.ndim != self.data.ndim:
            raise TileShapeError(f"tile {self.name}: index {index!r} drops a dim; slice with a:b instead")
        return Tile(self.memory, view, self.offset, self.nbytes, self.name, base=self.base)

    def __repr__(self) -> str:
        return f"Tile({self.name}, {self.memory.name}, shape={self.shape}, dtype={self.dtype})"


class OnChipMemory:
    """One of SBUF or PSUM: per-partition byte space with next-fit allocation.

    :param granule: allocation unit in bytes per partition (PSUM: one bank).
    """

    def __init__(self, name: str, partitions: int, partition_bytes: int, granule: int = 1):
        self.name = name
        self.partitions = partitions
        self.partition_bytes = partition_bytes
        self.granule = granule
        self._live: dict[int, Tile] = {}         # offset -> live base tile
        self._released: list[tuple[int, int, float]] = []  # (offset, end, free time)
        self.high_water = 0
        #: Bytes per partition of the live tiles, and their most since the last reset.
        self._in_use = 0
        self.peak = 0
        self._floor = 0  # where allocation looks first: after the last tile (see reset)

    def reset(self, keep_released: bool = False) -> None:
        """Free everything. ``keep_released`` (between the kernels of a program) keeps the
        timeline's record of when freed memory becomes free, and has the next kernel allocate
        above the memory this one used first, as a compiler lays out a whole program's buffers:
        independent kernels then overlap instead of waiting for each other's memory."""
        self._live.clear()
        if keep_released:
            self._floor = self.high_water if self.high_water < self.partition_bytes else 0
        else:
            self._released.clear()
            self._floor = 0
        self.high_water = 0
        self._in_use = self.peak = 0

    def forget_released(self) -> None:
        self._released.clear()

    def in_use(self) -> int:
        return self._in_use

    def allocate(self, shape: tuple[int, ...], dtype: np.dtype, name: str, kernel: str,
                 at: int | None = None) -> Tile:
        """A new tile; at offset ``at`` when its bytes are free there (a pool's buffer), else
        next-fit."""
        if not shape or shape[0] < 1:
            raise TileShapeError(f"{kernel}: tile {name} needs a partition dim, got shape {shape}")
        if shape[0] > self.partitions:
            raise TileShapeError(
                f"{kernel}: tile {name} spans {shape[0]} partitions; a NeuronCore has "
                f"{self.partitions} (split the partition dim into tiles of at most {self.partitions})"
            )
        dtype = np.dtype(dtype)
        free_bytes = max(1, math.prod(shape[1:])) * dtype.itemsize
        nbytes = -(-free_bytes // self.granule) * self.granule
        offset = at if at is not None and self._free_at(at, nbytes) else self._next_fit(nbytes)
        if offset is None:
            raise self._overflow(kernel, name, shape, dtype, nbytes)
        end = offset + nbytes
        if at is None:
            self._floor = end if end < self.partition_bytes else 0
        data = np.zeros(shape, dtype=dtype)
        tile = Tile(self, data, offset, nbytes, name)
        self._live[offset] = tile
        self.high_water = max(self.high_water, end)
        self._in_use += nbytes
        self.peak = max(self.peak, self._in_use)
        return tile

    def make_available(self, tile: Tile) -> None:
        """Time a new tile: its memory is free once every freed tile it overlaps was last used
        (a dependency of the timeline, kept apart from :meth:`allocate` so that a kernel may
        time its instructions after running them; see ``Kernel``)."""
        end = tile.offset + tile.nbytes
        tile.ready_at = tile.read_until = max(
            (t for o, e, t in self._released if o < end and tile.offset < e), default=_NO_TIME)

    def release(self, tile: Tile) -> Tile | None:
        """Free a tile's memory for new tiles; returns its base tile, or None if it was freed
        already. :meth:`note_release` records when the memory is free on the timeline."""
        base = tile.base
        if base.freed:
            return None
        base.freed = True
        if self._live.pop(base.offset, None) is not None:
            self._in_use -= base.nbytes
        return base

    def note_release(self, base: Tile) -> None:
        free_time = max(base.ready_at, base.read_until)
        self._released.append((base.offset, base.offset + base.nbytes, free_time))

    def _free_at(self, offset: int, nbytes: int) -> bool:
        end = offset + nbytes
        return end <= self.partition_bytes and not any(
            o < end and offset < o + t.nbytes for o, t in self._live.items())

    def _next_fit(self, nbytes: int) -> int | None:
        """The lowest free offset at or above the floor (where the last tile ended, or where a
        program's next kernel begins) where ``nbytes`` fit, else the lowest anywhere."""
        gaps, cursor = [], 0
        for offset in sorted(self._live):
            if offset > cursor:
                gaps.append((cursor, offset))
            cursor = max(cursor, offset + self._live[offset].nbytes)
        gaps.append((cursor, self.partition_bytes))
        for low, high in gaps:
            start = max(low, self._floor)
            if high - start >= nbytes:
                return start
        return next((low for low, high in gaps if high - low >= nbytes), None)

    def _overflow(self, kernel: str, name: str, shape: tuple, dtype: np.dtype, nbytes: int) -> Exception:
        live = ", ".join(f"{t.name}{list(t.shape)}" for t in self._live.values()) or "nothing"
        message = (
            f"{kernel}: tile {name} {list(shape)} {dtype} needs {nbytes} B per partition in "
            f"{self.name}, which has {self.partition_bytes} B per partition with "
            f"{self.in_use()} B in use (live: {live}). Use smaller tiles or free tiles "
            "that are no longer needed."
        )
        if self.granule > 1:
            return PsumOverflowError(
                message + f" PSUM has {self.partition_bytes // self.granule} banks of "
                f"{self.granule} B; an accumulator must fit one bank."
            )
        return SbufOverflowError(message)
