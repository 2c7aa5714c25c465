"""The tpu backend's statistics where backend-neutral readers look for them."""

from __future__ import annotations

import torch

import accelkit
from accelkit import _runtime
from accelkit._runtime.device import tensors as T
from accelkit_conformance.recording import _sample


def _compiles() -> int:
    value = accelkit.stats()["compiles"]
    assert isinstance(value, int) and not isinstance(value, bool)
    return value


def test_compiles_is_the_running_total_of_programs_and_counts_new_shapes_only(dev):
    tpu = accelkit.stats()["tpu"]
    assert _compiles() == tpu["compiled_programs_total"] + tpu["data_movement_programs"]
    x, y = torch.randn(3, 37).to(dev), torch.randn(5, 37).to(dev)  # host copies compile nothing
    x + x
    before = _compiles()
    x + x
    assert _compiles() == before, "a repeated shape must not compile"
    y + y
    assert _compiles() == before + 1
    accelkit.reset_stats()
    assert _compiles() == before + 1, "compile caches are not statistics: reset keeps the total"


def test_the_conformance_recorder_reads_tpu_compiles(dev):
    z = torch.randn(41, 2).to(dev)
    _, before = _sample()
    z * z
    _, after = _sample()
    assert isinstance(before, int) and after == before + 1


def test_zero_filling_storage_never_written_is_one_counted_program_per_size_and_no_scatter(dev):
    moves = lambda: accelkit.stats()["tpu"]["data_movement_programs"]  # noqa: E731
    before = moves()
    # fill_ reads self, so its never-written storage is zero-filled first; writing the result
    # replaces the whole storage (no scatter: blocks are the size asked for, 20014 bytes here).
    # A size and dtype no other test uses: programs are compiled once per process.
    first = torch.empty(10007, dtype=torch.int16, device=dev).fill_(2)
    assert moves() == before + 1
    second = torch.empty(10007, dtype=torch.int16, device=dev).fill_(3)
    assert moves() == before + 1, "the same size and dtype reuse the program"
    assert first.cpu().unique().tolist() == [2] and second.cpu().unique().tolist() == [3]


def test_small_storage_never_written_shares_one_zero_array_and_writes_keep_it_zero(dev):
    ctx = _runtime.active()
    first, second = torch.empty(3, 5, device=dev), torch.empty(15, device=dev)
    assert T.read(ctx, first).array is T.read(ctx, second).array  # one zero-fill for both
    first[1].fill_(7)
    second.add_(1)
    assert first.cpu().sum().item() == 35 and second.cpu().tolist() == [1.0] * 15
    assert torch.empty(15, device=dev).cpu().count_nonzero() == 0
    large = torch.empty(1 << 15, device=dev)  # 128 KiB: made for its block alone
    assert T.read(ctx, large).array is not T.read(ctx, torch.empty(1 << 15, device=dev)).array


def test_a_host_copy_of_any_size_replaces_its_storage_without_a_program(dev):
    moves = lambda: accelkit.stats()["tpu"]["data_movement_programs"]  # noqa: E731
    host = torch.randn(7, 59)  # 1652 bytes: not a whole 512-byte class
    before = moves()
    on_device = host.to(dev)
    assert moves() == before, "a whole-tensor write must replace the array, not scatter into it"
    assert torch.equal(on_device.cpu(), host)


def test_a_host_copy_in_another_dimension_order_is_one_reordering_without_zero_fill_or_scatter(dev):
    from accelkit_backends.tpu import buffers

    moves = lambda: accelkit.stats()["tpu"]["data_movement_programs"]  # noqa: E731
    # Shapes no other test uses: programs are compiled once per process.
    for host in (torch.randn(23, 61).t(), torch.randn(2, 5, 7, 9).to(memory_format=torch.channels_last)):
        before, scatters = moves(), buffers._scatter.compiled
        on_device = host.to(dev)
        assert on_device.stride() == host.stride()
        assert moves() == before + 1 and buffers._scatter.compiled == scatters
        assert torch.equal(on_device.cpu(), host)
