"""Matmul tile programs on the Tensor engine: mm, addmm, bmm (linear and baddbmm decompose).

``C[M, N] = A[M, K] @ B[K, N]`` contracts over the partition dim, so the program needs ``Aᵀ``
tiles ``[K, M]`` (stationary, M ≤ 128) and ``B`` tiles ``[K, N]`` (moving, N ≤ 512), K ≤ 128 per
matmul with accumulation over K in an fp32 PSUM bank (N-mm). Operands stored transposed
(``x.t()`` views, as ``linear`` passes its weight) load with a DMA transpose on NeuronCore-v3+
or a Tensor-engine transpose on v2; row-major ones load directly.

Rows are processed in blocks of up to four 128-row tiles so that each ``B`` tile loaded feeds four
matmuls, which keeps the Tensor engine, not HBM, the bottleneck for large products.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from accelkit_backends.neuron.launch import OutSpec, chip_dtype, hbm_empty, tile_kernel
from accelkit_backends.neuron.sim.isa import Kernel, TilePool
from accelkit_backends.neuron.sim.memory import Tile

aten = torch.ops.aten

#: Row tiles sharing each loaded B tile.
ROW_TILES_PER_BLOCK = 4
#: B tiles in flight at least: DMA's fixed latency (~1.3 us) spans several matmuls.
MOVING_BUFFERS = 6
#: SBUF bytes per partition the B tiles in flight may use: a product whose B fits loads all of
#: it ahead (a weight streams in while the kernels before it still run).
MOVING_BUDGET = 48 * 1024
#: SBUF bytes per partition the resident Aᵀ panel may use (a third of the smallest SBUF).
PANEL_BUDGET = 64 * 1024


def _tiles(n: int, size: int) -> list[tuple[int, int]]:
    return [(i, min(n, i + size)) for i in range(0, n, size)] or [(0, 0)]


def load_k_major(k: Kernel, view: np.ndarray, k0: int, k1: int, n0: int, n1: int, name: str,
                 pool: TilePool | None = None) -> Tile:
    """The block ``view[k0:k1, n0:n1]`` as an SBUF tile with K on partitions (from ``pool``
    if given)."""
    dtype = chip_dtype(view.dtype)
    part = view[k0:k1, n0:n1]
    tile = (pool.tile if pool is not None else k.sbuf)((k1 - k0, n1 - n0), dtype, name)
    item = view.dtype.itemsize
    column_major = part.shape[1] > 1 and part.strides[0] == item and part.strides[1] != item
    if not column_major:
        k.dma(tile, part)
    elif k.spec.transpose_in_dma:
        k.dma(tile, part.T, transpose=True)
    else:
        for c0, c1 in _tiles(n1 - n0, k.spec.partitions):
            with k.scope():
                rows = k.sbuf((c1 - c0, k1 - k0), dtype, name + "_rows")
                k.dma(rows, part.T[c0:c1])
                flipped = k.psum((k1 - k0, c1 - c0), np.float32, name + "_t")
                k.transpose(flipped, rows)
                k.tensor_copy(tile[:, c0:c1], flipped)
    return tile


def matmul_2d(k: Kernel, a: np.ndarray, b: np.ndarray, out: np.ndarray,
              epilogue: Any = None) -> np.ndarray:
    """``out = epilogue(a @ b)``; ``epilogue(k, acc, result, m0, m1, n0, n1)`` writes the SBUF
    tile ``result`` (``out``'s dtype) from the fp32 accumulator block ``acc`` (in PSUM), scaling
    and adding a bias on the way: the engines compute in fp32 and round once, on the write.

    Software-pipelined: ``B`` tiles stream through a rotating pool (loads run ahead of the
    matmuls), accumulators are double-buffered in PSUM, and each column block's results are
    stored after the next block's first loads are issued, so DMA queues never wait on them.
    """
    spec = k.spec
    m, kk = a.shape
    n = b.shape[1]
    p = spec.partitions
    if m == 0 or n == 0:
        return out
    if kk == 0:
        return _empty_product(k, out, epilogue)
    k_tiles = _tiles(kk, p)
    at = a.T
    panel_bytes = len(k_tiles) * p * chip_dtype(a.dtype).itemsize
    # Accumulators are double-buffered in PSUM; v2's Tensor-engine transposes need a bank too.
    banks = (spec.psum_banks - (0 if spec.transpose_in_dma else 1)) // 2
    rows_per_block = max(1, min(ROW_TILES_PER_BLOCK, banks, PANEL_BUDGET // max(panel_bytes, 1))) * p
    resident = panel_bytes <= PANEL_BUDGET
    if m > rows_per_block and _column_major(b) and not spec.transpose_in_dma:
        b = row_major_copy(k, b)  # transpose once instead of once per row block
    moving_tiles = len(k_tiles) * len(_tiles(n, spec.gemm_moving_fmax)) * -(-m // rows_per_block)
    moving_tile_bytes = min(n, spec.gemm_moving_fmax) * chip_dtype(b.dtype).itemsize
    moving_pool = k.pool(max(MOVING_BUFFERS, min(moving_tiles, MOVING_BUDGET // moving_tile_bytes)))
    streamed_pool = k.pool(MOVING_BUFFERS)
    pending: list[tuple] = []  # stores waiting for the next block's loads to be issued

    def flush() -> None:
        while pending:
            accs, rows, n0, n1 = pending.pop(0)
            for (r0, r1), acc in zip(rows, accs):
                with k.scope():
                    _store_block(k, acc, out, r0, r1, n0, n1, epilogue)
                k.free(acc)

    blocks = [[(b0 + r0, b0 + r1) for r0, r1 in _tiles(b1 - b0, p)] for b0, b1 in _tiles(m, rows_per_block)]
    n_tiles = _tiles(n, spec.gemm_moving_fmax)

    def load_panel(rows: list[tuple[int, int]]) -> dict[tuple[int, int], Tile]:
        return {(r0, k0): load_k_major(k, at, k0, k1, r0, r1, "aT") for r0, r1 in rows for k0, k1 in k_tiles}

    panel: dict[tuple[int, int], Tile] = {}  # the block's resident Aᵀ tiles (first block: on first use)
    for index, rows in enumerate(blocks):
        for n_index, (n0, n1) in enumerate(n_tiles):
            if resident and n_index == len(n_tiles) - 1 and index + 1 < len(blocks):
                upcoming = load_panel(blocks[index + 1])  # prefetch while this block finishes
            accs = [k.psum((r1 - r0, n1 - n0), np.float32, "acc") for r0, r1 in rows]
            for step, (k0, k1) in enumerate(k_tiles):
                moving = load_k_major(k, b, k0, k1, n0, n1, "b", moving_pool)
                if step == min(1, len(k_tiles) - 1):
                    flush()
                for (r0, r1), acc in zip(rows, accs):
                    stationary = panel.get((r0, k0))
                    if stationary is None:
                        stationary = load_k_major(k, at, k0, k1, r0, r1, "aT", None if resident else streamed_pool)
                        if resident:
                            panel[r0, k0] = stationary
                    k.matmul(acc, stationary, moving, accumulate=step > 0)
            pending.append((accs, rows, n0, n1))
        k.free(*panel.values())  # its last matmuls are issued; reuse waits for them
        panel = upcoming if resident and index + 1 < len(blocks) else {}
    flush()
    return out


def _empty_product(k: Kernel, out: np.ndarray, epilogue: Any) -> np.ndarray:
    """``out = epilogue(0)`` for an empty contraction (K = 0): the product is zero, but the
    epilogue (``beta * input`` of addmm) still applies, as on every PyTorch device. The zeros
    are written by instructions (a memset and a store), so that a replay of the recorded
    kernel writes them too: a host-side write would leave a reused block's old bytes."""
    m, n = out.shape
    for m0, m1 in _tiles(m, k.spec.partitions):
        for n0, n1 in _tiles(n, k.spec.gemm_moving_fmax):
            with k.scope():
                zero = k.sbuf((m1 - m0, n1 - n0), np.float32, "zero")
                k.memset(zero, 0.0)
                _store_block(k, zero, out, m0, m1, n0, n1, epilogue)
    return out


def _column_major(view: np.ndarray) -> bool:
    return view.ndim == 2 and view.shape[1] > 1 and view.strides[0] == view.dtype.itemsize \
        and view.strides[1] != view.dtype.itemsize


def row_major_copy(k: Kernel, view: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """A row-major HBM copy of a column-major ``view``, made by Tensor-engine transposes (the
    way NeuronCore-v2 transposes). Inside a matmul the copy is kernel-internal scratch, like the
    compiler's; the graph compiler also lays a kept weight out with it, into ``out``
    (:mod:`..parameter_layouts`)."""
    rows, cols = view.shape
    scratch = np.empty((rows, cols), view.dtype) if out is None else out
    sources, accumulators, results = k.pool(6), k.pool(2, "psum"), k.pool(6)
    p = k.spec.partitions
    for (r0, r1), (c0, c1) in ((r, c) for r in _tiles(rows, p) for c in _tiles(cols, p)):
        source = sources.tile((c1 - c0, r1 - r0), chip_dtype(view.dtype), "colsT")
        k.dma(source, view.T[c0:c1, r0:r1])
        flipped = accumulators.tile((r1 - r0, c1 - c0), np.float32, "t")
        k.transpose(flipped, source)
        staged = results.tile((r1 - r0, c1 - c0), chip_dtype(view.dtype), "rows")
        k.tensor_copy(staged, flipped)
        k.dma(scratch[r0:r1, c0:c1], staged)
    for pool in (sources, accumulators, results):
        pool.release()
    return scratch


_consumer = threading.local()


@contextlib.contextmanager
def result_blocks_to(consume: Callable[[Kernel, Tile, int, int, int, int], None], store: bool) -> Iterator[None]:
    """Within the block, every result block of a 2-D matmul (``mm``, ``addmm``), as it is about
    to be stored (rounded to the output dtype), goes to ``consume(k, tile, m0, m1, n0, n1)``
    while still in SBUF (the graph compiler fuses an elementwise tail this way); it is stored
    to HBM only if ``store``."""
    previous = getattr(_consumer, "current", None)
    _consumer.current = (consume, store)
    try:
        yield
    finally:
        _consumer.current = previous


def _store_block(k: Kernel, acc: Tile, out: np.ndarray, m0: int, m1: int, n0: int, n1: int,
                 epilogue: Any) -> None:
    # The accumulator leaves PSUM in one instruction that also applies the epilogue and rounds
    # to the result's dtype, as a compiler evacuates it (not a copy, then the arithmetic).
    result = k.sbuf(acc.shape, chip_dtype(out.dtype), "c")
    if epilogue is None:
        k.tensor_copy(result, acc)
    else:
        epilogue(k, acc, result, m0, m1, n0, n1)
    consumer = getattr(_consumer, "current", None)
    if consumer is not None:
        consume, store = consumer
        consume(k, result, m0, m1, n0, n1)
        if not store:
            return
    k.dma(out[m0:m1, n0:n1], result)


def _bias_epilogue(bias: np.ndarray, shape: tuple[int, int], beta: Any, alpha: Any):
    full = np.broadcast_to(bias, shape)

    def epilogue(k: Kernel, acc: Tile, result: Tile, m0: int, m1: int, n0: int, n1: int) -> None:
        if alpha != 1:
            scaled = k.sbuf(acc.shape, np.float32, "scaled")
            k.tensor_scalar(scaled, acc, "multiply", alpha)
            acc = scaled
        if beta == 0:
            k.tensor_copy(result, acc)
            return
        term = k.sbuf(acc.shape, chip_dtype(bias.dtype), "bias")
        k.dma(term, full[m0:m1, n0:n1])
        if beta != 1:
            k.tensor_scalar(term, term, "multiply", beta)
        k.tensor_tensor(result, acc, term, "add")

    return epilogue


@tile_kernel(aten.mm.default, static=True)
def mm(k: Kernel, out: list[OutSpec], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return matmul_2d(k, a, b, hbm_empty(out[0]))


@tile_kernel(aten.addmm.default, static=True)
def addmm(k: Kernel, out: list[OutSpec], bias: np.ndarray, a: np.ndarray, b: np.ndarray, *,
          beta: Any = 1, alpha: Any = 1) -> np.ndarray:
    result = hbm_empty(out[0])
    return matmul_2d(k, a, b, result, _bias_epilogue(bias, result.shape, beta, alpha))


@tile_kernel(aten.bmm.default, static=True)
def bmm(k: Kernel, out: list[OutSpec], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    result = hbm_empty(out[0])
    for i in range(a.shape[0]):
        matmul_2d(k, a[i], b[i], result[i])
    return result
