"""neuron device memory: the core's share of HBM, modelled as host numpy blocks.

A block is a flat ``uint8`` numpy array; kernels receive each tensor argument as a typed,
strided numpy view of its block (no copy), which is exactly an HBM access pattern a DMA can
walk. Kernel results are fresh contiguous arrays that become blocks without a copy. Capacity
is the target's HBM per NeuronCore, so ``torch.OutOfMemoryError`` comes at the real limit.

Under adaptive eager (:mod:`.adaptive`) a recorded op's result is a :class:`~.adaptive.Deferred`
block, adopted at the op with its bytes and computed at the next flush; the methods below
flush first wherever the host would read or write memory the open region computes, reads or
writes, and record an in-place write of a pending value as a store of the region.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from accelkit.sdk import DeviceAllocator, ViewSpec
from accelkit_backends.neuron import adaptive
from accelkit_backends.neuron.adaptive import Deferred, PendingView
from accelkit_backends.neuron.cost import LEDGER
from accelkit_backends.neuron.sim import numerics as nx


class NeuronAllocator(DeviceAllocator):
    """Blocks are numpy ``uint8`` arrays; arrays are numpy views (bf16/fp8 via ``ml_dtypes``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._writes: dict[int, int] = {}  # id of a live block -> in-place writes to it

    def _alloc_block(self, nbytes: int) -> np.ndarray:
        return np.empty(nbytes, dtype=np.uint8)

    def block_writes(self, block: Any) -> tuple[int, int]:
        return id(block), self._writes.get(id(block), 0)

    def adopt(self, array: Any) -> Any:
        buffer = super().adopt(array)  # may raise torch.OutOfMemoryError: nothing adopted then
        if buffer is not None and type(array) is PendingView:
            adaptive.adopted(array)
        return buffer

    def _block_from_array(self, array: Any) -> tuple[Any, int] | None:
        if type(array) is PendingView:
            return adaptive.adoptable(array)
        if not isinstance(array, np.ndarray) or not array.flags.c_contiguous or not array.flags.owndata:
            return None
        return array.reshape(-1).view(np.uint8), array.nbytes

    def _free_block(self, block: Any) -> None:
        self._writes.pop(id(block), None)
        if type(block) is Deferred:
            block.freed = True  # a flush need not store it

    def read(self, block: Any, view: ViewSpec) -> Any:
        if type(block) is Deferred:
            if block.array is None:
                return PendingView(block, view)
            block = block.array
        return adaptive.read_block(block, view)

    def write(self, block: Any, view: ViewSpec, array: Any) -> None:
        self._writes[id(block)] = self._writes.get(id(block), 0) + 1
        if adaptive.store(block, view, array):
            return
        array = adaptive.for_host_read(array)
        target = adaptive.read_block(adaptive.block_array(block, write=True), view)
        if np.shares_memory(target, array):
            array = np.array(array, copy=True)  # source and destination overlap
        target[...] = array

    def synchronize(self) -> None:
        adaptive.flush("synchronize")
        LEDGER.launches.wait()

    def to_host(self, array: Any) -> torch.Tensor:
        host = nx.to_torch(adaptive.for_host_read(array))
        LEDGER.launches.wait()
        return host

    def from_host(self, tensor: torch.Tensor) -> np.ndarray:
        return nx.from_torch(tensor)

    def adopt_host(self, tensor: torch.Tensor) -> np.ndarray:
        return nx.view_torch(tensor)  # written into a block (a copy) before the tensor is reused

    def array_meta(self, array: Any) -> tuple[tuple[int, ...], torch.dtype]:
        if type(array) is PendingView:
            return array.shape, array.view.dtype
        array = np.asarray(array)
        return tuple(array.shape), nx.torch_dtype(array.dtype)

    def cast(self, array: np.ndarray, dtype: torch.dtype) -> np.ndarray:
        from accelkit_backends.neuron.conversion import convert

        return convert(adaptive.for_host_read(array), dtype)

    def read_bytes(self, block: Any, nbytes: int) -> torch.Tensor:
        host = torch.from_numpy(adaptive.block_array(block, write=False)[:nbytes].copy())
        LEDGER.launches.wait()
        return host

    def write_bytes(self, block: Any, data: torch.Tensor) -> None:
        self._writes[id(block)] = self._writes.get(id(block), 0) + 1
        adaptive.block_array(block, write=True)[: data.numel()] = data.numpy()
