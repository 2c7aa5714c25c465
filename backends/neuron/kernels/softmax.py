"""Softmax tile programs: _softmax, _log_softmax, _safe_softmax, their backward passes, and
logsumexp.

Each row along ``dim`` sits on one partition (rows in tiles of at most 128, laid out as in
:mod:`.reductions`), so every sum or max the formulas need is a free-axis reduction. The
Scalar engine computes ``exp(x - max)`` as one activation with the negated row max as its bias
and sums the row in the same instruction (``reduce_into``). Rows up to ``FMAX`` elements are
loaded once; longer rows are streamed in chunks once per pass (max, sum, write).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from accelkit_backends.neuron.launch import OutSpec, chip_dtype, hbm_empty, tile_kernel
from accelkit_backends.neuron.kernels.reductions import (
    Block, chunks, reduce_dims, row_blocks, row_tiles, store_rows,
)
from accelkit_backends.neuron.sim.isa import Kernel
from accelkit_backends.neuron.sim.memory import Tile

aten = torch.ops.aten


def row_reduce(k: Kernel, block: Block, operands: list[int], r0: int, r1: int, op: str, kept: dict,
               pre: Any = None) -> Tile:
    """A [rows, 1] fp32 tile: ``op`` (add or max) over each row of the first of ``operands``,
    or of ``pre(k, tiles, f0, f1)``, which maps each chunk's operand tiles to what is reduced.
    ``kept`` holds the loaded tiles for later passes when a row is a single chunk."""
    result = k.sbuf((r1 - r0, 1), np.float32, op)
    first = True
    for f0, f1, tiles in chunks(k, block, operands, r0, r1, resident=kept):
        source = pre(k, tiles, f0, f1) if pre is not None else tiles[0]
        if first:
            k.tensor_reduce(result, source, op)
            first = False
        else:
            partial = k.sbuf(result.shape, np.float32, "partial")
            k.tensor_reduce(partial, source, op)
            k.tensor_tensor(result, result, partial, "add" if op == "add" else "maximum")
    if first:
        k.memset(result, 0.0 if op == "add" else -math.inf)
    return result


def _store(k: Kernel, target: np.ndarray, r0: int, r1: int, f0: int, f1: int, values: Tile) -> None:
    dtype = chip_dtype(target.dtype)
    if values.dtype != dtype:
        rounded = k.sbuf(values.shape, dtype, "rounded")
        k.tensor_copy(rounded, values)
        values = rounded
    k.dma(target[r0:r1, f0:f1], values)


def softmax_rows(k: Kernel, x: np.ndarray, dim: int, out: np.ndarray, log: bool, safe: bool) -> np.ndarray:
    """``out = softmax(x)`` (or log_softmax) along ``dim``; ``safe`` makes rows that are all
    ``-inf`` zeros instead of NaN (``_safe_softmax``, used by masked attention)."""
    if out.size == 0:
        return out
    for block in row_blocks([x, out], reduce_dims(x.ndim, dim)):
        target = block.views[1]
        for r0, r1 in row_tiles(k, block):
            kept: dict = {}
            peak = row_reduce(k, block, [0], r0, r1, "max", kept)
            shift = k.sbuf(peak.shape, np.float32, "neg_max")
            k.tensor_scalar(shift, peak, "multiply", -1.0)
            empty_rows = None
            if safe:  # fully masked rows: shift by 0, not +inf (-inf + inf is NaN); zeroed below
                empty_rows = k.sbuf(peak.shape, np.bool_, "all_masked")
                k.tensor_scalar(empty_rows, peak, "equal", -math.inf)
                k.select(shift, empty_rows, 0.0, shift)
            total = k.sbuf(peak.shape, np.float32, "sum")
            k.memset(total, 0.0)
            for f0, f1, (chunk,) in chunks(k, block, [0], r0, r1, resident=kept):
                with k.scope():
                    exps = k.sbuf((r1 - r0, f1 - f0), np.float32, "exp")
                    partial = k.sbuf(total.shape, np.float32, "partial")
                    k.activation(exps, chunk, "exp", bias=shift, reduce_into=partial)
                    k.tensor_tensor(total, total, partial, "add")
            if log:
                k.activation(total, total, "log")
            for f0, f1, (chunk,) in chunks(k, block, [0], r0, r1, resident=kept):
                with k.scope():
                    result = k.sbuf((r1 - r0, f1 - f0), np.float32, "result")
                    if log:  # (x - max) - log(sum), in PyTorch's order
                        k.tensor_scalar(result, chunk, "add", shift)
                        k.tensor_scalar(result, result, "subtract", total)
                    else:
                        k.activation(result, chunk, "exp", bias=shift)
                        k.tensor_scalar(result, result, "divide", total)
                    if empty_rows is not None:
                        k.select(result, empty_rows, 0.0, result)
                    _store(k, target, r0, r1, f0, f1, result)
    return out


@tile_kernel(aten._softmax.default, static=True)
def softmax(k: Kernel, out: list[OutSpec], x: np.ndarray, dim: int, half_to_float: bool) -> np.ndarray:
    return softmax_rows(k, x, dim, hbm_empty(out[0]), log=False, safe=False)


@tile_kernel(aten._log_softmax.default, static=True)
def log_softmax(k: Kernel, out: list[OutSpec], x: np.ndarray, dim: int, half_to_float: bool) -> np.ndarray:
    return softmax_rows(k, x, dim, hbm_empty(out[0]), log=True, safe=False)


@tile_kernel(aten._safe_softmax.default, static=True)
def safe_softmax(k: Kernel, out: list[OutSpec], x: np.ndarray, dim: int, dtype: Any = None) -> np.ndarray:
    return softmax_rows(k, x, dim, hbm_empty(out[0]), log=False, safe=True)


def _product(k: Kernel, tiles: list[Tile], f0: int, f1: int) -> Tile:
    product = k.sbuf(tiles[0].shape, np.float32, "grad_times_out")
    k.tensor_tensor(product, tiles[0], tiles[1], "multiply")
    return product


@tile_kernel(aten._softmax_backward_data.default, static=True)
def softmax_backward(k: Kernel, out: list[OutSpec], grad: np.ndarray, output: np.ndarray, dim: int,
                     input_dtype: Any) -> np.ndarray:
    """``grad_input = y * (g - Σ g·y)`` per row."""
    result = hbm_empty(out[0])
    if result.size == 0:
        return result
    for block in row_blocks([grad, output, result], reduce_dims(grad.ndim, dim)):
        for r0, r1 in row_tiles(k, block):
            kept: dict = {}
            dot = row_reduce(k, block, [0, 1], r0, r1, "add", kept, pre=_product)
            for f0, f1, (g, y) in chunks(k, block, [0, 1], r0, r1, resident=kept):
                with k.scope():
                    values = k.sbuf((r1 - r0, f1 - f0), np.float32, "grad_input")
                    k.tensor_scalar(values, g, "subtract", dot)
                    k.tensor_tensor(values, values, y, "multiply")
                    _store(k, block.views[2], r0, r1, f0, f1, values)
    return result


@tile_kernel(aten._log_softmax_backward_data.default, static=True)
def log_softmax_backward(k: Kernel, out: list[OutSpec], grad: np.ndarray, output: np.ndarray, dim: int,
                         input_dtype: Any) -> np.ndarray:
    """``grad_input = g - exp(y) * Σ g`` per row."""
    result = hbm_empty(out[0])
    if result.size == 0:
        return result
    for block in row_blocks([grad, output, result], reduce_dims(grad.ndim, dim)):
        for r0, r1 in row_tiles(k, block):
            kept: dict = {}
            total = row_reduce(k, block, [0, 1], r0, r1, "add", kept)
            for f0, f1, (g, y) in chunks(k, block, [0, 1], r0, r1, resident=kept):
                with k.scope():
                    values = k.sbuf((r1 - r0, f1 - f0), np.float32, "grad_input")
                    k.activation(values, y, "exp")
                    k.tensor_scalar(values, values, "multiply", total)
                    k.tensor_tensor(values, g, values, "subtract")
                    _store(k, block.views[2], r0, r1, f0, f1, values)
    return result


@tile_kernel(aten.logsumexp.default, static=True)
def logsumexp(k: Kernel, out: list[OutSpec], x: np.ndarray, dim: Any, keepdim: bool = False) -> np.ndarray:
    """``log(Σ exp(x - m)) + m`` per row with ``m`` the row max, or 0 where the max is
    infinite (so an all ``-inf`` row gives ``-inf`` and a ``+inf`` one ``inf``, as on CPU)."""
    result = hbm_empty(out[0])
    flat = result.reshape(-1)
    for block in row_blocks([x], reduce_dims(x.ndim, dim)):
        for r0, r1 in row_tiles(k, block):
            kept: dict = {}
            peak = row_reduce(k, block, [0], r0, r1, "max", kept)
            infinite = k.sbuf(peak.shape, np.bool_, "infinite")
            k.activation(infinite, peak, "isinf")
            k.select(peak, infinite, 0.0, peak)
            shift = k.sbuf(peak.shape, np.float32, "neg_max")
            k.tensor_scalar(shift, peak, "multiply", -1.0)
            total = k.sbuf(peak.shape, np.float32, "sum")
            k.memset(total, 0.0)
            for f0, f1, (chunk,) in chunks(k, block, [0], r0, r1, resident=kept):
                with k.scope():
                    exps = k.sbuf((r1 - r0, f1 - f0), np.float32, "exp")
                    partial = k.sbuf(total.shape, np.float32, "partial")
                    k.activation(exps, chunk, "exp", bias=shift, reduce_into=partial)
                    k.tensor_tensor(total, total, partial, "add")
            k.activation(total, total, "log")
            k.tensor_tensor(total, total, peak, "add")
            store_rows(k, flat, block.row0 + r0, total)
    return result
