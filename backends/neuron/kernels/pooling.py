"""2-d pooling tile programs: planes on partitions, one Vector-engine step per kernel tap.

Each (image, channel) plane is one partition; a block of up to 128 planes is loaded into a
padded ``[planes, Hp, Wp]`` SBUF tile, and for each kernel tap ``(i, j)`` the strided window of
that tile holds the tap's value for every output position. Max pooling keeps a running maximum
and the flat input index of its position (``iota`` on GpSimd gives each output's base index);
average pooling sums the windows and divides by a divisor computed the same way from a tile of
ones (so ``count_include_pad`` and ``ceil_mode`` need no special cases). The backward programs
add each tap's share of the output gradient back into a zero-padded fp32 image (col2im).
Adaptive pooling, whose windows differ per output, reduces each output's window sub-tile
separately; adaptive max pooling's backward adds the gradients back with the indirect DMA's
read-modify-write add at the saved indices.

Max pooling follows the CPU kernel's rule exactly: a later value wins when it is greater or NaN,
and a window whose values are all ``-inf`` reports its first in-bounds position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from accelkit_backends.neuron.launch import OutSpec, chip_dtype, hbm_empty, tile_kernel
from accelkit_backends.neuron.kernels.convert import fill
from accelkit_backends.neuron.kernels.indexing import _chunks, _element_span, _flat_values, _load_index, _offsets
from accelkit_backends.neuron.sim import numerics as nx
from accelkit_backends.neuron.sim.isa import Kernel
from accelkit_backends.neuron.sim.memory import Tile

aten = torch.ops.aten


@dataclass(frozen=True)
class Pool:
    """A 2-d pooling's geometry for input planes ``h × w`` and outputs ``ho × wo``."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    h: int
    w: int
    ho: int
    wo: int

    @property
    def padded(self) -> tuple[int, int]:
        """The padded tile, widened to what the last window reaches (``ceil_mode``)."""
        return tuple(max(n + 2 * p, (o - 1) * s + (k - 1) * d + 1) for n, p, o, s, k, d in zip(
            (self.h, self.w), self.padding, (self.ho, self.wo), self.stride, self.kernel, self.dilation))

    def taps(self) -> list[tuple[int, int]]:
        return [(i, j) for i in range(self.kernel[0]) for j in range(self.kernel[1])]

    def window(self, tile: Tile, i: int, j: int) -> Tile:
        (sh, sw), (dh, dw) = self.stride, self.dilation
        r0, c0 = i * dh, j * dw
        return tile[:, r0 : r0 + (self.ho - 1) * sh + 1 : sh, c0 : c0 + (self.wo - 1) * sw + 1 : sw]

    def interior(self, tile: Tile) -> Tile:
        ph, pw = self.padding
        return tile[:, ph : ph + self.h, pw : pw + self.w]

    def tap_offset(self, i: int, j: int) -> int:
        """Flat input index of tap ``(i, j)`` relative to an output's base index."""
        return i * self.dilation[0] * self.w + j * self.dilation[1]


def _pair(value: Any, default: Any = None) -> tuple[int, int]:
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
        value = default
    if isinstance(value, int):
        return value, value
    value = tuple(value)
    return value if len(value) == 2 else (value[0], value[0])


def _geometry(x: np.ndarray, out_shape: tuple[int, ...], kernel_size: Any, stride: Any, padding: Any,
              dilation: Any = 1) -> Pool:
    kernel = _pair(kernel_size)
    return Pool(kernel, _pair(stride, kernel), _pair(padding), _pair(dilation), x.shape[-2], x.shape[-1],
                out_shape[-2], out_shape[-1])


def _planes(array: np.ndarray) -> np.ndarray:
    """``[..., H, W]`` as ``[planes, H, W]`` (a view when the leading dims allow, else values)."""
    return array.reshape((-1,) + array.shape[-2:])


def _plane_blocks(planes: int, partitions: int) -> list[tuple[int, int]]:
    return [(a, min(planes, a + partitions)) for a in range(0, planes, partitions)]


def _load_padded(k: Kernel, planes: np.ndarray, pool: Pool, fill_value: float, dtype: Any, name: str) -> Tile:
    tile = k.sbuf((planes.shape[0], *pool.padded), dtype, name)
    k.memset(tile, fill_value)
    k.dma(pool.interior(tile), planes)
    return tile


def _base_index(k: Kernel, rows: int, pool: Pool) -> Tile:
    """``base[p, oh, ow] = (oh*sh - ph) * W + ow*sw - pw``: the flat input index of tap (0, 0)."""
    base = k.sbuf((rows, pool.ho, pool.wo), np.int32, "base")
    with k.scope():
        _compute_base_index(k, base, pool)
    return base


def _compute_base_index(k: Kernel, base: Tile, pool: Pool) -> None:
    (sh, sw), (ph, pw) = pool.stride, pool.padding
    position = k.sbuf(base.shape, np.int32, "position")
    k.iota(position, base=0, partition_step=0, free_step=1)
    row = k.sbuf(position.shape, np.int32, "row")
    k.tensor_scalar(row, position, "floor_divide", pool.wo)
    column = k.sbuf(position.shape, np.int32, "column")
    k.tensor_scalar(column, position, "remainder", pool.wo)
    k.tensor_scalar(row, row, "multiply", sh * pool.w)
    k.tensor_scalar(column, column, "multiply", sw)
    k.tensor_tensor(base, row, column, "add")
    k.tensor_scalar(base, base, "subtract", ph * pool.w + pw)


def _ones_inside(k: Kernel, rows: int, pool: Pool, region: tuple[int, int, int, int],
                 dtype: Any = np.float32) -> Tile:
    """A ``[rows, Hp, Wp]`` tile of ones on ``region`` (r0, r1, c0, c1), zeros elsewhere."""
    r0, r1, c0, c1 = region
    tile = k.sbuf((rows, *pool.padded), dtype, "ones")
    k.memset(tile, 0)
    k.memset(tile[:, r0:r1, c0:c1], 1)
    return tile


# ---------------------------------------------------------------------------------------------
# Max pooling
# ---------------------------------------------------------------------------------------------


@tile_kernel(aten.max_pool2d_with_indices.default, static=True)
def max_pool2d_with_indices(k: Kernel, out: list[OutSpec], x: np.ndarray, kernel_size: Any,
                            stride: Any = (), padding: Any = 0, dilation: Any = 1,
                            ceil_mode: bool = False) -> tuple[np.ndarray, np.ndarray]:
    values, indices = hbm_empty(out[0]), hbm_empty(out[1])
    if values.size == 0:
        return values, indices
    pool = _geometry(x, values.shape, kernel_size, stride, padding, dilation)
    planes, out_values, out_indices = _planes(x), _planes(values), _planes(indices)
    dtype = chip_dtype(x.dtype)
    lowest = -math.inf if nx.is_float(dtype) else max(np.iinfo(dtype).min, np.iinfo(np.int32).min)
    (ph, pw) = pool.padding
    for a, b in _plane_blocks(planes.shape[0], k.spec.partitions):
        with k.scope():
            rows = b - a
            tile = _load_padded(k, planes[a:b], pool, lowest, dtype, "x")
            valid = _ones_inside(k, rows, pool, (ph, ph + pool.h, pw, pw + pool.w), np.bool_)
            base = _base_index(k, rows, pool)
            best = k.sbuf((rows, pool.ho, pool.wo), dtype, "best")
            k.memset(best, lowest)
            index = k.sbuf(best.shape, np.int32, "index")
            k.memset(index, 0)
            chosen = k.sbuf(best.shape, np.bool_, "chosen")  # index names an in-bounds position
            k.memset(chosen, 0)
            for i, j in pool.taps():
                with k.scope():
                    _max_tap(k, pool.window(tile, i, j), pool.window(valid, i, j), base,
                             pool.tap_offset(i, j), best, index, chosen)
            k.dma(out_values[a:b], best)
            k.dma(out_indices[a:b], index)
    return values, indices


def _max_tap(k: Kernel, window: Tile, valid: Tile, base: Tile, offset: int, best: Tile, index: Tile,
             chosen: Tile) -> None:
    """Take the tap where it is greater or NaN, or is the first in-bounds one."""
    take = k.sbuf(best.shape, np.bool_, "take")
    k.tensor_tensor(take, window, best, "greater")
    nan = k.sbuf(best.shape, np.bool_, "nan")
    k.tensor_tensor(nan, window, window, "not_equal")
    k.tensor_tensor(take, take, nan, "logical_or")
    first = k.sbuf(best.shape, np.bool_, "first")
    k.tensor_scalar(first, chosen, "equal", 0)
    k.tensor_tensor(first, first, valid, "logical_and")
    k.tensor_tensor(take, take, first, "logical_or")
    k.select(best, take, window, best)
    candidate = k.sbuf(index.shape, np.int32, "candidate")
    k.tensor_scalar(candidate, base, "add", offset)
    k.select(index, take, candidate, index)
    k.tensor_tensor(chosen, chosen, first, "logical_or")


@tile_kernel(aten.max_pool2d_with_indices_backward.default, static=True)
def max_pool2d_with_indices_backward(k: Kernel, out: list[OutSpec], grad: np.ndarray, x: np.ndarray,
                                     kernel_size: Any, stride: Any, padding: Any, dilation: Any,
                                     ceil_mode: bool, indices: np.ndarray) -> np.ndarray:
    """Each output's gradient added at the position its index names: for every tap, where the
    saved index equals the tap's position (a GpSimd compare)."""
    result = hbm_empty(out[0])
    if result.size == 0:
        return result
    pool = _geometry(x, grad.shape, kernel_size, stride, padding, dilation)
    planes_grad, planes_index, planes_out = _planes(grad), _planes(indices), _planes(result)
    for a, b in _plane_blocks(planes_out.shape[0], k.spec.partitions):
        with k.scope():
            rows = b - a
            g = _load(k, planes_grad[a:b], "grad")
            index = _load(k, planes_index[a:b], "index")
            base = _base_index(k, rows, pool)
            image = k.sbuf((rows, *pool.padded), np.float32, "image")
            k.memset(image, 0)
            for i, j in pool.taps():
                with k.scope():
                    candidate = k.sbuf(index.shape, np.int32, "candidate")
                    k.tensor_scalar(candidate, base, "add", pool.tap_offset(i, j))
                    hit = k.sbuf(index.shape, np.bool_, "hit")
                    k.tensor_tensor(hit, index, candidate, "equal")
                    share = k.sbuf(index.shape, np.float32, "share")
                    k.select(share, hit, g, 0.0)
                    window = pool.window(image, i, j)
                    k.tensor_tensor(window, window, share, "add")
            _store_interior(k, image, pool, planes_out[a:b])
    return result


def _load(k: Kernel, view: np.ndarray, name: str) -> Tile:
    tile = k.sbuf(view.shape, chip_dtype(view.dtype), name)
    k.dma(tile, view)
    return tile


def _store_interior(k: Kernel, image: Tile, pool: Pool, target: np.ndarray) -> None:
    result = k.sbuf(target.shape, chip_dtype(target.dtype), "result")
    k.tensor_copy(result, pool.interior(image))
    k.dma(target, result)


# ---------------------------------------------------------------------------------------------
# Average pooling
# ---------------------------------------------------------------------------------------------


def _divisor(k: Kernel, rows: int, pool: Pool, count_include_pad: bool, divisor_override: Any) -> Tile:
    """Each output's divisor: the override, or how many of its window's cells count (the
    padded area without the ``ceil_mode`` overhang, or only the input)."""
    divisor = k.sbuf((rows, pool.ho, pool.wo), np.float32, "divisor")
    if divisor_override:
        k.memset(divisor, divisor_override)
        return divisor
    (ph, pw) = pool.padding
    region = (0, pool.h + 2 * ph, 0, pool.w + 2 * pw) if count_include_pad else (ph, ph + pool.h, pw, pw + pool.w)
    ones = _ones_inside(k, rows, pool, region)
    k.memset(divisor, 0)
    for i, j in pool.taps():
        window = pool.window(ones, i, j)
        k.tensor_tensor(divisor, divisor, window, "add")
    return divisor


@tile_kernel(aten.avg_pool2d.default, static=True)
def avg_pool2d(k: Kernel, out: list[OutSpec], x: np.ndarray, kernel_size: Any, stride: Any = (),
               padding: Any = 0, ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: Any = None) -> np.ndarray:
    result = hbm_empty(out[0])
    if result.size == 0:
        return result
    pool = _geometry(x, result.shape, kernel_size, stride, padding)
    planes, planes_out = _planes(x), _planes(result)
    for a, b in _plane_blocks(planes.shape[0], k.spec.partitions):
        with k.scope():
            rows = b - a
            tile = _load_padded(k, planes[a:b], pool, 0, chip_dtype(x.dtype), "x")
            total = k.sbuf((rows, pool.ho, pool.wo), np.float32, "total")
            k.memset(total, 0)
            for i, j in pool.taps():
                k.tensor_tensor(total, total, pool.window(tile, i, j), "add")
            k.tensor_tensor(total, total, _divisor(k, rows, pool, count_include_pad, divisor_override), "divide")
            stored = k.sbuf(total.shape, chip_dtype(result.dtype), "stored")
            k.tensor_copy(stored, total)
            k.dma(planes_out[a:b], stored)
    return result


@tile_kernel(aten.avg_pool2d_backward.default, static=True)
def avg_pool2d_backward(k: Kernel, out: list[OutSpec], grad: np.ndarray, x: np.ndarray, kernel_size: Any,
                        stride: Any, padding: Any, ceil_mode: bool, count_include_pad: bool,
                        divisor_override: Any) -> np.ndarray:
    result = hbm_empty(out[0])
    if result.size == 0:
        return result
    pool = _geometry(x, grad.shape, kernel_size, stride, padding)
    planes_grad, planes_out = _planes(grad), _planes(result)
    for a, b in _plane_blocks(planes_out.shape[0], k.spec.partitions):
        with k.scope():
            rows = b - a
            share = k.sbuf((rows, pool.ho, pool.wo), np.float32, "share")
            k.tensor_copy(share, _load(k, planes_grad[a:b], "grad"))
            k.tensor_tensor(share, share, _divisor(k, rows, pool, count_include_pad, divisor_override), "divide")
            image = k.sbuf((rows, *pool.padded), np.float32, "image")
            k.memset(image, 0)
            for i, j in pool.taps():
                window = pool.window(image, i, j)
                k.tensor_tensor(window, window, share, "add")
            _store_interior(k, image, pool, planes_out[a:b])
    return result


# ---------------------------------------------------------------------------------------------
# Adaptive average pooling: windows that differ per output, one reduction each
# ---------------------------------------------------------------------------------------------


def _adaptive_windows(size: int, outputs: int) -> list[tuple[int, int]]:
    """PyTorch's adaptive windows: ``[floor(o*size/outputs), ceil((o+1)*size/outputs))``."""
    return [((o * size) // outputs, -(-((o + 1) * size) // outputs)) for o in range(outputs)]


@tile_kernel(aten._adaptive_avg_pool2d.default, static=True)
def adaptive_avg_pool2d(k: Kernel, out: list[OutSpec], x: np.ndarray, output_size: Any) -> np.ndarray:
    """Each output is the mean of its window: a Vector-engine reduction over the window's
    sub-tile, then a multiply by the reciprocal of its size."""
    result = hbm_empty(out[0])
    if result.size == 0:
        return result
    planes, planes_out = _planes(x), _planes(result)
    rows_windows = _adaptive_windows(x.shape[-2], result.shape[-2])
    cols_windows = _adaptive_windows(x.shape[-1], result.shape[-1])
    for a, b in _plane_blocks(planes.shape[0], k.spec.partitions):
        with k.scope():
            tile = _load(k, planes[a:b], "x")
            total = k.sbuf((b - a, len(rows_windows), len(cols_windows)), np.float32, "total")
            for oh, (h0, h1) in enumerate(rows_windows):
                for ow, (w0, w1) in enumerate(cols_windows):
                    cell = total[:, oh : oh + 1, ow : ow + 1]
                    k.tensor_reduce(cell, tile[:, h0:h1, w0:w1], "add")
                    k.tensor_scalar(cell, cell, "multiply", 1.0 / ((h1 - h0) * (w1 - w0)))
            stored = k.sbuf(total.shape, chip_dtype(result.dtype), "stored")
            k.tensor_copy(stored, total)
            k.dma(planes_out[a:b], stored)
    return result


@tile_kernel(aten._adaptive_avg_pool2d_backward.default, static=True)
def adaptive_avg_pool2d_backward(k: Kernel, out: list[OutSpec], grad: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Each output's gradient, divided by its window's size, added over the window."""
    result = hbm_empty(out[0])
    if result.size == 0:
        return result
    planes_grad, planes_out = _planes(grad), _planes(result)
    rows_windows = _adaptive_windows(x.shape[-2], grad.shape[-2])
    cols_windows = _adaptive_windows(x.shape[-1], grad.shape[-1])
    for a, b in _plane_blocks(planes_out.shape[0], k.spec.partitions):
        with k.scope():
            g = _load(k, planes_grad[a:b], "grad")
            image = k.sbuf((b - a,) + x.shape[-2:], np.float32, "image")
            k.memset(image, 0)
            share = k.sbuf((b - a, 1, 1), np.float32, "share")
            for oh, (h0, h1) in enumerate(rows_windows):
                for ow, (w0, w1) in enumerate(cols_windows):
                    k.tensor_scalar(share, g[:, oh : oh + 1, ow : ow + 1], "multiply", 1.0 / ((h1 - h0) * (w1 - w0)))
                    window = image[:, h0:h1, w0:w1]
                    k.tensor_scalar(window, window, "add", share)
            stored = k.sbuf(image.shape, chip_dtype(result.dtype), "stored")
            k.tensor_copy(stored, image)
            k.dma(planes_out[a:b], stored)
    return result


# ---------------------------------------------------------------------------------------------
# Adaptive max pooling: one reduction and one argmax per output window
# ---------------------------------------------------------------------------------------------


@tile_kernel(aten.adaptive_max_pool2d.default, static=True)
def adaptive_max_pool2d(k: Kernel, out: list[OutSpec], x: np.ndarray, output_size: Any) -> tuple:
    """Each output's window maximum (VectorE ``max``) and the flat input index of its first
    occurrence (``argmax`` within the window, turned into ``h * W + w`` on GpSimd). A window
    holding several NaNs reports the first (the CPU kernel the last; the value is NaN either way)."""
    values, indices = hbm_empty(out[0]), hbm_empty(out[1])
    if values.size == 0:
        return values, indices
    planes, planes_values, planes_indices = _planes(x), _planes(values), _planes(indices)
    width = x.shape[-1]
    rows_windows = _adaptive_windows(x.shape[-2], values.shape[-2])
    cols_windows = _adaptive_windows(width, values.shape[-1])
    for a, b in _plane_blocks(planes.shape[0], k.spec.partitions):
        with k.scope():
            tile = _load(k, planes[a:b], "x")
            best = k.sbuf((b - a, len(rows_windows), len(cols_windows)), tile.dtype, "best")
            index = k.sbuf(best.shape, np.int32, "index")
            column = k.sbuf((b - a, 1, 1), np.int32, "column")
            for oh, (h0, h1) in enumerate(rows_windows):
                for ow, (w0, w1) in enumerate(cols_windows):
                    window = tile[:, h0:h1, w0:w1]
                    cell = index[:, oh : oh + 1, ow : ow + 1]
                    k.tensor_reduce(best[:, oh : oh + 1, ow : ow + 1], window, "max")
                    k.tensor_reduce(cell, window, "argmax")
                    k.tensor_scalar(column, cell, "remainder", w1 - w0)
                    k.tensor_scalar(cell, cell, "floor_divide", w1 - w0)
                    k.tensor_scalar(cell, cell, "multiply", width)
                    k.tensor_tensor(cell, cell, column, "add")
                    k.tensor_scalar(cell, cell, "add", h0 * width + w0)
            k.dma(planes_values[a:b], best)
            k.dma(planes_indices[a:b], index)
    return values, indices


@tile_kernel(aten.adaptive_max_pool2d_backward.default, static=True)
def adaptive_max_pool2d_backward(k: Kernel, out: list[OutSpec], grad: np.ndarray, x: np.ndarray,
                                 indices: np.ndarray) -> np.ndarray:
    """A zeroed result, then every output gradient added at its saved input position by the
    indirect DMA store with add (positions shared by several windows accumulate)."""
    result = fill(k, out[0], 0)
    if result.size == 0 or grad.size == 0:
        return result
    plane_size, outputs = x.shape[-2] * x.shape[-1], grad.shape[-2] * grad.shape[-1]
    flat_index, flat_grad = _flat_values(indices), _flat_values(grad)
    table = _element_span(result)
    shape = (flat_grad.size // outputs, outputs)
    for start, rows, cols in _chunks(flat_grad.size, k.spec.partitions):
        with k.scope():
            index = _load_index(k, flat_index, start, rows, cols)
            offsets = _offsets(k, start, rows, cols, shape, [(0, plane_size)], [(index, 1)])
            g = _load_index(k, flat_grad, start, rows, cols, "grad")
            for c in range(cols):
                k.scatter_rows(table, g[:, c : c + 1], offsets[:, c : c + 1], accumulate=True)
    return result
