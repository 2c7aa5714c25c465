"""Conversion, fill, zero and arange kernels: the programs that make or convert whole tensors
(the conversion program itself is :mod:`accelkit_backends.neuron.conversion`, which the
allocator's ``cast`` uses too)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from accelkit_backends.neuron.conversion import copy_into
from accelkit_backends.neuron.launch import OutSpec, chip_dtype, hbm_empty, tile_kernel
from accelkit_backends.neuron.tiling import flat_chunks, map_flat
from accelkit_backends.neuron.sim import numerics as nx
from accelkit_backends.neuron.sim.isa import Kernel

aten = torch.ops.aten


def fill(k: Kernel, out: OutSpec, value: Any) -> np.ndarray:
    result = hbm_empty(out)
    flat = result.reshape(-1)
    tile_dtype = chip_dtype(result.dtype)
    tile = None
    for start, rows, cols in flat_chunks(result.size, k.spec.partitions):
        if tile is None or tile.shape != (rows, cols):
            tile = k.sbuf((rows, cols), tile_dtype, "value")
            k.memset(tile, value)
        k.dma(flat[start : start + rows * cols].reshape(rows, cols), tile)
    return result


@tile_kernel(aten.fill.Scalar, static=True)
def fill_scalar(k: Kernel, out: list[OutSpec], x: np.ndarray, value: Any) -> np.ndarray:
    return fill(k, out[0], value)


@tile_kernel(aten.fill.Tensor, static=True)
def fill_tensor(k: Kernel, out: list[OutSpec], x: np.ndarray, value: np.ndarray) -> np.ndarray:
    result = hbm_empty(out[0])
    return map_flat(k, result, [value], lambda dst, srcs: copy_into(k, dst, srcs[0]))


@tile_kernel(aten.zero.default, static=True)
def zero(k: Kernel, out: list[OutSpec], x: np.ndarray) -> np.ndarray:
    return fill(k, out[0], 0)


@tile_kernel(aten.arange.start_step, static=True)
def arange(k: Kernel, out: list[OutSpec], start: Any, end: Any, step: Any = 1, **_options: Any) -> np.ndarray:
    """``start + i * step`` for each position ``i``: indices from GpSimd's iota, scaled and
    offset on the Vector engine (fp32 for floating results, exact integers otherwise)."""
    result = hbm_empty(out[0])
    flat = result.reshape(-1)
    floating = result.dtype.kind == "f" or nx.is_float(result.dtype)
    if not floating and result.dtype != np.bool_:
        start, step = int(start), int(step)  # as the CPU kernel: 2.1 by -1.0 counts 2, 1, 0, -1
    for first, rows, cols in flat_chunks(result.size, k.spec.partitions):
        with k.scope():
            index = k.sbuf((rows, cols), np.int64 if not floating else np.int32, "i")
            k.iota(index, base=first, partition_step=cols, free_step=1)
            values = k.sbuf((rows, cols), chip_dtype(result.dtype), "v")
            k.tensor_scalar(values, index, "multiply", step)
            k.tensor_scalar(values, values, "add", start)
            k.dma(flat[first : first + rows * cols].reshape(rows, cols), values)
    return result
