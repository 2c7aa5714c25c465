"""Reduction tile programs: sum, mean, prod, amax/amin, max/min with indices, argmax/argmin,
var/var_mean, any/all and cumsum.

Layout. The reduced dims are moved last (a numpy view of HBM, no copy), which makes the input
a matrix ``[R, F]``: R kept elements, F reduced ones (:func:`row_blocks`). Kept elements go on
partitions in tiles of at most 128 rows, reduced ones along the free axis in chunks of at most
``FMAX``; the Vector engine reduces each chunk (``tensor_reduce``) and combines it with the
running result, in fp32 for floats and in exact integers (GpSimd) otherwise.

Two layouts use the other engines:

- Reducing over a leading dim (the kept dim is the contiguous one, as in a bias gradient
  ``grad.sum(0)``): a float sum keeps the contiguous kept elements on the free axis and sums
  *across partitions* on the Tensor engine, a matmul with a ones vector accumulating in fp32
  PSUM. Other reductions load such tiles transposed (DMA transpose on v3+, Tensor-engine
  transpose on v2, see :func:`~.matmul.load_k_major`).
- A few long rows (a full reduction such as ``loss.mean()``): each row is spread over all 128
  partitions, reduced per partition, and finished across partitions — a ones-vector matmul for
  float sums, GpSimd ``partition_reduce`` otherwise (exact for integers, NaN-aware).

Index reductions (argmax, max.dim, ...) always use the row layout: each chunk's extreme and its
first index are merged into the running ones, so ties keep the first index and NaN wins, as on
CPU. cumsum and cumprod are log-step (Hillis-Steele) scans along the free axis with a carry
between chunks. Vector norms map each chunk first (|x|, x², |x|^p on the Scalar and Vector
engines) and reduce the result like a sum or an extreme.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from accelkit_backends.neuron.launch import OutSpec, chip_dtype, hbm_empty, tile_kernel
from accelkit_backends.neuron.tiling import FMAX, flat_chunks
from accelkit_backends.neuron.kernels.matmul import load_k_major
from accelkit_backends.neuron.sim import numerics as nx
from accelkit_backends.neuron.sim.isa import Kernel
from accelkit_backends.neuron.sim.memory import Tile

aten = torch.ops.aten

#: Blocks with at most this many rows, each of at least SPREAD_MIN_FREE contiguous elements,
#: spread every row over all partitions instead of using one partition per row.
SPREAD_MAX_ROWS = 8
SPREAD_MIN_FREE = 1024
#: How a chunk's partial result merges into the running one (Vector-engine binary ops).
COMBINE = {"add": "add", "multiply": "multiply", "max": "maximum", "min": "minimum"}


# ---------------------------------------------------------------------------------------------
# Geometry: any reduction as [R, F] blocks of HBM views
# ---------------------------------------------------------------------------------------------


def reduce_dims(ndim: int, dim: int | Sequence[int] | None) -> tuple[int, ...]:
    """The reduced dims, sorted and non-negative; ``None`` or ``[]`` mean all dims."""
    if ndim == 0:
        return ()
    if dim is None:
        return tuple(range(ndim))
    dims = [dim] if isinstance(dim, int) else list(dim)
    if not dims:
        return tuple(range(ndim))
    return tuple(sorted({d % ndim for d in dims}))


class Block(NamedTuple):
    """Rows ``[row0, row0 + R)`` of the kept elements: one ``[R, F]`` array per operand.

    ``pattern`` is set when the arrays are copies (reduced dims that do not merge into one
    strided axis): the view a DMA really walks, for its cost.
    """

    row0: int
    views: list[np.ndarray]
    pattern: np.ndarray | None = None


def row_blocks(arrays: Sequence[np.ndarray], dims: Sequence[int]) -> list[Block]:
    """Same-shape ``arrays`` as ``[kept, reduced]`` matrices: views of HBM (writable) where
    strides allow, split along the leading kept dims where they do not."""
    ndim = arrays[0].ndim
    kept = [d for d in range(ndim) if d not in dims]
    moved = [a.transpose(kept + list(dims)) for a in arrays]
    return _split(moved, len(kept), 0)


def _as_2d(array: np.ndarray, rows: int, cols: int) -> np.ndarray | None:
    try:
        return np.reshape(array, (rows, cols), copy=False)
    except ValueError:
        return None


def _split(moved: list[np.ndarray], kept: int, row0: int) -> list[Block]:
    shape = moved[0].shape
    rows, cols = math.prod(shape[:kept]), math.prod(shape[kept:])
    views = [_as_2d(m, rows, cols) for m in moved]
    if all(v is not None for v in views):
        return [Block(row0, views)]
    one_row = [m[(0,) * kept] for m in moved]
    if kept == 0 or any(_as_2d(r, 1, cols) is None for r in one_row):
        copies = [np.ascontiguousarray(m).reshape(rows, cols) for m in moved]
        return [Block(row0, copies, moved[0])]
    inner = math.prod(shape[1:kept])
    blocks: list[Block] = []
    for i in range(shape[0]):
        blocks += _split([m[i] for m in moved], kept - 1, row0 + i * inner)
    return blocks


def load_rows(k: Kernel, block: Block, which: int, r0: int, r1: int, f0: int, f1: int,
              name: str) -> Tile:
    """``block.views[which][r0:r1, f0:f1]`` as an SBUF tile, rows on partitions.

    A column-major block loads transposed (:func:`load_k_major`) except integers on
    NeuronCore-v2, whose Tensor-engine transpose passes through fp32 PSUM and would round
    values above 2**24: those take an exact element-strided DMA, costed as such.
    """
    view = block.views[which]
    if block.pattern is None and (nx.is_float(view.dtype) or k.spec.transpose_in_dma):
        return load_k_major(k, view, r0, r1, f0, f1, name)
    tile = k.sbuf((r1 - r0, f1 - f0), chip_dtype(view.dtype), name)
    k.dma(tile, view[r0:r1, f0:f1], pattern=block.pattern)
    return tile


def row_tiles(k: Kernel, block: Block) -> Iterator[tuple[int, int]]:
    """``(r0, r1)`` of each partition tile of a block, inside its own scope."""
    rows = block.views[0].shape[0]
    for r0 in range(0, rows, k.spec.partitions):
        with k.scope():
            yield r0, min(rows, r0 + k.spec.partitions)


def chunks(k: Kernel, block: Block, which: Sequence[int], r0: int, r1: int,
           fmax: int = FMAX, resident: dict | None = None) -> Iterator[tuple[int, int, list[Tile]]]:
    """``(f0, f1, tiles)`` over the free range of rows ``r0:r1``, one tile per operand.

    With a single chunk and a ``resident`` dict the tiles are loaded once and kept there (in the
    caller's scope) for later passes; otherwise each chunk's tiles live in a scope of their
    own, so a caller allocates what must outlive the loop *before* it.
    """
    cols = block.views[0].shape[1]
    if cols <= fmax and resident is not None:
        if "tiles" not in resident:
            resident["tiles"] = [load_rows(k, block, w, r0, r1, 0, cols, f"in{w}") for w in which]
        yield 0, cols, resident["tiles"]
        return
    for f0 in range(0, cols, fmax):
        f1 = min(cols, f0 + fmax)
        with k.scope():
            yield f0, f1, [load_rows(k, block, w, r0, r1, f0, f1, f"in{w}") for w in which]


def store_rows(k: Kernel, out_flat: np.ndarray, r0: int, tile: Tile) -> None:
    """Write a ``[rows, 1]`` (or ``[1, cols]``) result tile to consecutive outputs from ``r0``,
    rounding to the output's dtype first if the tile is wider."""
    dtype = chip_dtype(out_flat.dtype)
    if tile.dtype != dtype:
        rounded = k.sbuf(tile.shape, dtype, "result")
        k.tensor_copy(rounded, tile)
        tile = rounded
    k.dma(out_flat[r0 : r0 + tile.partitions * tile.free_size].reshape(tile.shape), tile)


def accumulator_dtype(x: np.ndarray, out_dtype: np.dtype) -> np.dtype:
    """fp32 when floats are involved (engines compute in fp32), else the output's chip dtype."""
    if nx.is_float(x.dtype) or nx.is_float(out_dtype):
        return np.dtype(np.float32)
    return chip_dtype(out_dtype)


def identity(op: str, dtype: np.dtype) -> float | int:
    """The value a reduction starts from (padding partitions that hold no data)."""
    if op == "add":
        return 0
    if op == "multiply":
        return 1
    low = op == "max"
    if dtype.kind == "b":
        return 0 if low else 1
    if dtype.kind in "iu":
        info = np.iinfo(np.int32 if dtype.kind == "i" else dtype)
        return info.min if low else info.max
    return -math.inf if low else math.inf


# ---------------------------------------------------------------------------------------------
# The generic reduction
# ---------------------------------------------------------------------------------------------

Transform = Callable[[Kernel, Tile], Tile]
Finish = Callable[[Kernel, Tile, int], None]


def reduce_into(k: Kernel, x: np.ndarray, dims: Sequence[int], out: np.ndarray, op: str,
                transform: Transform | None = None, finish: Finish | None = None,
                acc_dtype: Any = None) -> np.ndarray:
    """``out.flat[r] = finish(reduce(op, transform(row r)))`` over the reduced ``dims``.

    ``transform(k, chunk) -> tile`` maps each loaded chunk first (any/all test truth);
    ``finish(k, acc, count)`` adjusts the fp32/int accumulator in place (mean divides by the
    ``count`` of reduced elements). ``acc_dtype`` overrides :func:`accumulator_dtype`.
    """
    out_flat = out.reshape(-1)
    acc_dtype = np.dtype(acc_dtype) if acc_dtype is not None else accumulator_dtype(x, out.dtype)
    for block in row_blocks([x], dims):
        rows, cols = block.views[0].shape
        if rows == 0:
            continue
        view = block.views[0]
        if cols == 0:
            _store_identity(k, out_flat, block.row0, rows, op, acc_dtype, finish)
        elif _sums_across_partitions(view, op, block, transform):
            _sum_over_partitions(k, view, out_flat, block.row0, finish)
        elif rows <= SPREAD_MAX_ROWS and cols >= SPREAD_MIN_FREE and block.pattern is None \
                and view.strides[1] == view.itemsize:
            for r in range(rows):
                _reduce_spread(k, view[r], out_flat, block.row0 + r, op, acc_dtype, transform, finish)
        else:
            _reduce_rows(k, block, out_flat, op, acc_dtype, transform, finish)
    return out


def _sums_across_partitions(view: np.ndarray, op: str, block: Block, transform: Any) -> bool:
    rows, cols = view.shape
    return (op == "add" and transform is None and block.pattern is None and nx.is_float(view.dtype)
            and rows > 1 and cols > 1 and view.strides[0] == view.itemsize)


def _store_identity(k: Kernel, out_flat: np.ndarray, row0: int, rows: int, op: str,
                    acc_dtype: np.dtype, finish: Finish | None) -> None:
    for r0 in range(0, rows, k.spec.partitions):
        with k.scope():
            acc = k.sbuf((min(rows - r0, k.spec.partitions), 1), acc_dtype, "acc")
            k.memset(acc, identity(op, acc_dtype))
            if finish is not None:
                finish(k, acc, 0)
            store_rows(k, out_flat, row0 + r0, acc)


def _reduce_rows(k: Kernel, block: Block, out_flat: np.ndarray, op: str, acc_dtype: np.dtype,
                 transform: Transform | None, finish: Finish | None) -> None:
    cols = block.views[0].shape[1]
    for r0, r1 in row_tiles(k, block):
        acc = k.sbuf((r1 - r0, 1), acc_dtype, "acc")
        for f0, _, (chunk,) in chunks(k, block, [0], r0, r1):
            if transform is not None:
                chunk = transform(k, chunk)
            if f0 == 0:
                k.tensor_reduce(acc, chunk, op)
            else:
                partial = k.sbuf(acc.shape, acc_dtype, "partial")
                k.tensor_reduce(partial, chunk, op)
                k.tensor_tensor(acc, acc, partial, COMBINE[op])
        if finish is not None:
            finish(k, acc, cols)
        store_rows(k, out_flat, block.row0 + r0, acc)


def _reduce_spread(k: Kernel, row: np.ndarray, out_flat: np.ndarray, index: int, op: str,
                   acc_dtype: np.dtype, transform: Transform | None, finish: Finish | None) -> None:
    """One long contiguous row over all partitions, then across partitions."""
    p = k.spec.partitions
    with k.scope():
        acc = k.sbuf((p, 1), acc_dtype, "acc")
        k.memset(acc, identity(op, acc_dtype))
        for start, rows, cols in flat_chunks(row.size, p):
            with k.scope():
                chunk = k.sbuf((rows, cols), chip_dtype(row.dtype), "chunk")
                k.dma(chunk, row[start : start + rows * cols].reshape(rows, cols))
                if transform is not None:
                    chunk = transform(k, chunk)
                partial = k.sbuf((rows, 1), acc_dtype, "partial")
                k.tensor_reduce(partial, chunk, op)
                k.tensor_tensor(acc[:rows], acc[:rows], partial, COMBINE[op])
        total = k.sbuf((1, 1), acc_dtype, "total")
        if op == "add" and acc_dtype == np.float32:
            ones = k.sbuf((p, 1), np.float32, "ones")
            k.memset(ones, 1.0)
            summed = k.psum((1, 1), np.float32, "sum")
            k.matmul(summed, acc, ones)
            k.tensor_copy(total, summed)
        else:
            k.partition_reduce(total, acc, op)
        if finish is not None:
            finish(k, total, row.size)
        store_rows(k, out_flat, index, total)


def _sum_over_partitions(k: Kernel, view: np.ndarray, out_flat: np.ndarray, row0: int,
                         finish: Finish | None) -> None:
    """Sum a column-major ``[R, F]`` view: ``F`` on partitions, ``R`` contiguous on the free
    axis, ``ones[F].T @ tile`` accumulated over F tiles in one PSUM bank."""
    p = k.spec.partitions
    rows, cols = view.shape
    by_reduced = view.T
    dtype = chip_dtype(view.dtype)
    with k.scope():
        ones = k.sbuf((p, 1), dtype, "ones")
        k.memset(ones, 1.0)
        for r0 in range(0, rows, k.spec.gemm_moving_fmax):
            r1 = min(rows, r0 + k.spec.gemm_moving_fmax)
            with k.scope():
                summed = k.psum((1, r1 - r0), np.float32, "sum")
                for f0 in range(0, cols, p):
                    f1 = min(cols, f0 + p)
                    with k.scope():
                        tile = k.sbuf((f1 - f0, r1 - r0), dtype, "x")
                        k.dma(tile, by_reduced[f0:f1, r0:r1])
                        k.matmul(summed, ones[: f1 - f0], tile, accumulate=f0 > 0)
                total = k.sbuf((1, r1 - r0), np.float32, "total")
                k.tensor_copy(total, summed)
                if finish is not None:
                    finish(k, total, cols)
                store_rows(k, out_flat, row0 + r0, total)


def divide_by_count(k: Kernel, acc: Tile, count: int) -> None:
    k.tensor_scalar(acc, acc, "divide", float(count))


def truth(k: Kernel, chunk: Tile) -> Tile:
    """Each element's truth value (non-zero, NaN included) as a bool tile."""
    flags = k.sbuf(chunk.shape, np.bool_, "truth")
    k.tensor_scalar(flags, chunk, "not_equal", 0)
    return flags


# ---------------------------------------------------------------------------------------------
# sum, mean, prod, amax/amin, any/all
# ---------------------------------------------------------------------------------------------


@tile_kernel(aten.sum.dim_IntList, aten.sum.default, static=True)
def sum_(k: Kernel, out: list[OutSpec], x: np.ndarray, dim: Any = None, keepdim: bool = False, *,
         dtype: Any = None) -> np.ndarray:
    return reduce_into(k, x, reduce_dims(x.ndim, dim), hbm_empty(out[0]), "add")


@tile_kernel(aten.mean.dim, aten.mean.default, static=True)
def mean(k: Kernel, out: list[OutSpec], x: np.ndarray, dim: Any = None, keepdim: bool = False, *,
         dtype: Any = None) -> np.ndarray:
    return reduce_into(k, x, reduce_dims(x.ndim, dim), hbm_empty(out[0]), "add",
                       finish=divide_by_count)


@tile_kernel(aten.prod.dim_int, static=True)
def prod_dim(k: Kernel, out: list[OutSpec], x: np.ndarray, dim: int, keepdim: bool = False, *,
             dtype: Any = None) -> np.ndarray:
    return reduce_into(k, x, reduce_dims(x.ndim, dim), hbm_empty(out[0]), "multiply")


@tile_kernel(aten.prod.default, static=True)
def prod_all(k: Kernel, out: list[OutSpec], x: np.ndarray, *, dtype: Any = None) -> np.ndarray:
    return reduce_into(k, x, reduce_dims(x.ndim, None), hbm_empty(out[0]), "multiply")


def _extreme(op: str):
    def body(k: Kernel, out: list[OutSpec], x: np.ndarray, dim: Any = (), keepdim: bool = False) -> np.ndarray:
        return reduce_into(k, x, reduce_dims(x.ndim, dim), hbm_empty(out[0]), op)

    body.__name__ = f"a{op}"
    return body


tile_kernel(aten.amax.default, static=True)(_extreme("max"))
tile_kernel(aten.amin.default, static=True)(_extreme("min"))


@tile_kernel(aten.max.default, static=True)
def max_all(k: Kernel, out: list[OutSpec], x: np.ndarray) -> np.ndarray:
    return reduce_into(k, x, reduce_dims(x.ndim, None), hbm_empty(out[0]), "max")


@tile_kernel(aten.min.default, static=True)
def min_all(k: Kernel, out: list[OutSpec], x: np.ndarray) -> np.ndarray:
    return reduce_into(k, x, reduce_dims(x.ndim, None), hbm_empty(out[0]), "min")


def _truth_reduction(op: str):
    def body(k: Kernel, out: list[OutSpec], x: np.ndarray, dim: Any = None, keepdim: bool = False) -> np.ndarray:
        return reduce_into(k, x, reduce_dims(x.ndim, dim), hbm_empty(out[0]), op, transform=truth,
                           acc_dtype=np.bool_)

    body.__name__ = "any" if op == "max" else "all"
    return body


tile_kernel(aten.any.default, aten.any.dim, aten.any.dims, static=True)(_truth_reduction("max"))
tile_kernel(aten.all.default, aten.all.dim, aten.all.dims, static=True)(_truth_reduction("min"))


# ---------------------------------------------------------------------------------------------
# argmax/argmin, max.dim/min.dim
# ---------------------------------------------------------------------------------------------


def arg_reduce(k: Kernel, x: np.ndarray, dims: Sequence[int], values: np.ndarray | None,
               indices: np.ndarray, op: str) -> None:
    """Per kept row: the extreme (``op`` max or min) and the flat index of its first
    occurrence among the reduced elements; NaN counts as the extreme, as on CPU."""
    values_flat = values.reshape(-1) if values is not None else None
    index_flat = indices.reshape(-1)
    value_dtype = accumulator_dtype(x, x.dtype)
    for block in row_blocks([x], dims):
        for r0, r1 in row_tiles(k, block):
            best = k.sbuf((r1 - r0, 1), value_dtype, "best")
            where = k.sbuf((r1 - r0, 1), np.int32, "where")
            for f0, _, (chunk,) in chunks(k, block, [0], r0, r1):
                if f0 == 0:
                    k.tensor_reduce(best, chunk, op)
                    k.tensor_reduce(where, chunk, "arg" + op)
                else:
                    _merge_chunk(k, chunk, f0, best, where, op)
            if values_flat is not None:
                store_rows(k, values_flat, block.row0 + r0, best)
            store_rows(k, index_flat, block.row0 + r0, where)


def _merge_chunk(k: Kernel, chunk: Tile, f0: int, best: Tile, where: Tile, op: str) -> None:
    value = k.sbuf(best.shape, best.dtype, "value")
    index = k.sbuf(where.shape, np.int32, "index")
    k.tensor_reduce(value, chunk, op)
    k.tensor_reduce(index, chunk, "arg" + op)
    k.tensor_scalar(index, index, "add", f0)
    better = k.sbuf(best.shape, np.bool_, "better")
    k.tensor_tensor(better, value, best, "greater" if op == "max" else "less")
    if nx.is_float(best.dtype):
        # A NaN beats any number; an earlier NaN is kept (comparisons with NaN are false).
        new_nan = k.sbuf(best.shape, np.bool_, "new_nan")
        best_is_number = k.sbuf(best.shape, np.bool_, "best_is_number")
        k.tensor_tensor(new_nan, value, value, "not_equal")
        k.tensor_tensor(best_is_number, best, best, "equal")
        k.tensor_tensor(new_nan, new_nan, best_is_number, "logical_and")
        k.tensor_tensor(better, better, new_nan, "logical_or")
    k.select(where, better, index, where)
    k.select(best, better, value, best)


def _arg(op: str):
    def body(k: Kernel, out: list[OutSpec], x: np.ndarray, dim: int | None = None,
             keepdim: bool = False) -> np.ndarray:
        indices = hbm_empty(out[0])
        arg_reduce(k, x, reduce_dims(x.ndim, dim), None, indices, op)
        return indices

    body.__name__ = "arg" + op
    return body


tile_kernel(aten.argmax.default, static=True)(_arg("max"))
tile_kernel(aten.argmin.default, static=True)(_arg("min"))


def _extreme_with_index(op: str):
    def body(k: Kernel, out: list[OutSpec], x: np.ndarray, dim: int, keepdim: bool = False) -> tuple:
        values, indices = hbm_empty(out[0]), hbm_empty(out[1])
        arg_reduce(k, x, reduce_dims(x.ndim, dim), values, indices, op)
        return values, indices

    body.__name__ = f"{op}_dim"
    return body


tile_kernel(aten.max.dim, static=True)(_extreme_with_index("max"))
tile_kernel(aten.min.dim, static=True)(_extreme_with_index("min"))


# ---------------------------------------------------------------------------------------------
# linalg_vector_norm: map each chunk (|x|, x², |x|^p), then reduce like a sum or an extreme
# ---------------------------------------------------------------------------------------------


def _mapped(func: str, exponent: float | None = None) -> Transform:
    def transform(k: Kernel, chunk: Tile) -> Tile:
        mapped = k.sbuf(chunk.shape, np.float32, func)
        k.activation(mapped, chunk, func)
        if exponent is not None:
            k.tensor_scalar(mapped, mapped, "pow", exponent)
        return mapped

    return transform


def _nonzero(k: Kernel, chunk: Tile) -> Tile:
    flags = k.sbuf(chunk.shape, np.float32, "nonzero")
    k.tensor_scalar(flags, chunk, "not_equal", 0)
    return flags


def _root(order: float) -> Finish:
    def finish(k: Kernel, acc: Tile, count: int) -> None:
        if order == 2:
            k.activation(acc, acc, "sqrt")
        else:
            k.tensor_scalar(acc, acc, "pow", 1.0 / order)

    return finish


@tile_kernel(aten.linalg_vector_norm.default, static=True)
def linalg_vector_norm(k: Kernel, out: list[OutSpec], x: np.ndarray, ord: Any = 2, dim: Any = None,
                       keepdim: bool = False, *, dtype: Any = None) -> np.ndarray:
    """``(Σ |x|^ord)^(1/ord)``; ord ±inf is the max/min of ``|x|``, ord 0 counts non-zeros."""
    result = hbm_empty(out[0])
    dims = reduce_dims(x.ndim, dim)
    order = float(ord)
    if math.isinf(order):
        return reduce_into(k, x, dims, result, "max" if order > 0 else "min", transform=_mapped("abs"))
    if order == 0:
        return reduce_into(k, x, dims, result, "add", transform=_nonzero)
    if order == 1:
        return reduce_into(k, x, dims, result, "add", transform=_mapped("abs"))
    if order == 2:
        return reduce_into(k, x, dims, result, "add", transform=_mapped("square"), finish=_root(2))
    return reduce_into(k, x, dims, result, "add", transform=_mapped("abs", order), finish=_root(order))


# ---------------------------------------------------------------------------------------------
# var, var_mean (two passes: the mean, then the squared deviations on the Scalar engine)
# ---------------------------------------------------------------------------------------------


def moments(k: Kernel, x: np.ndarray, dims: Sequence[int], correction: float,
            var_out: np.ndarray, mean_out: np.ndarray | None) -> None:
    """``var_out`` (and ``mean_out``) over ``dims``; the variance divides by
    ``max(count - correction, 0)`` as PyTorch does."""
    var_flat = var_out.reshape(-1)
    mean_flat = mean_out.reshape(-1) if mean_out is not None else None
    for block in row_blocks([x], dims):
        cols = block.views[0].shape[1]
        for r0, r1 in row_tiles(k, block):
            kept: dict = {}
            mean_tile = row_mean(k, block, 0, r0, r1, kept)
            negated = k.sbuf(mean_tile.shape, np.float32, "neg_mean")
            k.tensor_scalar(negated, mean_tile, "multiply", -1.0)
            squares = sum_of_squares(k, block, r0, r1, negated, kept)
            k.tensor_scalar(squares, squares, "divide", float(max(cols - correction, 0)))
            store_rows(k, var_flat, block.row0 + r0, squares)
            if mean_flat is not None:
                store_rows(k, mean_flat, block.row0 + r0, mean_tile)


def row_mean(k: Kernel, block: Block, which: int, r0: int, r1: int, kept: dict) -> Tile:
    """The fp32 mean of rows ``r0:r1`` of operand ``which`` (a [rows, 1] tile)."""
    cols = block.views[which].shape[1]
    total = k.sbuf((r1 - r0, 1), np.float32, "mean")
    k.memset(total, 0.0)
    for _, _, (chunk,) in chunks(k, block, [which], r0, r1, resident=kept):
        partial = k.sbuf(total.shape, np.float32, "partial")
        k.tensor_reduce(partial, chunk, "add")
        k.tensor_tensor(total, total, partial, "add")
    k.tensor_scalar(total, total, "divide", float(cols))  # 0 / 0: an empty mean is NaN
    return total


def sum_of_squares(k: Kernel, block: Block, r0: int, r1: int, neg_mean: Tile, kept: dict) -> Tile:
    """``Σ (x - mean)²`` per row: Scalar-engine ``square(x + (-mean))`` with its row sum."""
    total = k.sbuf(neg_mean.shape, np.float32, "squares")
    k.memset(total, 0.0)
    for f0, f1, (chunk,) in chunks(k, block, [0], r0, r1, resident=kept):
        with k.scope():
            squared = k.sbuf((r1 - r0, f1 - f0), np.float32, "squared")
            partial = k.sbuf(total.shape, np.float32, "partial")
            k.activation(squared, chunk, "square", bias=neg_mean, reduce_into=partial)
            k.tensor_tensor(total, total, partial, "add")
    return total


def _correction(correction: Any) -> float:
    return 1.0 if correction is None else float(correction)


@tile_kernel(aten.var.correction, static=True)
def var(k: Kernel, out: list[OutSpec], x: np.ndarray, dim: Any = None, *, correction: Any = None,
        keepdim: bool = False) -> np.ndarray:
    result = hbm_empty(out[0])
    moments(k, x, reduce_dims(x.ndim, dim), _correction(correction), result, None)
    return result


@tile_kernel(aten.var_mean.correction, static=True)
def var_mean(k: Kernel, out: list[OutSpec], x: np.ndarray, dim: Any = None, *, correction: Any = None,
             keepdim: bool = False) -> tuple:
    variance, average = hbm_empty(out[0]), hbm_empty(out[1])
    moments(k, x, reduce_dims(x.ndim, dim), _correction(correction), variance, average)
    return variance, average


# ---------------------------------------------------------------------------------------------
# cumsum: a log-step scan along the free axis
# ---------------------------------------------------------------------------------------------


def scan(k: Kernel, values: Tile, op: str = "add") -> None:
    """Inclusive prefix ``op`` (add or multiply) along each partition, in place: ``log2(F)``
    shifted Vector-engine (or exact integer) operations."""
    cols = values.free_size
    shift = 1
    previous = k.sbuf(values.shape, values.dtype, "previous")
    while shift < cols:
        k.tensor_copy(previous, values)
        k.tensor_tensor(values[:, shift:], previous[:, shift:], previous[:, : cols - shift], op)
        shift *= 2


def cumulative(k: Kernel, x: np.ndarray, dim: int, result: np.ndarray, op: str) -> np.ndarray:
    """``result`` = running ``op`` (add or multiply) of ``x`` along ``dim``, chunk by chunk
    with each row's last value carried into the next chunk."""
    if result.size == 0:
        return result
    acc_dtype = accumulator_dtype(x, result.dtype)
    for block in row_blocks([x, result], reduce_dims(x.ndim, dim)):
        target = block.views[1]
        for r0, r1 in row_tiles(k, block):
            carry = k.sbuf((r1 - r0, 1), acc_dtype, "carry")
            for f0, f1, (chunk,) in chunks(k, block, [0], r0, r1):
                running = k.sbuf(chunk.shape, acc_dtype, "running")
                k.tensor_copy(running, chunk)
                scan(k, running, op)
                if f0 > 0:
                    k.tensor_scalar(running, running, op, carry)
                k.tensor_copy(carry, running[:, f1 - f0 - 1 :])
                rounded = running
                if running.dtype != chip_dtype(target.dtype):
                    rounded = k.sbuf(chunk.shape, chip_dtype(target.dtype), "rounded")
                    k.tensor_copy(rounded, running)
                k.dma(target[r0:r1, f0:f1], rounded)
    return result


@tile_kernel(aten.cumsum.default, static=True)
def cumsum(k: Kernel, out: list[OutSpec], x: np.ndarray, dim: int, *, dtype: Any = None) -> np.ndarray:
    return cumulative(k, x, dim, hbm_empty(out[0]), "add")


@tile_kernel(aten.cumprod.default, static=True)
def cumprod(k: Kernel, out: list[OutSpec], x: np.ndarray, dim: int, *, dtype: Any = None) -> np.ndarray:
    return cumulative(k, x, dim, hbm_empty(out[0]), "multiply")
