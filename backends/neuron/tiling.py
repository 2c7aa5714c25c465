"""Tiling helpers shared by the tile programs: how flat data maps onto 128 partitions."""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from accelkit_backends.neuron.launch import chip_dtype
from accelkit_backends.neuron.sim.isa import Kernel, TilePool, contiguous_run_bytes
from accelkit_backends.neuron.sim import cost, replay
from accelkit_backends.neuron.sim.memory import Tile

#: Free elements per partition in one elementwise tile: 8 KiB of fp32, so a handful of
#: double-buffered operands stay far below SBUF's per-partition size on every generation.
FMAX = 2048
#: Buffers per streamed operand: the chunk computed, the one prefetched, the one being stored.
BUFFERS = 3


def flat_chunks(n: int, partitions: int, fmax: int = FMAX) -> Iterator[tuple[int, int, int]]:
    """Cover ``range(n)`` by ``(start, rows, cols)``: elements ``[start, start + rows*cols)``
    laid out as a ``[rows, cols]`` tile (rows on partitions), the tail as one short row."""
    cols = min(fmax, max(1, math.ceil(n / partitions)))
    start = 0
    while n - start >= cols:
        rows = min(partitions, (n - start) // cols)
        yield start, rows, cols
        start += rows * cols
    if start < n:
        yield start, 1, n - start


class FlatOperand:
    """An HBM input read in the flat order of an output of ``shape`` (broadcast as needed)."""

    def __init__(self, array: np.ndarray, shape: tuple[int, ...]):
        self.array = array
        self.scalar = array.size == 1
        view = np.broadcast_to(array, shape)
        self.pattern = view
        self.memory_order = _memory_order(view)
        if view.flags.c_contiguous:
            self.flat = view.reshape(-1)
        else:  # the values, densely, for the simulator to read (made again at each replay)
            recording = replay.active()
            self.flat = _dense(view) if recording is None else recording.derived(_dense, view)
        self.tile_dtype = chip_dtype(array.dtype)

    def load(self, pool: TilePool, start: int, rows: int, cols: int, name: str) -> Tile:
        k = pool._kernel
        if self.scalar:
            tile = pool.tile((rows, 1), self.tile_dtype, name)
            k.dma(tile, np.broadcast_to(self.array.reshape(1, 1), (rows, 1)))
            return tile
        tile = pool.tile((rows, cols), self.tile_dtype, name)
        part = self.flat[start : start + rows * cols].reshape(rows, cols)
        if self.memory_order is not None:
            k.dma(tile, part, pattern=self.memory_order, reordered=True)
            return tile
        contiguous = self.pattern.flags.c_contiguous
        # A strided or broadcast input is costed by the walk over its view (every chunk of it
        # has the same run structure), not by the dense copy the simulator reads values from.
        k.dma(tile, part, pattern=None if contiguous else self.pattern)
        return tile


def _dense(view: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(view).reshape(-1)


def _memory_order(view: np.ndarray) -> np.ndarray | None:
    """For a view whose dims are a permutation of a dense block's (a transposed tensor) and whose
    walk in its own order has runs too short for a DMA (``cost.DMA_EFFICIENT_RUN_BYTES``), the
    block in memory order: such a view is loaded in that order and reordered on chip
    (``Kernel.dma(reordered=True)``), as a compiler loads it. None for any other view."""
    if view.flags.c_contiguous or any(stride == 0 and size > 1 for size, stride in zip(view.shape, view.strides)):
        return None
    if contiguous_run_bytes(view) >= cost.DMA_EFFICIENT_RUN_BYTES:
        return None
    order = sorted(range(view.ndim), key=lambda d: -abs(view.strides[d]))
    block = view.transpose(order)
    return block if block.flags.c_contiguous else None


class FlatMap(NamedTuple):
    """One elementwise program as :func:`map_flat` was asked to run it."""

    out: np.ndarray
    inputs: list[np.ndarray]
    compute: Callable[[Tile, list[Tile]], None]
    tile_dtype: np.dtype


_recording = threading.local()


@contextlib.contextmanager
def recording_flat_maps() -> Iterator[list[FlatMap]]:
    """Within the block, :func:`map_flat` runs nothing: it appends what it was asked to run to
    the yielded list and returns ``out`` unwritten (the graph compiler's fusion collects an op
    chain's programs this way, then runs them as one with :func:`map_flat_fused`)."""
    previous = getattr(_recording, "maps", None)
    _recording.maps = maps = []
    try:
        yield maps
    finally:
        _recording.maps = previous


def map_flat(
    k: Kernel,
    out: np.ndarray,
    inputs: Sequence[np.ndarray],
    compute: Callable[[Tile, list[Tile]], None],
    out_tile_dtype: Any = None,
) -> np.ndarray:
    """Run ``compute(dst, srcs)`` over ``out`` chunk by chunk: load each input's chunk (size-1
    inputs as a [rows, 1] per-partition scalar), compute into ``dst``, store ``dst``.

    Software-pipelined: the next chunk's loads are issued before this chunk's compute and store
    (DMA queues run in order), into other buffers, so transfers overlap the engines' work.
    Temporaries ``compute`` allocates live until the chunk after next begins.
    """
    recorded = getattr(_recording, "maps", None)
    if recorded is not None:
        recorded.append(FlatMap(out, list(inputs), compute, np.dtype(out_tile_dtype or chip_dtype(out.dtype))))
        return out
    out_pool = k.pool(BUFFERS)
    flat_out = out.reshape(-1)
    tile_dtype = out_tile_dtype or chip_dtype(out.dtype)

    def step(srcs: list[Tile], start: int, rows: int, cols: int) -> list[Tile]:
        dst = out_pool.tile((rows, cols), tile_dtype, "out")
        compute(dst, srcs)
        k.dma(flat_out[start : start + rows * cols].reshape(rows, cols), dst)
        return [dst]

    _pipelined(k, [FlatOperand(a, out.shape) for a in inputs], flat_chunks(out.size, k.spec.partitions), step)
    return out


def map_flat_outputs(
    k: Kernel,
    outs: Sequence[np.ndarray],
    inputs: Sequence[np.ndarray],
    compute: Callable[[list[Tile]], list[Tile]],
) -> None:
    """:func:`map_flat` for a program with several outputs of one shape (an optimizer step
    writes a parameter and its moments): ``compute(srcs)`` returns one tile per output, in
    ``outs``' order, each stored to its output (rounded to its dtype first when the tile's
    differs). Software-pipelined as :func:`map_flat` is."""
    shape = outs[0].shape
    flat_outs = [out.reshape(-1) for out in outs]

    def step(srcs: list[Tile], start: int, rows: int, cols: int) -> list[Tile]:
        for flat_out, tile in zip(flat_outs, compute(srcs)):
            dtype = chip_dtype(flat_out.dtype)
            if tile.dtype != dtype:
                rounded = k.sbuf(tile.shape, dtype, "rounded")
                k.tensor_copy(rounded, tile)
                tile = rounded
            k.dma(flat_out[start : start + rows * cols].reshape(rows, cols), tile)
        return []  # every tile is a temporary, freed BUFFERS chunks later

    _pipelined(k, [FlatOperand(a, shape) for a in inputs], flat_chunks(outs[0].size, k.spec.partitions), step)


def _pipelined(k: Kernel, operands: Sequence[FlatOperand], chunks: Iterator[tuple[int, int, int]],
               step: Callable[[list[Tile], int, int, int], list[Tile]]) -> None:
    """The chunk loop of :func:`map_flat` and :func:`map_flat_fused`: ``step(srcs, start, rows,
    cols)`` computes and stores one chunk from its operands' tiles and returns the tiles it keeps
    (its outputs). Loads run one chunk ahead, into other buffers; the temporaries a step
    allocates are freed once :data:`BUFFERS` newer chunks have begun."""
    pools = [k.pool(BUFFERS) for _ in operands]

    def load(chunk: tuple[int, int, int]) -> list[Tile]:
        start, rows, cols = chunk
        return [op.load(pool, start, rows, cols, f"in{i}") for i, (op, pool) in enumerate(zip(operands, pools))]

    chunks = list(chunks)
    scratch: list[list[Tile]] = []
    loaded = load(chunks[0]) if chunks else []
    for index, (start, rows, cols) in enumerate(chunks):
        srcs = loaded
        if index + 1 < len(chunks):
            loaded = load(chunks[index + 1])
        if len(scratch) >= BUFFERS:
            k.free(*scratch.pop(0))
        before = {id(t) for t in k.live_tiles()}
        kept = {id(t) for t in step(srcs, start, rows, cols)}
        scratch.append([t for t in k.live_tiles() if id(t) not in before and id(t) not in kept])


class NotFusable(Exception):
    """A recorded chain cannot run as one program (the caller runs its ops one by one)."""


def map_flat_fused(k: Kernel, maps: Sequence[FlatMap], stored: Sequence[bool], fmax: int = FMAX) -> None:
    """Run several elementwise programs of one output shape as one: per chunk, every array
    input is loaded once, each program computes into its own tile from the tiles of the
    programs before it (an input that is an earlier program's ``out`` never leaves SBUF), and
    only the outputs flagged in ``stored`` are written to HBM. ``fmax`` narrows the chunks so
    that every buffer of a long chain fits in SBUF (see :func:`fused_columns`).

    Each program computes exactly what it computes alone, on the same chunks and tile dtypes,
    so results are those of running the programs one by one. Raises :class:`NotFusable` when
    an earlier output's tile would differ from what loading it from HBM gives.
    """
    shape = maps[0].out.shape
    producer: dict[int, int] = {}
    externals: list[np.ndarray] = []
    external_index: dict[int, int] = {}
    wiring: list[list[tuple[bool, int]]] = []
    for position, flat in enumerate(maps):
        if flat.out.shape != shape:
            raise NotFusable(f"output shapes {shape} and {flat.out.shape}")
        wires = []
        for array in flat.inputs:
            source = producer.get(id(array))
            if source is not None:
                if maps[source].tile_dtype != chip_dtype(array.dtype):
                    raise NotFusable("an intermediate computed in another dtype than it is stored in")
                wires.append((True, source))
                continue
            index = external_index.get(id(array))
            if index is None:
                index = external_index[id(array)] = len(externals)
                externals.append(array)
            wires.append((False, index))
        wiring.append(wires)
        producer[id(flat.out)] = position

    out_pools = [k.pool(BUFFERS if keep else 2) for keep in stored]
    flat_outs = [flat.out.reshape(-1) for flat in maps]

    def step(srcs: list[Tile], start: int, rows: int, cols: int) -> list[Tile]:
        dsts: list[Tile] = []
        for position, flat in enumerate(maps):
            dst = out_pools[position].tile((rows, cols), flat.tile_dtype, f"out{position}")
            flat.compute(dst, [dsts[i] if internal else srcs[i] for internal, i in wiring[position]])
            dsts.append(dst)
            if stored[position]:
                k.dma(flat_outs[position][start : start + rows * cols].reshape(rows, cols), dst)
        return dsts

    operands = [FlatOperand(a, shape) for a in externals]
    _pipelined(k, operands, flat_chunks(maps[0].out.size, k.spec.partitions, fmax), step)


#: The narrowest chunk a fused chain may use before it is split instead (narrower chunks pay
#: each instruction's fixed access cost more often).
MIN_FUSED_COLUMNS = 256


def fused_columns(operands: int, programs: int, budget: int) -> int:
    """The widest chunk (free elements per partition, at most :data:`FMAX`) with which
    :func:`map_flat_fused`'s buffers for ``operands`` array inputs and ``programs`` outputs fit
    in ``budget`` bytes per partition, counting 4-byte elements and every buffer (temporaries a
    program allocates come on top). Results do not depend on the width: every op of a chain is
    elementwise."""
    return min(FMAX, budget // ((operands + programs) * BUFFERS * 4))


def map_block_fused(k: Kernel, maps: Sequence[FlatMap], stored: Sequence[bool], head: np.ndarray,
                    block: Tile, m0: int, m1: int, n0: int, n1: int) -> None:
    """Run elementwise programs of a 2-D output on one block ``[m0:m1, n0:n1]``: ``block`` holds
    that block of ``head`` (an input of the programs, a matmul's result still in SBUF), other
    inputs load their block (a size-1 input as a per-partition scalar, as :func:`map_flat`
    loads it), and only the outputs flagged in ``stored`` are written to HBM. Raises
    :class:`NotFusable` as :func:`map_flat_fused` does."""
    rows, cols = block.shape
    tiles: dict[int, Tile] = {id(head): block}
    dtypes: dict[int, np.dtype] = {id(head): block.dtype}
    for position, flat in enumerate(maps):
        srcs = []
        for array in flat.inputs:
            tile = tiles.get(id(array))
            if tile is None:
                tile = tiles[id(array)] = _block_of(k, array, flat.out.shape, m0, m1, n0, n1)
            elif id(array) in dtypes and dtypes[id(array)] != chip_dtype(array.dtype):
                raise NotFusable("an intermediate computed in another dtype than it is stored in")
            srcs.append(tile)
        dst = k.sbuf((rows, cols), flat.tile_dtype, f"out{position}")
        flat.compute(dst, srcs)
        tiles[id(flat.out)] = dst
        dtypes[id(flat.out)] = flat.tile_dtype
        if stored[position]:
            k.dma(flat.out[m0:m1, n0:n1], dst)


def _block_of(k: Kernel, array: np.ndarray, shape: tuple[int, ...], m0: int, m1: int, n0: int, n1: int) -> Tile:
    dtype = chip_dtype(array.dtype)
    if array.size == 1:
        tile = k.sbuf((m1 - m0, 1), dtype, "scalar")
        k.dma(tile, np.broadcast_to(array.reshape(1, 1), (m1 - m0, 1)))
        return tile
    tile = k.sbuf((m1 - m0, n1 - n0), dtype, "in")
    k.dma(tile, np.broadcast_to(array, shape)[m0:m1, n0:n1])
    return tile


# ---------------------------------------------------------------------------------------------
# complex64 as float32 pairs
# ---------------------------------------------------------------------------------------------


def pairs(array: np.ndarray) -> np.ndarray:
    """A complex64 HBM array's memory as float32 ``(real, imaginary)`` pairs: shape ``S + (2,)``
    for an array of shape ``S``, same strides plus the 4-byte step inside a pair (a view, no
    copy). This is how a complex64 tensor lies in HBM: interleaved float32."""
    if array.dtype != np.complex64:
        raise TypeError(f"pairs: expected a complex64 array, got {array.dtype}")
    real = array.real  # a float32 view at the same address and strides
    return np.lib.stride_tricks.as_strided(real, array.shape + (2,), array.strides + (4,))


class PairOperand:
    """An HBM input of a complex program read in the flat order of an output of shape ``S``:
    a complex64 array as ``[rows, cols, 2]`` tiles of float32 pairs, a real array as
    ``[rows, cols, 1]`` tiles (broadcast as needed, a single element included: the DMA walks
    the broadcast pattern)."""

    def __init__(self, array: np.ndarray, shape: tuple[int, ...]):
        self.complex = array.dtype == np.complex64
        source = pairs(array) if self.complex else array[..., None]
        width = 2 if self.complex else 1
        view = np.broadcast_to(source, shape + (width,))
        self.pattern = view
        if view.flags.c_contiguous:
            self.flat = view.reshape(-1, width)
        else:  # the values, densely, for the simulator to read (made again at each replay)
            recording = replay.active()
            dense = _dense(view) if recording is None else recording.derived(_dense, view)
            self.flat = dense.reshape(-1, width)
        self.width = width
        self.tile_dtype = chip_dtype(array.dtype) if not self.complex else np.dtype(np.float32)

    def load(self, pool: TilePool, start: int, rows: int, cols: int, name: str) -> Tile:
        k = pool._kernel
        tile = pool.tile((rows, cols, self.width), self.tile_dtype, name)
        part = self.flat[start : start + rows * cols].reshape(rows, cols, self.width)
        k.dma(tile, part, pattern=None if self.pattern.flags.c_contiguous else self.pattern)
        return tile


def map_pairs(
    k: Kernel,
    out: np.ndarray,
    inputs: Sequence[np.ndarray],
    compute: Callable[[Tile, list[Tile]], None],
) -> np.ndarray:
    """:func:`map_flat` for a complex64 result: ``compute(dst, srcs)`` fills a ``[rows, cols, 2]``
    float32 tile of (real, imaginary) pairs from its inputs' tiles (:class:`PairOperand`:
    ``[rows, cols, 2]`` for complex inputs, ``[rows, cols, 1]`` for real ones), chunk by chunk,
    software-pipelined as :func:`map_flat` is. A pair never straddles two tiles, so the real
    and imaginary parts of an element sit side by side in one partition, where the engines
    reach them with a stride-2 access pattern (``tile[:, :, 0:1]`` and ``tile[:, :, 1:2]``)."""
    if out.dtype != np.complex64 or not out.flags.c_contiguous:
        raise TypeError("map_pairs writes a fresh contiguous complex64 array")
    out_pool = k.pool(BUFFERS)
    flat_out = out.reshape(-1).view(np.float32).reshape(-1, 2)

    def step(srcs: list[Tile], start: int, rows: int, cols: int) -> list[Tile]:
        dst = out_pool.tile((rows, cols, 2), np.float32, "out")
        compute(dst, srcs)
        k.dma(flat_out[start : start + rows * cols].reshape(rows, cols, 2), dst)
        return [dst]

    operands = [PairOperand(a, out.shape) for a in inputs]
    # Half the columns of a real program: a chunk's tile holds FMAX float32 values per partition.
    _pipelined(k, operands, flat_chunks(out.size, k.spec.partitions, FMAX // 2), step)
    return out
