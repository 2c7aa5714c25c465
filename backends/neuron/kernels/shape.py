"""Shape tile programs: cat, flip and constant padding, as DMA copies between strided HBM views.

Every program here moves data HBM -> SBUF -> HBM (a dtype change, when the output's dtype
differs, is a Vector-engine copy in between). :func:`copy_view` is the one helper: it merges the
dims that are dense in both views, puts the first remaining dim on partitions and cuts the rest
into blocks of at most :data:`FMAX` elements, so each DMA walks long contiguous runs when the
views allow it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from accelkit_backends.neuron.launch import OutSpec, chip_dtype, hbm_empty, tile_kernel
from accelkit_backends.neuron.kernels.convert import fill
from accelkit_backends.neuron.sim.isa import Kernel

aten = torch.ops.aten

#: Free elements per partition in one copy tile (8 KiB of fp32).
FMAX = 2048


def free_blocks(shape: tuple[int, ...], fmax: int = FMAX) -> Iterator[tuple[slice, ...]]:
    """Cover an array of ``shape`` by blocks of at most ``fmax`` elements, each a tuple of
    slices with one entry per dim (leading dims one index at a time, the last dim chunked when
    it alone exceeds ``fmax``)."""
    nd = len(shape)
    if nd == 0:
        yield ()
        return
    whole = next((j for j in range(nd) if math.prod(shape[j:]) <= fmax), nd - 1)
    chunk_last = math.prod(shape[whole:]) > fmax
    lead = shape[:whole]
    for index in np.ndindex(*lead):
        head = tuple(slice(i, i + 1) for i in index)
        if chunk_last:
            for c0 in range(0, shape[-1], fmax):
                yield head + (slice(c0, min(shape[-1], c0 + fmax)),)
        else:
            yield head + (slice(None),) * (nd - whole)


def _merged(dst: np.ndarray, src: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two views with size-1 dims dropped and adjacent dims merged where both are dense
    across them (same elements, fewer and longer DMA runs); at least 1-d."""
    dims = [(n, ds, ss) for n, ds, ss in zip(dst.shape, dst.strides, src.strides) if n != 1]
    merged: list[list[int]] = []
    for n, ds, ss in dims:
        if merged and merged[-1][1] == ds * n and merged[-1][2] == ss * n:
            merged[-1] = [merged[-1][0] * n, ds, ss]
        else:
            merged.append([n, ds, ss])
    if not merged:
        merged = [[1, dst.itemsize, src.itemsize]]
    shape = tuple(m[0] for m in merged)
    as_strided = np.lib.stride_tricks.as_strided
    return (as_strided(dst, shape, tuple(m[1] for m in merged), writeable=True),
            as_strided(src, shape, tuple(m[2] for m in merged), writeable=False))


def _folded(dst: np.ndarray, src: np.ndarray, partitions: int) -> tuple[np.ndarray, np.ndarray]:
    """The leading whole rows of 1-d views refolded as ``[rows, cols]``, so a long vector spreads
    over many partitions instead of one; the caller copies the remaining tail."""
    n = dst.shape[0]
    cols = max(1, math.ceil(n / partitions))
    rows = n // cols
    as_strided = np.lib.stride_tricks.as_strided
    return (as_strided(dst, (rows, cols), (cols * dst.strides[0], dst.strides[0]), writeable=True),
            as_strided(src, (rows, cols), (cols * src.strides[0], src.strides[0]), writeable=False))


def copy_view(k: Kernel, dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` (same shape; any strides; ``dst`` may have another dtype) through SBUF."""
    if dst.shape != src.shape:
        raise ValueError(f"copy_view: shapes {dst.shape} and {src.shape} differ")
    if dst.size == 0:
        return
    if _transposed(src) and k.spec.transpose_in_dma and chip_dtype(dst.dtype) == chip_dtype(src.dtype):
        _copy_transposed(k, dst, src)
        return
    dst, src = _merged(dst, src)
    p = k.spec.partitions
    if dst.ndim >= 3:
        # The outer dim with the most rows goes on the partitions (an elementwise copy may take
        # its dims in any order): [8, 32, 128] copies as 32 rows of 8x128, not 8-row slivers.
        rows = max(range(dst.ndim - 1), key=lambda d: (min(dst.shape[d], p), dst.shape[d]))
        dst, src = np.moveaxis(dst, rows, 0), np.moveaxis(src, rows, 0)
    if dst.ndim == 1:
        body_dst, body_src = _folded(dst, src, p)
        done = body_dst.size
        _copy_nd(k, body_dst, body_src)
        if done < dst.shape[0]:
            _copy_nd(k, dst[done:].reshape(1, -1), src[done:].reshape(1, -1))
        return
    _copy_nd(k, dst, src)


def _transposed(src: np.ndarray) -> bool:
    """The last two dims are swapped in memory: a column-major matrix (or a stack of them),
    which element-sized DMA runs would copy slowly."""
    item = src.dtype.itemsize
    return src.ndim >= 2 and src.shape[-1] > 1 and src.shape[-2] > 1 and src.strides[-2] == item \
        and src.strides[-1] != item


def _copy_transposed(k: Kernel, dst: np.ndarray, src: np.ndarray) -> None:
    """Copy matrix by matrix with DMA transposes, which read the source's contiguous columns
    (NeuronCore-v3 and later; v2 transposes on the Tensor engine)."""
    p = k.spec.partitions
    rows, cols = src.shape[-2:]
    tiles = k.pool(COPY_BUFFERS)
    for index in np.ndindex(*src.shape[:-2]):  # one () for a single matrix
        matrix_src, matrix_dst = src[index], dst[index]
        for r0 in range(0, rows, p):
            for c0 in range(0, cols, FMAX):
                block = (slice(r0, min(rows, r0 + p)), slice(c0, min(cols, c0 + FMAX)))
                part = matrix_src[block]
                tile = tiles.tile(part.shape, chip_dtype(src.dtype), "copy")
                k.dma(tile, part.T, transpose=True)
                k.dma(matrix_dst[block], tile)
    tiles.release()


#: Tiles in flight in a copy: the next blocks load while earlier ones store.
COPY_BUFFERS = 4


def _copy_nd(k: Kernel, dst: np.ndarray, src: np.ndarray) -> None:
    p = k.spec.partitions
    src_dtype, dst_dtype = chip_dtype(src.dtype), chip_dtype(dst.dtype)
    loaded, converted = k.pool(COPY_BUFFERS), k.pool(COPY_BUFFERS)
    for r0 in range(0, dst.shape[0], p):
        rows = slice(r0, min(dst.shape[0], r0 + p))
        for block in free_blocks(dst.shape[1:]):
            index = (rows,) + block
            part = src[index]
            tile = loaded.tile(part.shape, src_dtype, "copy")
            k.dma(tile, part)
            if dst_dtype != src_dtype:
                wide = converted.tile(part.shape, dst_dtype, "converted")
                k.tensor_copy(wide, tile)
                tile = wide
            k.dma(dst[index], tile)
    loaded.release()
    converted.release()


# ---------------------------------------------------------------------------------------------
# cat and constant_pad_nd
# ---------------------------------------------------------------------------------------------


@tile_kernel(aten.cat.default, static=True)
def cat(k: Kernel, out: list[OutSpec], tensors: list[np.ndarray], dim: int = 0) -> np.ndarray:
    """Each input DMA-copied into its slice of the output (legacy empty 1-d inputs skipped)."""
    result = hbm_empty(out[0])
    if result.ndim == 0 or result.size == 0:
        return result
    dim %= result.ndim
    offset = 0
    for tensor in tensors:
        if tensor.ndim == 1 and tensor.shape[0] == 0 and result.ndim != 1:
            continue
        size = tensor.shape[dim]
        index = (slice(None),) * dim + (slice(offset, offset + size),)
        copy_view(k, result[index], tensor)
        offset += size
    return result


@tile_kernel(aten.constant_pad_nd.default, static=True)
def constant_pad_nd(k: Kernel, out: list[OutSpec], x: np.ndarray, pad: list[int], value: Any = 0) -> np.ndarray:
    """The output filled with ``value`` (memset tiles stored by DMA), then the kept part of
    ``x`` copied into its interior; negative pads crop."""
    result = fill(k, out[0], value)
    src_index, dst_index = [slice(None)] * x.ndim, [slice(None)] * x.ndim
    for i in range(len(pad) // 2):
        d = x.ndim - 1 - i
        low, high = pad[2 * i], pad[2 * i + 1]
        kept = x.shape[d] + min(low, 0) + min(high, 0)
        if kept <= 0:
            return result
        src_index[d] = slice(max(-low, 0), max(-low, 0) + kept)
        dst_index[d] = slice(max(low, 0), max(low, 0) + kept)
    copy_view(k, result[tuple(dst_index)], x[tuple(src_index)])
    return result


@tile_kernel(aten.flip.default, static=True)
def flip(k: Kernel, out: list[OutSpec], x: np.ndarray, dims: list[int]) -> np.ndarray:
    """A DMA copy through SBUF that walks ``x`` backwards along ``dims`` (a negative-stride
    access pattern: element-sized descriptors along a flipped innermost dim)."""
    result = hbm_empty(out[0])
    flipped = {d % x.ndim for d in dims} if x.ndim else set()
    copy_view(k, result, x[tuple(slice(None, None, -1) if d in flipped else slice(None) for d in range(x.ndim))])
    return result
