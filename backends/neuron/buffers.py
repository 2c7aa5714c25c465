"""neuron device memory: the core's share of HBM, modelled as host numpy blocks.

A block is a flat ``uint8`` numpy array; kernels receive each tensor argument as a typed,
strided numpy view of its block (no copy), which is exactly an HBM access pattern a DMA can
walk. Kernel results are fresh contiguous arrays that become blocks without a copy. Capacity
is the target's HBM per NeuronCore, so ``torch.OutOfMemoryError`` comes at the real limit.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from accelkit.sdk import DeviceAllocator, ViewSpec
from accelkit_backends.neuron.sim import numerics as nx


class NeuronAllocator(DeviceAllocator):
    """Blocks are numpy ``uint8`` arrays; arrays are numpy views (bf16/fp8 via ``ml_dtypes``)."""

    def _alloc_block(self, nbytes: int) -> np.ndarray:
        return np.empty(nbytes, dtype=np.uint8)

    def _block_from_array(self, array: Any) -> tuple[np.ndarray, int] | None:
        if not isinstance(array, np.ndarray) or not array.flags.c_contiguous or not array.flags.owndata:
            return None
        return array.reshape(-1).view(np.uint8), array.nbytes

    def read(self, block: np.ndarray, view: ViewSpec) -> np.ndarray:
        dtype = nx.numpy_dtype(view.dtype)
        strides = tuple(s * dtype.itemsize for s in view.stride)
        try:  # numpy checks that the view lies inside the block
            return np.ndarray(view.size, dtype, block, view.offset * dtype.itemsize, strides)
        except (TypeError, ValueError):  # a view numpy's buffer check cannot place (e.g. an empty one past the end)
            usable = block.shape[0] - block.shape[0] % dtype.itemsize
            typed = block[:usable].view(dtype)
            return np.lib.stride_tricks.as_strided(typed[view.offset:], view.size, strides, writeable=True)

    def write(self, block: np.ndarray, view: ViewSpec, array: Any) -> None:
        target = self.read(block, view)
        if np.shares_memory(target, array):
            array = np.array(array, copy=True)  # source and destination overlap
        target[...] = array

    def to_host(self, array: np.ndarray) -> torch.Tensor:
        return nx.to_torch(array)

    def from_host(self, tensor: torch.Tensor) -> np.ndarray:
        return nx.from_torch(tensor)

    def adopt_host(self, tensor: torch.Tensor) -> np.ndarray:
        return nx.view_torch(tensor)  # written into a block (a copy) before the tensor is reused

    def array_meta(self, array: Any) -> tuple[tuple[int, ...], torch.dtype]:
        array = np.asarray(array)
        return tuple(array.shape), nx.torch_dtype(array.dtype)

    def cast(self, array: np.ndarray, dtype: torch.dtype) -> np.ndarray:
        from accelkit_backends.neuron.conversion import convert

        return convert(array, dtype)

    def read_bytes(self, block: np.ndarray, nbytes: int) -> torch.Tensor:
        return torch.from_numpy(block[:nbytes].copy())

    def write_bytes(self, block: np.ndarray, data: torch.Tensor) -> None:
        block[: data.numel()] = data.numpy()
