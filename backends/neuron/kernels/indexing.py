"""Indexing tile programs: indirect DMA for lookups and scatters, one-hot matmuls for sums.

- ``embedding`` and ``index_select`` gather whole rows with the indirect DMA
  (:meth:`Kernel.gather_rows`): one row per partition, its row number read from SBUF.
- ``gather`` and ``scatter``/``scatter_add`` address single elements: the GpSimd engine turns
  each position into an element offset (``iota``, then integer divide/modulo per dim, the index
  replacing the coordinate along ``dim``) and the DMA gathers or scatters through those offsets
  over the tensor's HBM span, one ``[P, 1]`` column per instruction. ``scatter_add`` uses the
  DMA's read-modify-write add; ``scatter_reduce``'s other reductions gather, combine on the
  engines and scatter back (one partition at a time where a column names an element twice).
- ``index.Tensor`` / ``index_put_`` (advanced indexing) use the same element offsets, with one
  index array per indexed dim read broadcast over the result.
- ``embedding_dense_backward`` sums gradient rows per index as a Tensor-engine matmul: a one-hot
  matrix built from ``iota == index`` contracts the tokens (on partitions) into a PSUM
  accumulator, the standard Trainium formulation of a scatter-add into a small table.

An index outside its dimension raises before anything is written, with the CPU's exception type
and message (``IndexError`` for the lookups and advanced indexing, ``RuntimeError`` naming the
dimension for gather/scatter), followed by what names the op; int64 indices compute as int32.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import torch
from accelkit_backends.neuron import adaptive
from accelkit_backends.neuron.launch import OutSpec, _launcher, chip_dtype, hbm_empty, kernels, tile_kernel
from accelkit_backends.neuron.kernels.convert import fill
from accelkit_backends.neuron.kernels.shape import copy_view, free_blocks
from accelkit_backends.neuron.sim import numerics as nx
from accelkit_backends.neuron.sim.isa import Kernel
from accelkit_backends.neuron.sim.memory import Tile

aten = torch.ops.aten

#: Free elements per partition of a gathered row block (8 KiB of fp32).
ROW_FMAX = 2048
#: Columns of element offsets per chunk in gather/scatter (one indirect DMA each).
COLUMN_FMAX = 64
#: Largest table whose embedding gradient is a one-hot matmul (16 partition tiles of rows).
ONE_HOT_MAX_VOCAB = 2048


def _flat_values(array: np.ndarray) -> np.ndarray:
    """``array``'s elements in row-major order (a view when it is dense)."""
    return np.ascontiguousarray(array).reshape(-1)


def _element_span(array: np.ndarray) -> np.ndarray:
    """The HBM elements from ``array``'s first to its last, as a ``[span, 1]`` view: the table
    an element-granular indirect DMA addresses by offset (strides are never negative here)."""
    item = array.itemsize
    span = 1 + sum((n - 1) * s // item for n, s in zip(array.shape, array.strides) if n > 0)
    return np.lib.stride_tricks.as_strided(array, (span, 1), (item, item), writeable=True)


def _strides(array: np.ndarray) -> tuple[int, ...]:
    return tuple(s // array.itemsize for s in array.strides)


def _chunks(n: int, partitions: int) -> list[tuple[int, int, int]]:
    """``(start, rows, cols)`` covering ``range(n)`` row-major, then a one-row tail."""
    cols = min(COLUMN_FMAX, max(1, math.ceil(n / partitions)))
    out, start = [], 0
    while n - start >= cols:
        rows = min(partitions, (n - start) // cols)
        out.append((start, rows, cols))
        start += rows * cols
    if start < n:
        out.append((start, 1, n - start))
    return out


def _load_index(k: Kernel, flat: np.ndarray, start: int, rows: int, cols: int, name: str = "index") -> Tile:
    tile = k.sbuf((rows, cols), chip_dtype(flat.dtype), name)
    k.dma(tile, flat[start : start + rows * cols].reshape(rows, cols))
    return tile


def _check_range(values: np.ndarray, size: int, dim: int, what: str) -> None:
    """The CPU's bound check for gather/scatter (the DMA's out-of-bounds error, with the
    dimension named); negative indices are out of range too."""
    if values.size:
        bad = values[(values < 0) | (values >= size)]
        if bad.size:
            raise RuntimeError(f"{what}: index {int(bad[0])} is out of bounds for dimension {dim} with size {size}")


def _offsets(k: Kernel, start: int, rows: int, cols: int, shape: tuple[int, ...],
             axes: list[tuple[int, int]], indexed: list[tuple[Tile, int]]) -> Tile:
    """Element offsets of a chunk of positions in ``shape`` (row-major from ``start``): the sum
    of ``coordinate(axis) * stride`` over ``axes`` and ``index * stride`` over the loaded
    ``indexed`` tiles (GpSimd integer arithmetic)."""
    position = k.sbuf((rows, cols), np.int32, "position")
    k.iota(position, base=start, partition_step=cols, free_step=1)
    offsets = k.sbuf((rows, cols), np.int32, "offsets")
    k.memset(offsets, 0)
    term = k.sbuf((rows, cols), np.int32, "term")
    for tile, stride in indexed:
        k.tensor_scalar(term, tile, "multiply", stride)
        k.tensor_tensor(offsets, offsets, term, "add")
    for axis, stride in axes:
        size = shape[axis]
        if size == 1 or stride == 0:
            continue
        k.tensor_scalar(term, position, "floor_divide", math.prod(shape[axis + 1 :]))
        k.tensor_scalar(term, term, "remainder", size)
        k.tensor_scalar(term, term, "multiply", stride)
        k.tensor_tensor(offsets, offsets, term, "add")
    return offsets


def _element_offsets(k: Kernel, index: Tile, start: int, shape: tuple[int, ...], dim: int,
                     strides: tuple[int, ...]) -> Tile:
    """:func:`_offsets` for gather/scatter: ``index`` replaces the coordinate along ``dim``."""
    rows, cols = index.shape
    axes = [(d, stride) for d, stride in enumerate(strides) if d != dim]
    return _offsets(k, start, rows, cols, shape, axes, [(index, strides[dim])])


def _as_1d(array: np.ndarray) -> np.ndarray:
    return array.reshape(1) if array.ndim == 0 else array


# ---------------------------------------------------------------------------------------------
# gather and scatter (element-granular indirect DMA)
# ---------------------------------------------------------------------------------------------


@tile_kernel(aten.gather.default)
def gather(k: Kernel, out: list[OutSpec], x: np.ndarray, dim: int, index: np.ndarray, *,
           sparse_grad: bool = False) -> np.ndarray:
    """``out[i][j][k] = x[index[i][j][k]][j][k]`` (for ``dim`` 0; likewise for the others)."""
    result = hbm_empty(out[0])
    if result.size == 0:
        return result
    x1, index1, flat_out = _as_1d(x), _as_1d(index), result.reshape(-1)
    dim %= x1.ndim
    values = _flat_values(index1)
    _check_range(values, x1.shape[dim], dim, "gather")
    table = _element_span(x1)
    for start, rows, cols in _chunks(values.size, k.spec.partitions):
        with k.scope():
            idx = _load_index(k, values, start, rows, cols)
            offsets = _element_offsets(k, idx, start, index1.shape, dim, _strides(x1))
            picked = k.sbuf((rows, cols), chip_dtype(x.dtype), "picked")
            for c in range(cols):
                k.gather_rows(picked[:, c : c + 1], table, offsets[:, c : c + 1])
            k.dma(flat_out[start : start + rows * cols].reshape(rows, cols), picked)
    return result


#: ``scatter_reduce``'s reductions: the engine op combining a target with an update, and the
#: identity a target starts from when ``include_self`` is False.
_REDUCTIONS = {"sum": ("add", 0), "mean": ("add", 0), "prod": ("multiply", 1),
               "amax": ("maximum", -math.inf), "amin": ("minimum", math.inf)}


def _scatter(k: Kernel, out: OutSpec, x: np.ndarray, dim: int, index: np.ndarray, src: Any, what: str,
             reduce: str | None = None, include_self: bool = True) -> np.ndarray:
    """``x`` copied to a fresh output, then ``src`` (an array, or a number for every position)
    stored at the positions ``index`` names along ``dim`` — or, with ``reduce`` (a key of
    :data:`_REDUCTIONS`), combined with what is there. Sums use the DMA's read-modify-write add;
    the other reductions gather, combine on the engines and scatter back."""
    result = hbm_empty(out)
    copy_view(k, result, x)
    if index.size == 0:
        return result
    result1, index1 = _as_1d(result), _as_1d(index)
    dim %= result1.ndim
    values = _flat_values(index1)
    _check_range(values, result1.shape[dim], dim, what)
    table = _element_span(result1)
    src_flat = _flat_values(_as_1d(src)[tuple(slice(0, n) for n in index1.shape)]) if isinstance(src, np.ndarray) else None
    geometry = (values, index1.shape, dim, _strides(result1))
    if reduce is None:
        for offsets, update in _scatter_columns(k, geometry, src_flat, src, result.dtype):
            k.scatter_rows(table, update, offsets)
        return result
    op, identity = _REDUCTIONS[reduce]
    if not include_self:
        start = _identity(identity, result.dtype)
        for offsets, update in _scatter_columns(k, geometry, None, start, result.dtype):
            k.scatter_rows(table, update, offsets)
    for offsets, update in _scatter_columns(k, geometry, src_flat, src, result.dtype):
        if op == "add":
            k.scatter_rows(table, update, offsets, accumulate=True)
        else:
            _combine_column(k, table, update, offsets, op)
    if reduce == "mean":
        _divide_by_counts(k, result, table, geometry, include_self)
    return result


def _identity(value: float, dtype: np.dtype) -> float:
    """``value`` within an integer dtype's 32-bit datapath (infinities become its extremes;
    for bool, False and True)."""
    if nx.is_float(dtype) or math.isfinite(value):
        return value
    if np.dtype(dtype) == np.bool_:
        return value > 0
    info = np.iinfo(np.int32) if np.dtype(dtype).itemsize >= 4 else np.iinfo(dtype)
    return info.min if value < 0 else info.max


def _scatter_columns(k: Kernel, geometry: tuple, src_flat: np.ndarray | None, scalar: Any, dtype: np.dtype):
    """Yield ``(offsets, update)`` ``[P, 1]`` column tiles covering every index position."""
    values, shape, dim, strides = geometry
    tile_dtype = chip_dtype(dtype)
    for start, rows, cols in _chunks(values.size, k.spec.partitions):
        with k.scope():
            idx = _load_index(k, values, start, rows, cols)
            offsets = _element_offsets(k, idx, start, shape, dim, strides)
            update = k.sbuf((rows, cols), tile_dtype, "update")
            if src_flat is None:
                k.memset(update, scalar)
            else:
                loaded = _load_index(k, src_flat, start, rows, cols, "src")
                k.tensor_copy(update, loaded)
            for c in range(cols):
                yield offsets[:, c : c + 1], update[:, c : c + 1]


def _combine_column(k: Kernel, table: np.ndarray, update: Tile, offsets: Tile, op: str) -> None:
    """``table[offsets] = table[offsets] <op> update``: gather, combine, scatter. Partitions
    naming the same element would race, so such a column goes one partition at a time (the
    synchronisation the compiler inserts for duplicate DMA offsets)."""
    rows = offsets.partitions
    targets = offsets.data.reshape(-1)
    groups = [(0, rows)] if np.unique(targets).size == rows else [(p, p + 1) for p in range(rows)]
    for a, b in groups:
        with k.scope():
            current = k.sbuf((b - a, 1), update.dtype, "current")
            k.gather_rows(current, table, offsets[a:b])
            k.tensor_tensor(current, current, update[a:b], op)
            k.scatter_rows(table, current, offsets[a:b])


def _divide_by_counts(k: Kernel, result: np.ndarray, table: np.ndarray, geometry: tuple, include_self: bool) -> None:
    """``scatter_reduce``'s mean: each element's sum divided by how many values it holds
    (counted by a DMA scatter-add of ones; integers divide with floor, as on the CPU)."""
    counts = fill(k, OutSpec((table.shape[0], 1), torch.float32), 0)
    for offsets, ones in _scatter_columns(k, geometry, None, 1.0, np.dtype(np.float32)):
        k.scatter_rows(counts, ones, offsets, accumulate=True)
    op = "divide" if nx.is_float(result.dtype) else "floor_divide"
    for start, rows, cols in _chunks(table.shape[0], k.spec.partitions):
        with k.scope():
            part = slice(start, start + rows * cols)
            divisor = k.sbuf((rows, cols), np.float32, "divisor")
            k.dma(divisor, counts[part, 0].reshape(rows, cols))
            k.tensor_scalar(divisor, divisor, "add", 1.0 if include_self else 0.0)
            k.tensor_scalar(divisor, divisor, "maximum", 1.0)
            total = k.sbuf((rows, cols), chip_dtype(result.dtype), "total")
            k.dma(total, table[part, 0].reshape(rows, cols))
            quotient = k.sbuf((rows, cols), chip_dtype(result.dtype), "quotient")
            k.tensor_tensor(quotient, total, divisor, op)
            k.dma(table[part, 0].reshape(rows, cols), quotient)


@tile_kernel(aten.scatter.src)
def scatter_src(k: Kernel, out: list[OutSpec], x: np.ndarray, dim: int, index: np.ndarray,
                src: np.ndarray) -> np.ndarray:
    return _scatter(k, out[0], x, dim, index, src, "scatter")


@tile_kernel(aten.scatter.value)
def scatter_value(k: Kernel, out: list[OutSpec], x: np.ndarray, dim: int, index: np.ndarray,
                  value: Any) -> np.ndarray:
    return _scatter(k, out[0], x, dim, index, value, "scatter")


@tile_kernel(aten.scatter_add.default)
def scatter_add(k: Kernel, out: list[OutSpec], x: np.ndarray, dim: int, index: np.ndarray,
                src: np.ndarray) -> np.ndarray:
    return _scatter(k, out[0], x, dim, index, src, "scatter_add", reduce="sum")


@tile_kernel(aten.scatter_reduce.two)
def scatter_reduce(k: Kernel, out: list[OutSpec], x: np.ndarray, dim: int, index: np.ndarray, src: np.ndarray,
                   reduce: str, *, include_self: bool = True) -> np.ndarray:
    return _scatter(k, out[0], x, dim, index, src, "scatter_reduce", reduce=reduce, include_self=include_self)


_SCATTER_REDUCE = {"add": "sum", "multiply": "prod"}


@tile_kernel(aten.scatter.reduce)
def scatter_reduce_src(k: Kernel, out: list[OutSpec], x: np.ndarray, dim: int, index: np.ndarray,
                       src: np.ndarray, *, reduce: str) -> np.ndarray:
    return _scatter(k, out[0], x, dim, index, src, "scatter", reduce=_SCATTER_REDUCE[reduce])


@tile_kernel(aten.scatter.value_reduce)
def scatter_reduce_value(k: Kernel, out: list[OutSpec], x: np.ndarray, dim: int, index: np.ndarray,
                         value: Any, *, reduce: str) -> np.ndarray:
    return _scatter(k, out[0], x, dim, index, value, "scatter", reduce=_SCATTER_REDUCE[reduce])


# ---------------------------------------------------------------------------------------------
# Row lookups: embedding, index_select (row-granular indirect DMA)
# ---------------------------------------------------------------------------------------------


def _gather_rows_into(k: Kernel, out_rows: np.ndarray, table: np.ndarray, values: np.ndarray) -> None:
    """``out_rows[i] = table[values[i]]`` for each i: rows on partitions, each row cut into
    blocks of at most :data:`ROW_FMAX` elements."""
    p = k.spec.partitions
    for r0 in range(0, values.size, p):
        r1 = min(values.size, r0 + p)
        with k.scope():
            idx = _load_index(k, values, r0, r1 - r0, 1)
            for block in free_blocks(table.shape[1:], ROW_FMAX):
                with k.scope():
                    part = table[(slice(None),) + block]
                    rows = k.sbuf((r1 - r0,) + part.shape[1:], chip_dtype(table.dtype), "rows")
                    k.gather_rows(rows, part, idx)
                    k.dma(out_rows[(slice(r0, r1),) + block], rows)


def _first_outside(values: np.ndarray, size: int) -> int | None:
    """The first of ``values`` outside ``[0, size)``, or None."""
    bad = values[(values < 0) | (values >= size)] if values.size else values
    return int(bad[0]) if bad.size else None


@tile_kernel(aten.embedding.default)
def embedding(k: Kernel, out: list[OutSpec], weight: np.ndarray, indices: np.ndarray,
              padding_idx: int = -1, scale_grad_by_freq: bool = False, sparse: bool = False) -> np.ndarray:
    """``weight[indices]``: one indirect-DMA row gather per 128 indices."""
    result = hbm_empty(out[0])
    values = _flat_values(indices)
    bad = _first_outside(values, weight.shape[0])
    if bad is not None:
        raise IndexError(f"index out of range in self (embedding: index {bad} of {weight.shape[0]} rows)")
    if values.size:
        _gather_rows_into(k, result.reshape((values.size,) + weight.shape[1:]), weight, values)
    return result


@tile_kernel(aten.index_select.default)
def index_select(k: Kernel, out: list[OutSpec], x: np.ndarray, dim: int, index: np.ndarray) -> np.ndarray:
    """Rows of ``x`` along ``dim`` (moved to the front of both views, no copy) gathered by DMA."""
    result = hbm_empty(out[0])
    if result.size == 0:
        return result
    x1, result1 = _as_1d(x), _as_1d(result)
    dim %= x1.ndim
    values = _flat_values(index)
    bad = _first_outside(values, x1.shape[dim])
    if bad is not None:
        raise _index_select_error(bad, x1.shape[dim], dim, x.ndim)
    _gather_rows_into(k, np.moveaxis(result1, dim, 0), np.moveaxis(x1, dim, 0), values)
    return result


def _index_select_error(bad: int, size: int, dim: int, ndim: int) -> Exception:
    """The CPU's error for index ``bad`` outside dimension ``dim`` (of ``size``) in index_select:
    its kernel for dimension 1 of a 2+-d tensor words it differently from the general one."""
    where = f"(index_select: index {bad} of dimension {dim} with size {size})"
    if dim == 1 and ndim > 1:
        return RuntimeError(f"INDICES element is out of DATA bounds, id={bad} axis_dim={size} {where}")
    return IndexError(f"index out of range in self {where}")


@tile_kernel(aten.embedding_dense_backward.default)
def embedding_dense_backward(k: Kernel, out: list[OutSpec], grad: np.ndarray, indices: np.ndarray,
                             num_weights: int, padding_idx: int, scale_grad_by_freq: bool) -> np.ndarray:
    """``grad_weight[v] = sum of grad rows whose index is v``; the padding row is zeroed, and
    with ``scale_grad_by_freq`` each row is divided by its index count.

    Up to :data:`ONE_HOT_MAX_VOCAB` rows this is ``onehot.T @ grad`` on the Tensor engine
    (tokens on partitions, accumulated in PSUM over token tiles). A larger table would make the
    one-hot work grow with the vocabulary, so there the gradient rows are added into a zeroed
    fp32 table by the indirect DMA's read-modify-write add instead (work grows with the tokens).
    """
    values = _flat_values(indices)
    width = math.prod(out[0].shape[1:])
    if values.size == 0 or out[0].shape[0] * width == 0:
        return fill(k, out[0], 0)
    rows = grad.reshape(values.size, width)
    if num_weights > ONE_HOT_MAX_VOCAB:
        return _scatter_add_rows(k, out[0], rows, values, padding_idx, scale_grad_by_freq)
    result = hbm_empty(out[0])
    p, n_max = k.spec.partitions, k.spec.gemm_moving_fmax
    dtype = chip_dtype(grad.dtype)
    token_tiles = [(t, min(values.size, t + p)) for t in range(0, values.size, p)]
    for v0 in range(0, num_weights, p):
        v1 = min(num_weights, v0 + p)
        for d0 in range(0, width, n_max):
            d1 = min(width, d0 + n_max)
            with k.scope():
                acc = k.psum((v1 - v0, d1 - d0), np.float32, "acc")
                counts = k.psum((v1 - v0, 1), np.float32, "counts") if scale_grad_by_freq else None
                for step, (t0, t1) in enumerate(token_tiles):
                    with k.scope():
                        onehot = _one_hot(k, values, t0, t1, v0, v1, dtype)
                        moving = k.sbuf((t1 - t0, d1 - d0), dtype, "grad")
                        k.dma(moving, rows[t0:t1, d0:d1])
                        k.matmul(acc, onehot, moving, accumulate=step > 0)
                        if counts is not None:
                            ones = k.sbuf((t1 - t0, 1), dtype, "ones")
                            k.memset(ones, 1)
                            k.matmul(counts, onehot, ones, accumulate=step > 0)
                _store_grad_rows(k, acc, counts, result, v0, v1, d0, d1, padding_idx)
    return result


def _scatter_add_rows(k: Kernel, out: OutSpec, rows: np.ndarray, values: np.ndarray, padding_idx: int,
                      scale_grad_by_freq: bool) -> np.ndarray:
    """The embedding gradient by indirect-DMA scatter-add into an fp32 table (then rounded
    once into the result's dtype)."""
    p = k.spec.partitions
    table = fill(k, OutSpec(out.shape[:1] + (rows.shape[1],), torch.float32), 0)
    counts = fill(k, OutSpec((out.shape[0], 1), torch.float32), 0) if scale_grad_by_freq else None
    for t0 in range(0, values.size, p):
        t1 = min(values.size, t0 + p)
        with k.scope():
            idx = _load_index(k, values, t0, t1 - t0, 1)
            g = k.sbuf((t1 - t0, rows.shape[1]), np.float32, "grad")
            loaded = k.sbuf(g.shape, chip_dtype(rows.dtype), "grad_in")
            k.dma(loaded, rows[t0:t1])
            k.tensor_copy(g, loaded)
            k.scatter_rows(table, g, idx, accumulate=True)
            if counts is not None:
                ones = k.sbuf((t1 - t0, 1), np.float32, "ones")
                k.memset(ones, 1)
                k.scatter_rows(counts, ones, idx, accumulate=True)
    if counts is not None:
        _divide_rows(k, table, counts)
    if 0 <= padding_idx < out.shape[0]:
        with k.scope():
            zeros = k.sbuf((1, rows.shape[1]), np.float32, "zeros")
            k.memset(zeros, 0)
            k.dma(table[padding_idx : padding_idx + 1], zeros)
    result = hbm_empty(out)
    copy_view(k, result.reshape(table.shape), table)
    return result


def _divide_rows(k: Kernel, table: np.ndarray, counts: np.ndarray) -> None:
    """``table[v] /= max(counts[v], 1)``, 128 rows at a time."""
    p = k.spec.partitions
    for v0 in range(0, table.shape[0], p):
        v1 = min(table.shape[0], v0 + p)
        with k.scope():
            divisor = k.sbuf((v1 - v0, 1), np.float32, "divisor")
            k.dma(divisor, counts[v0:v1])
            k.tensor_scalar(divisor, divisor, "maximum", 1.0)
            block = k.sbuf((v1 - v0, table.shape[1]), np.float32, "rows")
            k.dma(block, table[v0:v1])
            k.tensor_scalar(block, block, "divide", divisor)
            k.dma(table[v0:v1], block)


def _one_hot(k: Kernel, values: np.ndarray, t0: int, t1: int, v0: int, v1: int, dtype: Any) -> Tile:
    """``onehot[t, v] = (values[t] == v)`` for tokens ``t0:t1`` and vocabulary ``v0:v1``."""
    idx = _load_index(k, values, t0, t1 - t0, 1)
    vocabulary = k.sbuf((t1 - t0, v1 - v0), np.int32, "vocabulary")
    k.iota(vocabulary, base=v0, partition_step=0, free_step=1)
    onehot = k.sbuf((t1 - t0, v1 - v0), dtype, "onehot")
    k.tensor_scalar(onehot, vocabulary, "equal", idx)
    return onehot


def _store_grad_rows(k: Kernel, acc: Tile, counts: Tile | None, result: np.ndarray, v0: int, v1: int,
                     d0: int, d1: int, padding_idx: int) -> None:
    block = k.sbuf(acc.shape, np.float32, "block")
    k.tensor_copy(block, acc)
    if counts is not None:
        divisor = k.sbuf(counts.shape, np.float32, "divisor")
        k.tensor_scalar(divisor, counts, "maximum", 1.0)
        k.tensor_scalar(block, block, "divide", divisor)
    if v0 <= padding_idx < v1:
        k.memset(block[padding_idx - v0 : padding_idx - v0 + 1], 0)
    stored = k.sbuf(acc.shape, chip_dtype(result.dtype), "stored")
    k.tensor_copy(stored, block)
    k.dma(result.reshape(result.shape[0], -1)[v0:v1, d0:d1], stored)


# ---------------------------------------------------------------------------------------------
# Advanced indexing: x[i, :, j] and x[i, :, j] = v (element-granular indirect DMA)
# ---------------------------------------------------------------------------------------------


class _Advanced:
    """Where ``x[indices]`` takes each element from, for integer index arrays (None = whole dim).

    The broadcast index shape replaces the indexed dims in place when they are adjacent, else
    leads the result (PyTorch's rule). ``result_shape`` is the shape of ``x[indices]``; each index
    array is read broadcast over it (a stride-0 DMA pattern), the other result axes count
    through ``x``'s remaining dims.
    """

    def __init__(self, x: np.ndarray, indices: list[np.ndarray | None]):
        self.dims = [d for d, i in enumerate(indices) if i is not None]
        self.arrays = [indices[d] for d in self.dims]
        broadcast = np.broadcast_shapes(*(a.shape for a in self.arrays))
        adjacent = self.dims == list(range(self.dims[0], self.dims[-1] + 1))
        rest = [d for d in range(x.ndim) if d not in self.dims]
        self.lead = self.dims[0] if adjacent else 0
        before = [d for d in rest if d < self.lead] if adjacent else []
        after = [d for d in rest if d not in before]
        self.result_shape = tuple(x.shape[d] for d in before) + broadcast + tuple(x.shape[d] for d in after)
        self.axis_of = {d: i for i, d in enumerate(before)}
        self.axis_of.update({d: len(before) + len(broadcast) + i for i, d in enumerate(after)})
        self.trailing = len(self.result_shape) - self.lead - len(broadcast)
        self.sizes = [x.shape[d] for d in self.dims]

    def check(self) -> None:
        # As on the CPU, the dimension named is the index array's position among the index
        # arrays (``x[:, [0, 3]]`` names dimension 0), not the dimension of ``x`` it indexes.
        for position, (size, values) in enumerate(zip(self.sizes, self.arrays)):
            bad = values[(values < -size) | (values >= size)] if values.size else values
            if bad.size:
                raise IndexError(f"index {int(bad.reshape(-1)[0])} is out of bounds for dimension {position} "
                                 f"with size {size}")

    def expanded(self) -> list[np.ndarray]:
        """Each index array's values at every result position (row-major)."""
        out = []
        for values in self.arrays:
            view = np.broadcast_to(values, self.result_shape[self.lead : len(self.result_shape) - self.trailing])
            view = view.reshape((1,) * self.lead + view.shape + (1,) * self.trailing)
            out.append(_flat_values(np.broadcast_to(view, self.result_shape)))
        return out

    def offsets(self, k: Kernel, strides: tuple[int, ...], expanded: list[np.ndarray], start: int,
                rows: int, cols: int) -> Tile:
        """Element offsets (in ``strides``) of result positions ``start : start + rows*cols``;
        negative indices count from the end (``(i + size) % size`` on GpSimd)."""
        loaded = []
        for values, size, dim in zip(expanded, self.sizes, self.dims):
            tile = _load_index(k, values, start, rows, cols, f"index{dim}")
            k.tensor_scalar(tile, tile, "add", size)
            k.tensor_scalar(tile, tile, "remainder", size)
            loaded.append((tile, strides[dim]))
        axes = [(axis, strides[d]) for d, axis in self.axis_of.items()]
        return _offsets(k, start, rows, cols, self.result_shape, axes, loaded)


def _integer_indices(x: np.ndarray, indices: list[np.ndarray | None]) -> list[np.ndarray | None]:
    """Boolean masks replaced by the integer positions of their true elements. A mask's count
    decides the result's size, so it is read here, before the kernel is compiled for that size
    (every accelerator synchronises for this; Trainium's shapes are static)."""
    out: list[np.ndarray | None] = []
    for index in indices:
        if index is None or index.dtype not in (np.bool_, np.uint8):
            out.append(index)
            continue
        if index.dtype == np.uint8:
            warnings.warn("indexing with dtype torch.uint8 is now deprecated, please use a dtype "
                          "torch.bool instead.", UserWarning, stacklevel=2)
        dim = len(out)
        if index.shape != x.shape[dim : dim + index.ndim]:
            raise IndexError(f"The shape of the mask {list(index.shape)} at index {dim} does not match the "
                             f"shape of the indexed tensor {list(x.shape)} at index {dim}")
        out.extend(np.nonzero(np.asarray(index, dtype=bool)))
    return out


def index_body(k: Kernel, out: list[OutSpec], x: np.ndarray, indices: list) -> np.ndarray:
    """``x[indices]`` (integer index arrays): one element-granular gather per result position."""
    result = hbm_empty(out[0])
    if result.size == 0 or not any(i is not None for i in indices):
        if result.size:
            copy_view(k, result, x)
        return result
    plan = _Advanced(x, indices)
    plan.check()
    expanded, table, flat_out = plan.expanded(), _element_span(x), result.reshape(-1)
    for start, rows, cols in _chunks(result.size, k.spec.partitions):
        with k.scope():
            offsets = plan.offsets(k, _strides(x), expanded, start, rows, cols)
            picked = k.sbuf((rows, cols), chip_dtype(x.dtype), "picked")
            for c in range(cols):
                k.gather_rows(picked[:, c : c + 1], table, offsets[:, c : c + 1])
            k.dma(flat_out[start : start + rows * cols].reshape(rows, cols), picked)
    return result


def index_put_body(k: Kernel, out: list[OutSpec], x: np.ndarray, indices: list, values: np.ndarray,
                   accumulate: bool = False, unsafe: bool = False) -> np.ndarray:
    """The new value of ``x`` after ``x[indices] = values`` (or ``+=``): ``x`` copied, then
    ``values`` (broadcast to the indexed shape) scattered by the indirect DMA store."""
    result = hbm_empty(out[0])
    copy_view(k, result, x)
    if result.size == 0 or not any(i is not None for i in indices):
        return result
    plan = _Advanced(result, indices)
    _check_values_shape(np.shape(values), plan.result_shape)
    plan.check()
    n = math.prod(plan.result_shape)
    if n == 0:
        return result
    expanded, table = plan.expanded(), _element_span(result)
    updates = _flat_values(np.broadcast_to(values, plan.result_shape))
    tile_dtype = chip_dtype(result.dtype)
    # Accumulating, the scatters add in the values' flat order, as the CPU does: each add rounds
    # to the result's dtype (scatter_rows), so the order of the adds decides a bfloat16 sum.
    # Chunks of one column put consecutive values on consecutive partitions.
    p = k.spec.partitions
    chunks = [(s, min(p, n - s), 1) for s in range(0, n, p)] if accumulate else _chunks(n, p)
    for start, rows, cols in chunks:
        with k.scope():
            offsets = plan.offsets(k, _strides(result), expanded, start, rows, cols)
            loaded = _load_index(k, updates, start, rows, cols, "values")
            update = loaded
            if loaded.dtype != tile_dtype:
                update = k.sbuf(loaded.shape, tile_dtype, "update")
                k.tensor_copy(update, loaded)
            for c in range(cols):
                k.scatter_rows(table, update[:, c : c + 1], offsets[:, c : c + 1], accumulate=accumulate)
    return result


def _check_values_shape(shape: tuple[int, ...], target: tuple[int, ...]) -> None:
    """PyTorch's error when ``x[indices] = values`` cannot broadcast ``values`` to the indexed
    shape (checked before the indices, as on the CPU, and also when they select nothing)."""
    if len(shape) > len(target) or any(s not in (1, t) for s, t in zip(shape[::-1], target[::-1])):
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(shape)} cannot be broadcast "
                           f"to indexing result of shape {list(target)}")


def _register_with_integer_indices(op: Any, body: Any) -> None:
    launch = _launcher(op, body)

    def run(x: np.ndarray, indices: list, *args: Any, **kwargs: Any) -> Any:
        # The indices' values are read here (boolean masks), so pending ones are computed first.
        x, indices, args, kwargs = adaptive.concrete((x, indices, args, kwargs))
        return launch(x, _integer_indices(x, list(indices)), *args, **kwargs)

    run.__name__ = run.__qualname__ = f"neuron_{body.__name__}"
    kernels.add(op, run)


_register_with_integer_indices(aten.index.Tensor, index_body)
_register_with_integer_indices(aten._index_put_impl_.default, index_put_body)
