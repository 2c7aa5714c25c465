"""Dtype conversion as a tile program: the allocator's ``cast`` and the kernels use it."""

from __future__ import annotations

import numpy as np
import torch

from accelkit_backends.neuron import cost, launch, runtime
from accelkit_backends.neuron.sim import numerics as nx
from accelkit_backends.neuron.sim.isa import Kernel
from accelkit_backends.neuron.sim.memory import Tile
from accelkit_backends.neuron.tiling import map_flat, map_pairs, pairs


def convert(array: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """``array`` in ``dtype``: loaded, converted by a Vector-engine copy (rounding as the
    hardware does, see :mod:`numerics`), stored. Runs as the static kernel ``convert`` (its
    instructions follow from the layouts and dtypes), so a program holding one replays.

    complex64 is float32 pairs: a real ``array`` becomes the real parts (imaginary parts 0), a
    complex one keeps its real parts in a real ``dtype`` (PyTorch warns of that before it gets
    here)."""
    target = nx.numpy_dtype(dtype)
    if target.kind == "c" or array.dtype.kind == "c":
        return _convert_complex(array, dtype)
    cost.LEDGER.note_instance("convert", (array.shape, array.dtype.str, target.str))

    def body(k: Kernel, arrays: list[np.ndarray]) -> np.ndarray:
        return cast(k, [launch.OutSpec(array.shape, dtype)], arrays[0])

    instance = ("convert", (("array", array.shape, array.dtype.str, array.strides),), (target.str,))
    return launch.run_static("convert", instance, [array], (), body)


def cast(k: Kernel, out: list, x: np.ndarray, **_: object) -> np.ndarray:
    """The body of a dtype cast (``_to_copy`` that changes only the dtype) as one elementwise
    map into a new array of ``out[0]``: what a compiled graph fuses into its neighbours."""
    result = launch.hbm_empty(out[0])
    map_flat(k, result, [x], lambda dst, srcs: copy_into(k, dst, srcs[0]))
    return result


def copy_into(k: Kernel, dst: Tile, src: Tile) -> None:
    """Copy ``src`` into ``dst`` on the Vector engine, converting dtype; a smaller ``src``
    broadcasts (zero, then add)."""
    if src.shape != dst.shape:
        k.memset(dst, 0)
        k.tensor_scalar(dst, dst, "add", src)
    else:
        k.tensor_copy(dst, src)


def _convert_complex(array: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    target = nx.numpy_dtype(dtype)
    if target.kind == "c" and target != np.complex64 or array.dtype.kind == "c" and array.dtype != np.complex64:
        runtime.accelkit_dtype_rules().check(dtype if target.kind == "c" else nx.torch_dtype(array.dtype), "neuron:0")
    cost.LEDGER.note_instance("convert", (array.shape, array.dtype.str, target.str))

    def body(k: Kernel, arrays: list[np.ndarray]) -> np.ndarray:
        result = launch.hbm_empty(array.shape, dtype)
        if target.kind != "c":  # the real parts
            map_flat(k, result, [pairs(arrays[0])[..., 0]], lambda dst, srcs: copy_into(k, dst, srcs[0]))
        elif array.dtype.kind != "c":  # (value, 0) pairs

            def widen(dst: Tile, srcs: list[Tile]) -> None:
                k.tensor_copy(dst[:, :, 0:1], srcs[0])
                k.memset(dst[:, :, 1:2], 0)

            map_pairs(k, result, arrays, widen)
        else:
            map_pairs(k, result, arrays, lambda dst, srcs: k.tensor_copy(dst, srcs[0]))
        return result

    instance = ("convert", (("array", array.shape, array.dtype.str, array.strides),), (target.str,))
    return launch.run_static("convert", instance, [array], (), body)
