"""tpu lends a storage's memory to collectives only when no one else can see the writes.

``lend_host`` is what lets gloo reduce a tpu tensor in place (no staging copy in or out). A
wrong lend is a silent wrong number somewhere else, so each way another holder can exist is
checked: another tensor's storage, a pending computation, a host view, part of a storage.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from accelkit import _runtime
from accelkit._runtime.device import tensors as T
from accelkit.sdk import ViewSpec
from accelkit_backends.tpu.buffers import Holder


def _allocator():
    return _runtime.active().allocator


def _lend(tensor: torch.Tensor) -> torch.Tensor | None:
    return _allocator().lend_host(T.buffer_of(tensor).block, ViewSpec.of(tensor))


def test_a_whole_storage_held_by_its_tensor_alone_is_lent_and_writes_become_its_values(dev):
    x = torch.arange(12.0).reshape(3, 4).to(dev) * 2
    lent = _lend(x)
    assert lent is not None and lent.device.type == "cpu" and lent.shape == (3, 4) and lent.dtype == torch.float32
    assert torch.equal(lent, torch.arange(12.0).reshape(3, 4) * 2)
    lent.add_(1)
    del lent
    assert torch.equal(x.cpu(), torch.arange(12.0).reshape(3, 4) * 2 + 1)
    assert torch.equal((x + 0).cpu(), x.cpu()), "kernels must read the rewritten memory"


def test_bfloat16_is_lent_too(dev):
    x = torch.tensor([1.5, -2.0, 3.25], dtype=torch.bfloat16).to(dev) + 0
    lent = _lend(x)
    assert lent is not None and lent.dtype == torch.bfloat16
    lent.mul_(2)
    del lent
    assert torch.equal(x.cpu(), torch.tensor([3.0, -4.0, 6.5], dtype=torch.bfloat16))


def test_part_of_a_storage_is_not_lent(dev):
    base = torch.arange(8.0).to(dev) + 0
    assert _lend(base[2:]) is None
    assert _lend(base[::2]) is None


def test_an_array_another_storage_shares_is_not_lent_and_the_sharer_keeps_its_values(dev):
    # Storage never written reads as zeros that small tensors share (one array for all).
    a, b = torch.empty(16, device=dev), torch.empty(16, device=dev)
    a.sum(), b.sum()
    assert T.buffer_of(a).block.array is T.buffer_of(b).block.array
    assert _lend(a) is None
    assert torch.equal(b.cpu(), torch.zeros(16))
    # The same holds for any second holder of the array.
    x = torch.arange(4.0).to(dev) + 1
    other = Holder(16, T.buffer_of(x).block.array)
    assert _lend(x) is None
    assert np.array_equal(np.asarray(other.array), [1.0, 2.0, 3.0, 4.0])


def test_a_computation_dispatched_before_the_lend_reads_the_values_before_it(dev):
    n = 1 << 20
    x = torch.ones(n).to(dev) + 0
    want = float(n * 3)
    pending = (x * 3).sum()  # may still be running when the memory is lent
    lent = _lend(x)
    assert lent is not None
    lent.zero_()
    del lent
    assert pending.item() == want
    assert x.sum().item() == 0


def test_memory_a_host_view_still_shows_is_never_rewritten(dev):
    x = torch.arange(6.0).to(dev) + 0
    view = np.asarray(T.buffer_of(x).block.array)  # a host view of the array's memory
    lent = _lend(x)
    if lent is not None:  # XLA copies instead of donating memory a host view shows
        lent.fill_(-1)
        del lent
        assert torch.equal(x.cpu(), torch.full((6,), -1.0))
    assert np.array_equal(view, np.arange(6.0, dtype=np.float32))


def test_lending_survives_the_frame_hook_a_failed_torch_compile_leaves_installed(dev):
    # When Dynamo fails to compile, torch 2.13 can leave its PEP 523 frame hook installed; CPython
    # 3.11 then adds a reference to every Python call's arguments. Lending must not depend on that.
    def refuse(graph, example_inputs):
        raise RuntimeError("this backend refuses every graph")

    with pytest.raises(Exception, match="refuses every graph"):
        torch.compile(lambda t: t + 1, backend=refuse)(torch.ones(3))
    x = torch.arange(4.0).to(dev) + 1
    lent = _lend(x)
    assert lent is not None
    lent.neg_()
    del lent
    assert torch.equal(x.cpu(), -(torch.arange(4.0) + 1))
