"""Layer norm tile programs: native_layer_norm and native_layer_norm_backward.

Each normalized row (the trailing ``normalized_shape`` elements) sits on one partition, so the
row statistics are free-axis reductions: the mean on the Vector engine, the sum of squared
deviations as one Scalar-engine ``square(x - mean)`` activation that also sums the row
(``reduce_into``). The affine weight and bias are broadcast over partitions by their DMA.

The backward pass needs two per-row sums (``Σ g·w`` and ``Σ g·w·x̂``) for the input gradient
and two sums *over rows* for the weight and bias gradients (``Σ g·x̂``, ``Σ g``): the latter are
cross-partition sums, done on the Tensor engine as a matmul with a ones vector into fp32 PSUM,
then accumulated over row tiles in an fp32 SBUF row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from accelkit_backends.neuron.launch import OutSpec, chip_dtype, hbm_empty, tile_kernel
from accelkit_backends.neuron.kernels.reductions import (
    Block, chunks, row_blocks, row_mean, row_tiles, store_rows, sum_of_squares,
)
from accelkit_backends.neuron.sim.isa import Kernel
from accelkit_backends.neuron.sim.memory import Tile

aten = torch.ops.aten


def _normalized_dims(x: np.ndarray, normalized_shape: Any) -> tuple[int, ...]:
    return tuple(range(x.ndim - len(normalized_shape), x.ndim))


def load_broadcast(k: Kernel, vector: np.ndarray | None, rows: int, f0: int, f1: int, name: str) -> Tile | None:
    """Elements ``f0:f1`` of a flattened affine parameter, repeated on ``rows`` partitions."""
    if vector is None:
        return None
    flat = vector.reshape(-1)[f0:f1]
    tile = k.sbuf((rows, f1 - f0), chip_dtype(vector.dtype), name)
    k.dma(tile, np.broadcast_to(flat, (rows, f1 - f0)))
    return tile


def load_row_scalars(k: Kernel, values: np.ndarray, row0: int, r0: int, r1: int, name: str) -> Tile:
    """Per-row statistics (mean, rstd) ``values.flat[row0 + r0 : row0 + r1]`` as [rows, 1]."""
    tile = k.sbuf((r1 - r0, 1), chip_dtype(values.dtype), name)
    k.dma(tile, values.reshape(-1)[row0 + r0 : row0 + r1].reshape(-1, 1))
    return tile


def normalize(k: Kernel, chunk: Tile, mean: Tile, rstd: Tile) -> Tile:
    """``x̂ = (x - mean) * rstd`` in fp32."""
    normalized = k.sbuf(chunk.shape, np.float32, "x_hat")
    k.tensor_scalar(normalized, chunk, "subtract", mean)
    k.tensor_scalar(normalized, normalized, "multiply", rstd)
    return normalized


@tile_kernel(aten.native_layer_norm.default, static=True)
def native_layer_norm(k: Kernel, out: list[OutSpec], x: np.ndarray, normalized_shape: Any,
                      weight: np.ndarray | None, bias: np.ndarray | None, eps: float) -> tuple:
    """(output, mean, rstd). CPU keeps the statistics of a bfloat16/float16 ``x`` in its dtype,
    or in float32 beside a float32 weight or bias; PyTorch's Meta kernel (``out``) says float32
    always, so the statistics' dtype is decided here."""
    result = hbm_empty(out[0])
    mean_out, rstd_out = (hbm_empty(OutSpec(spec.shape, _statistics_dtype(out[0].dtype, weight, bias)))
                          for spec in out[1:])
    layer_norm_into(k, x, _normalized_dims(x, normalized_shape), weight, bias, eps, result,
                    mean_out, rstd_out)
    return result, mean_out, rstd_out


def _statistics_dtype(dtype: torch.dtype, weight: np.ndarray | None, bias: np.ndarray | None) -> torch.dtype:
    mixed = any(p is not None and p.dtype == np.float32 for p in (weight, bias))
    return dtype if dtype in (torch.bfloat16, torch.float16) and not mixed else torch.float32


def layer_norm_into(k: Kernel, x: np.ndarray, dims: tuple[int, ...], weight: np.ndarray | None,
                    bias: np.ndarray | None, eps: float, result: np.ndarray,
                    mean_out: np.ndarray | None = None, rstd_out: np.ndarray | None = None) -> None:
    """``result = (x - mean) * rstd * weight + bias`` over the trailing ``dims``; the row
    statistics also go to ``mean_out`` and ``rstd_out`` when given."""
    if x.size == 0:
        return
    for block in row_blocks([x, result], dims):
        for r0, r1 in row_tiles(k, block):
            kept: dict = {}
            mean = row_mean(k, block, 0, r0, r1, kept)
            negated = k.sbuf(mean.shape, np.float32, "neg_mean")
            k.tensor_scalar(negated, mean, "multiply", -1.0)
            rstd = sum_of_squares(k, block, r0, r1, negated, kept)
            k.tensor_scalar(rstd, rstd, "divide", float(block.views[0].shape[1]))
            k.activation(rstd, rstd, "rsqrt", bias=float(eps))
            for f0, f1, (chunk,) in chunks(k, block, [0], r0, r1, resident=kept):
                with k.scope():
                    values = normalize(k, chunk, mean, rstd)
                    scale = load_broadcast(k, weight, r1 - r0, f0, f1, "weight")
                    shift = load_broadcast(k, bias, r1 - r0, f0, f1, "bias")
                    if scale is not None:
                        k.tensor_tensor(values, values, scale, "multiply")
                    if shift is not None:
                        k.tensor_tensor(values, values, shift, "add")
                    _store(k, block.views[1], r0, r1, f0, f1, values)
            if mean_out is not None:
                store_rows(k, mean_out.reshape(-1), block.row0 + r0, mean)
            if rstd_out is not None:
                store_rows(k, rstd_out.reshape(-1), block.row0 + r0, rstd)


def _store(k: Kernel, target: np.ndarray, r0: int, r1: int, f0: int, f1: int, values: Tile) -> None:
    dtype = chip_dtype(target.dtype)
    if values.dtype != dtype:
        rounded = k.sbuf(values.shape, dtype, "rounded")
        k.tensor_copy(rounded, values)
        values = rounded
    k.dma(target[r0:r1, f0:f1], values)


class _ColumnSums:
    """fp32 sums over all rows of per-element products, one [1, F] SBUF row each: every row
    tile's contribution is a ones-vector matmul (Tensor engine) into PSUM, added here."""

    def __init__(self, k: Kernel, cols: int, name: str):
        self.k = k
        self.total = k.sbuf((1, cols), np.float32, name)
        k.memset(self.total, 0.0)
        self.ones = k.sbuf((k.spec.partitions, 1), np.float32, name + "_ones")
        k.memset(self.ones, 1.0)

    def add(self, values: Tile, f0: int) -> None:
        k = self.k
        rows, cols = values.partitions, values.free_size
        for c0 in range(0, cols, k.spec.gemm_moving_fmax):
            c1 = min(cols, c0 + k.spec.gemm_moving_fmax)
            with k.scope():
                summed = k.psum((1, c1 - c0), np.float32, "column_sum")
                k.matmul(summed, self.ones[:rows], values[:, c0:c1])
                part = self.total[:, f0 + c0 : f0 + c1]
                k.tensor_tensor(part, part, summed, "add")

    def store(self, target: np.ndarray) -> None:
        store_rows(self.k, target.reshape(-1), 0, self.total)


@tile_kernel(aten.native_layer_norm_backward.default, static=True)
def native_layer_norm_backward(k: Kernel, out: list[OutSpec], grad: np.ndarray, x: np.ndarray,
                               normalized_shape: Any, mean: np.ndarray, rstd: np.ndarray,
                               weight: np.ndarray | None, bias: np.ndarray | None,
                               output_mask: Any) -> tuple:
    """``dx = rstd * (g·w - mean(g·w) - x̂ * mean(g·w·x̂))``; ``dw = Σ_rows g·x̂``; ``db = Σ_rows g``."""
    wanted = [bool(m) and spec is not None for m, spec in zip(output_mask, out)]
    grad_input = hbm_empty(out[0]) if wanted[0] else None
    grad_weight = hbm_empty(out[1]) if wanted[1] else None
    grad_bias = hbm_empty(out[2]) if wanted[2] else None
    dims = _normalized_dims(x, normalized_shape)
    cols = int(np.prod([x.shape[d] for d in dims]))
    if x.size == 0:
        for result in (grad_weight, grad_bias):
            if result is not None:
                zeros = k.sbuf((1, cols), chip_dtype(result.dtype), "zeros")
                k.memset(zeros, 0.0)
                k.dma(result.reshape(1, cols), zeros)
        return grad_input, grad_weight, grad_bias
    arrays = [grad, x] + ([grad_input] if grad_input is not None else [])
    with k.scope():
        weight_sums = _ColumnSums(k, cols, "grad_weight") if grad_weight is not None else None
        bias_sums = _ColumnSums(k, cols, "grad_bias") if grad_bias is not None else None
        for block in row_blocks(arrays, dims):
            for r0, r1 in row_tiles(k, block):
                _backward_rows(k, block, r0, r1, mean, rstd, weight, grad_input is not None,
                               weight_sums, bias_sums)
        if weight_sums is not None:
            weight_sums.store(grad_weight)
        if bias_sums is not None:
            bias_sums.store(grad_bias)
    return grad_input, grad_weight, grad_bias


def _backward_rows(k: Kernel, block: Block, r0: int, r1: int, mean_hbm: np.ndarray,
                   rstd_hbm: np.ndarray, weight: np.ndarray | None, input_wanted: bool,
                   weight_sums: _ColumnSums | None, bias_sums: _ColumnSums | None) -> None:
    rows, cols = r1 - r0, block.views[0].shape[1]
    mean = load_row_scalars(k, mean_hbm, block.row0, r0, r1, "mean")
    rstd = load_row_scalars(k, rstd_hbm, block.row0, r0, r1, "rstd")
    sum_gw = k.sbuf((rows, 1), np.float32, "sum_gw")
    sum_gw_xhat = k.sbuf((rows, 1), np.float32, "sum_gw_xhat")
    k.memset(sum_gw, 0.0)
    k.memset(sum_gw_xhat, 0.0)
    kept: dict = {}

    def scaled_grad(g: Tile, f0: int, f1: int) -> Tile:
        gw = k.sbuf(g.shape, np.float32, "gw")
        scale = load_broadcast(k, weight, rows, f0, f1, "weight")
        if scale is None:
            k.tensor_copy(gw, g)
        else:
            k.tensor_tensor(gw, g, scale, "multiply")
        return gw

    for f0, f1, (g, xs) in chunks(k, block, [0, 1], r0, r1, resident=kept):
        with k.scope():
            x_hat = normalize(k, xs, mean, rstd)
            gw = scaled_grad(g, f0, f1)
            partial = k.sbuf((rows, 1), np.float32, "partial")
            k.tensor_reduce(partial, gw, "add")
            k.tensor_tensor(sum_gw, sum_gw, partial, "add")
            product = k.sbuf(gw.shape, np.float32, "product")
            k.tensor_tensor(product, gw, x_hat, "multiply")
            k.tensor_reduce(partial, product, "add")
            k.tensor_tensor(sum_gw_xhat, sum_gw_xhat, partial, "add")
            if weight_sums is not None:
                k.tensor_tensor(product, g, x_hat, "multiply")
                weight_sums.add(product, f0)
            if bias_sums is not None:
                g32 = g
                if g.dtype != np.float32:
                    g32 = k.sbuf(g.shape, np.float32, "g32")
                    k.tensor_copy(g32, g)
                bias_sums.add(g32, f0)
    if not input_wanted:
        return
    k.tensor_scalar(sum_gw, sum_gw, "divide", float(cols))
    k.tensor_scalar(sum_gw_xhat, sum_gw_xhat, "divide", float(cols))
    for f0, f1, (g, xs) in chunks(k, block, [0, 1], r0, r1, resident=kept):
        with k.scope():
            x_hat = normalize(k, xs, mean, rstd)
            gw = scaled_grad(g, f0, f1)
            k.tensor_scalar(x_hat, x_hat, "multiply", sum_gw_xhat)
            k.tensor_tensor(gw, gw, x_hat, "subtract")
            k.tensor_scalar(gw, gw, "subtract", sum_gw)
            k.tensor_scalar(gw, gw, "multiply", rstd)
            _store(k, block.views[2], r0, r1, f0, f1, gw)
