"""What training loops read from the device module: memory statistics under CUDA's keys, and the
device's name and peak FLOP/s.

TorchTitan's memory monitor calls ``reset_peak_memory_stats()`` and then reads
``memory_stats()["active_bytes.all.peak"]``, ``["reserved_bytes.all.peak"]``,
``["num_alloc_retries"]`` and ``["num_ooms"]``, taking a missing key as -1 (so it logged
``memory: -0.00GiB(-0.00%)``); ``torch.accelerator.memory_stats()`` has the same layout. Its MFU
divides by a peak FLOP/s looked up by ``get_device_name()`` and ``get_device_properties().name``.
The device under test must answer with its allocator's figures and its device model's.
"""

from __future__ import annotations

import pytest
import torch

import accelkit.sdk
from accelkit.sdk.testing import device_under_test

MODULE = torch.get_device_module(device_under_test().type)

#: torch.cuda.memory_stats()'s core statistics, each ``<name>.all.{current,peak,allocated,freed}``.
STATS = ("allocation", "segment", "active", "allocated_bytes", "reserved_bytes", "active_bytes",
         "requested_bytes")
METRICS = ("current", "peak", "allocated", "freed")
COUNTERS = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free")
MiB = 1 << 20


def test_memory_stats_have_cudas_keys(dev):
    stats = MODULE.memory_stats()
    for key in [f"{name}.all.{metric}" for name in STATS for metric in METRICS] + list(COUNTERS):
        assert type(stats.get(key)) is int and stats[key] >= 0, (key, stats.get(key))
    # accelkit's own flat keys stay (accelkit.stats(), the run report read them)
    for key in ("allocated_bytes.current", "allocated_bytes.peak", "requested_bytes.current",
                "reserved_bytes.current", "reserved_bytes.peak", "cached_bytes.current",
                "capacity_bytes", "num_allocations", "num_frees", "num_cache_hits"):
        assert type(stats.get(key)) is int, key


def test_memory_stats_agree_with_the_module_functions_and_with_themselves(dev, no_gc):
    kept = torch.ones(4096, device=dev)
    stats = MODULE.memory_stats()
    assert stats["allocated_bytes.all.current"] == MODULE.memory_allocated() >= kept.nbytes
    assert stats["allocated_bytes.all.peak"] == MODULE.max_memory_allocated()
    assert stats["reserved_bytes.all.current"] == MODULE.memory_reserved()
    assert stats["reserved_bytes.all.peak"] == MODULE.max_memory_reserved()
    assert stats["allocation.all.current"] >= 1
    for name in STATS:
        current, peak, up, down = (stats[f"{name}.all.{metric}"] for metric in METRICS)
        assert current == up - down and peak >= current, name
    for metric in METRICS:  # blocks are released when their tensor goes: active is allocated
        assert stats[f"active_bytes.all.{metric}"] == stats[f"allocated_bytes.all.{metric}"]
        assert stats[f"active.all.{metric}"] == stats[f"allocation.all.{metric}"]
    assert stats["reserved_bytes.all.current"] >= stats["allocated_bytes.all.current"]
    assert stats["allocated_bytes.all.current"] >= stats["requested_bytes.all.current"]
    assert stats["num_device_alloc"] == stats["segment.all.allocated"]
    assert stats["num_device_free"] == stats["segment.all.freed"]
    assert stats["num_allocations"] == stats["allocation.all.allocated"]
    assert stats["num_frees"] == stats["allocation.all.freed"]
    assert stats["allocated_bytes.current"] == stats["allocated_bytes.all.current"]
    assert stats["reserved_bytes.peak"] == stats["reserved_bytes.all.peak"]
    del kept


def test_an_allocation_raises_the_peaks_and_reset_peak_memory_stats_lowers_them(dev, no_gc):
    MODULE.reset_peak_memory_stats()
    before = MODULE.memory_stats()
    for name in STATS:
        assert before[f"{name}.all.peak"] == before[f"{name}.all.current"], name
    nbytes = 4 * MiB
    x = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    x.fill_(1)
    del x
    after = MODULE.memory_stats()
    for name in ("active_bytes", "allocated_bytes", "requested_bytes"):
        assert after[f"{name}.all.current"] == before[f"{name}.all.current"], name
        assert after[f"{name}.all.peak"] >= before[f"{name}.all.current"] + nbytes, name
        assert after[f"{name}.all.allocated"] - before[f"{name}.all.allocated"] >= nbytes, name
        assert after[f"{name}.all.freed"] - before[f"{name}.all.freed"] >= nbytes, name
    # reserved memory holds what is allocated, whether or not a cached block served the tensor
    assert after["reserved_bytes.all.peak"] >= before["allocated_bytes.all.current"] + nbytes
    assert after["allocation.all.peak"] >= before["allocation.all.current"] + 1
    assert after["active.all.peak"] >= before["active.all.current"] + 1

    MODULE.reset_peak_memory_stats()
    reset = MODULE.memory_stats()
    for name in STATS:
        assert reset[f"{name}.all.peak"] == reset[f"{name}.all.current"], name
    assert reset["active_bytes.all.peak"] <= after["active_bytes.all.peak"] - nbytes
    assert MODULE.max_memory_allocated() == MODULE.memory_allocated()


def test_torch_accelerator_memory_stats_are_the_device_modules(dev, no_gc):
    kept = torch.ones(1000, device=dev)
    ours = MODULE.memory_stats()
    theirs = torch.accelerator.memory_stats()
    for key in [f"{name}.all.{metric}" for name in STATS for metric in METRICS] + list(COUNTERS):
        assert theirs[key] == ours[key], key
    del kept


def test_properties_name_and_peak_flops_come_from_the_device_model(dev):
    model = accelkit.sdk.active_device_model()
    props = MODULE.get_device_properties()
    assert props == MODULE.get_device_properties(dev) == MODULE.get_device_properties(0)
    assert props.name == model.product and props.name
    assert (props.target, props.vendor, props.simulated) == (model.name, model.vendor, model.simulated)
    assert props.total_memory == model.memory_bytes
    assert props.memory_bandwidth == model.memory_bandwidth
    assert props.peak_flops == {str(d).removeprefix("torch."): f for d, f in model.peak_flops.items()}
    assert all(isinstance(f, float | int) and f > 0 for f in props.peak_flops.values())
    if props.peak_flops:
        assert props.sources.get("peak_flops"), "a peak FLOP/s figure without its source"


def test_device_name_is_the_hardware_name_with_the_backend_and_whether_simulated(dev):
    props = MODULE.get_device_properties()
    name = MODULE.get_device_name()
    assert name == MODULE.get_device_name(dev) == MODULE.get_device_name(0)
    assert name.startswith(props.name)
    assert dev.type in name.removeprefix(props.name)
    assert ("simulated" in name) == props.simulated


def test_a_device_that_does_not_exist_has_no_properties(dev):
    with pytest.raises(ValueError, match="does not exist"):
        MODULE.get_device_properties(MODULE.device_count())
