"""ref's device memory: each block is a host ``uint8`` tensor; arrays are CPU tensors."""

from __future__ import annotations

from typing import Any

import torch

from accelkit.sdk import DeviceAllocator, DeviceModel, ViewSpec, hookimpl


class RefAllocator(DeviceAllocator):
    """Blocks are CPU ``uint8`` tensors; a view is read without a copy by ``as_strided``."""

    def _alloc_block(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def _typed(self, block: torch.Tensor, view: ViewSpec) -> torch.Tensor:
        # Adopted blocks have their exact byte size, which a wider dtype may not divide; the
        # trimmed tail is shorter than one element, so no view can reach it.
        tail = block.numel() % view.dtype.itemsize
        if tail:
            block = block[:-tail]
        return block.view(view.dtype).as_strided(view.size, view.stride, view.offset)

    def _block_from_array(self, array: torch.Tensor) -> tuple[torch.Tensor, int] | None:
        # Only a kernel's fresh, dense result owns its memory outright; views are copied.
        nbytes = array.numel() * array.element_size()
        if array._is_view() or not array.is_contiguous() or array.untyped_storage().nbytes() != nbytes:
            return None
        return array.view(-1).view(torch.uint8), nbytes

    def read(self, block: torch.Tensor, view: ViewSpec) -> torch.Tensor:
        return self._typed(block, view)

    def write(self, block: torch.Tensor, view: ViewSpec, array: torch.Tensor) -> None:
        target = self._typed(block, view)
        if array.untyped_storage()._cdata == block.untyped_storage()._cdata:
            array = array.clone()  # source and destination may overlap
        target.copy_(array)

    def to_host(self, array: torch.Tensor) -> torch.Tensor:
        return array.clone()

    def from_host(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.clone()  # the array must not share the caller's memory (a kernel may return it)

    def array_meta(self, array: torch.Tensor) -> tuple[tuple[int, ...], torch.dtype]:
        return tuple(array.shape), array.dtype

    def cast(self, array: torch.Tensor, dtype: torch.dtype) -> Any:
        return array.to(dtype)

    def read_bytes(self, block: torch.Tensor, nbytes: int) -> torch.Tensor:
        return block[:nbytes].clone()

    def write_bytes(self, block: torch.Tensor, data: torch.Tensor) -> None:
        block[: data.numel()].copy_(data)


@hookimpl
def accelkit_make_allocator(device_model: DeviceModel, index: int) -> RefAllocator:
    return RefAllocator(f"ref:{index}", device_model.memory_bytes)
