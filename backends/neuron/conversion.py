"""Dtype conversion as a tile program: the allocator's ``cast`` and the kernels use it."""

from __future__ import annotations

import numpy as np
import torch

from accelkit_backends.neuron import cost, launch
from accelkit_backends.neuron.sim import numerics as nx
from accelkit_backends.neuron.sim.isa import Kernel
from accelkit_backends.neuron.sim.memory import Tile
from accelkit_backends.neuron.tiling import map_flat


def convert(array: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """``array`` in ``dtype``: loaded, converted by a Vector-engine copy (rounding as the
    hardware does, see :mod:`numerics`), stored. Runs as the static kernel ``convert`` (its
    instructions follow from the layouts and dtypes), so a program holding one replays."""
    target = nx.numpy_dtype(dtype)
    cost.LEDGER.note_instance("convert", (array.shape, array.dtype.str, target.str))

    def body(k: Kernel, arrays: list[np.ndarray]) -> np.ndarray:
        result = launch.hbm_empty(array.shape, dtype)
        map_flat(k, result, arrays, lambda dst, srcs: copy_into(k, dst, srcs[0]))
        return result

    instance = ("convert", (("array", array.shape, array.dtype.str, array.strides),), (target.str,))
    return launch.run_static("convert", instance, [array], (), body)


def copy_into(k: Kernel, dst: Tile, src: Tile) -> None:
    """Copy ``src`` into ``dst`` on the Vector engine, converting dtype; a smaller ``src``
    broadcasts (zero, then add)."""
    if src.shape != dst.shape:
        k.memset(dst, 0)
        k.tensor_scalar(dst, dst, "add", src)
    else:
        k.tensor_copy(dst, src)
