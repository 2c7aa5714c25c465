"""Memory as training scripts and libraries ask about it: pinned host tensors, and the device's
figures through ``torch.accelerator`` (what accelerate's ``free_memory`` calls between runs).

On CUDA, ``pin_memory()`` gives a page-locked copy that ``is_pinned()`` recognises, views of it
included, and ``DataLoader(pin_memory=True)`` (Hugging Face Trainer's default) pins every batch
before it moves to the device. The device under test must behave the same: the values are the
CPU tensor's, the dtype and shape too, and the original tensor stays unpinned.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_pin_memory_gives_a_pinned_copy_with_the_same_values(dev, dtype):
    host = (torch.arange(12).reshape(3, 4) % 5).to(dtype)
    pinned = host.pin_memory()
    assert pinned.is_pinned() and not host.is_pinned()
    assert pinned.dtype == host.dtype and pinned.shape == host.shape and torch.equal(pinned, host)
    assert pinned.data_ptr() != host.data_ptr()
    assert pinned[1:, 2].is_pinned()  # a view of pinned memory is pinned
    assert pinned.pin_memory().is_pinned()


def test_pinned_tensors_move_to_the_device_and_back(dev):
    host = torch.randn(5, 7)
    pinned = torch.empty(5, 7, pin_memory=True)
    assert pinned.is_pinned()
    pinned.copy_(host)
    on_device = pinned.to(dev, non_blocking=True)
    assert on_device.device.type == dev.type
    assert torch.equal(on_device.cpu(), host)
    back = torch.empty(5, 7, pin_memory=True)
    back.copy_(on_device * 2, non_blocking=True)
    torch.get_device_module(dev.type).synchronize()
    assert torch.equal(back, host * 2)


def test_the_host_allocator_empties_its_cache_and_keeps_pinned_tensors(dev):
    # vLLM's teardown calls torch.accelerator.empty_host_cache() after empty_cache(); once the
    # device's allocator has answered (memory_allocated), PyTorch then asks for the device's host
    # allocator, and with none registered it dereferences a null pointer (a segfault).
    pinned = torch.arange(6.0).pin_memory()
    on_device = torch.ones(4, device=dev)
    assert torch.accelerator.memory_allocated(dev) >= 16
    torch.accelerator.empty_cache()
    torch.accelerator.empty_host_cache()
    assert pinned.is_pinned() and pinned.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert on_device.sum().item() == 4.0
    assert torch.empty(3, pin_memory=True).is_pinned()


def test_a_data_loader_that_pins_memory_hands_out_pinned_batches(dev):
    features, labels = torch.randn(10, 3), torch.arange(10)
    loader = DataLoader(TensorDataset(features, labels), batch_size=4, pin_memory=True)
    seen = []
    for x, y in loader:
        assert x.is_pinned() and y.is_pinned()
        seen.append((x.to(dev, non_blocking=True).cpu(), y.to(dev, non_blocking=True).cpu()))
    assert torch.equal(torch.cat([x for x, _ in seen]), features)
    assert torch.equal(torch.cat([y for _, y in seen]), labels)


def test_torch_accelerator_reports_the_device_module_s_memory_figures(dev, no_gc):
    # no_gc: an earlier test's garbage collected between two reads would make them differ.
    module = torch.get_device_module(dev.type)
    assert torch.accelerator.current_accelerator().type == dev.type
    kept = torch.ones(4096, device=dev)
    assert torch.accelerator.memory_allocated() == module.memory_allocated() >= kept.nbytes
    assert torch.accelerator.max_memory_allocated() == module.max_memory_allocated()
    assert torch.accelerator.memory_reserved() == module.memory_reserved()
    assert torch.accelerator.get_memory_info() == module.mem_get_info()
    stats = torch.accelerator.memory_stats()
    assert stats["allocated_bytes.all.current"] == module.memory_allocated()
    assert stats["allocation.all.current"] >= 1
    del kept
    torch.accelerator.empty_cache()
    assert module.memory_reserved() == module.memory_allocated()  # nothing cached is left
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == module.memory_allocated()


def test_a_storage_of_bytes_made_directly_is_refused_with_the_way_to_make_one(dev):
    assert torch.UntypedStorage(0, device=dev).nbytes() == 0
    with pytest.raises(RuntimeError, match="make a tensor instead"):
        torch.UntypedStorage(8, device=dev)
    assert torch.empty(8, dtype=torch.uint8, device=dev).untyped_storage().nbytes() == 8
