"""The simulator gives the host memory its programs freed back to the OS (``sim.host_memory``)."""

from __future__ import annotations

import sys

import pytest

from accelkit_backends.neuron.sim import NeuronCore
from accelkit_backends.neuron.device import core_spec
from accelkit_backends.neuron.sim.host_memory import HostMemoryReclaim, resident_bytes


class _Process:
    """A fake process: a resident size, a clock, and a malloc_trim that gives back ``freed``."""

    def __init__(self):
        self.now, self.resident, self.freed, self.trims = 0.0, 1000, 0, 0

    def trim(self, pad: int) -> int:
        assert pad == 0
        self.trims += 1
        self.resident -= self.freed
        self.freed = 0
        return 1

    def reclaim(self) -> HostMemoryReclaim:
        return HostMemoryReclaim(interval=1.0, growth=500, trim=self.trim, resident=lambda: self.resident,
                                 clock=lambda: self.now)


def test_a_process_that_grew_by_the_threshold_is_trimmed_and_the_bytes_counted():
    process = _Process()
    reclaim = process.reclaim()
    process.now, process.resident, process.freed = 2.0, 1600, 550
    reclaim.between_runs()
    assert (process.trims, reclaim.reclaims, reclaim.reclaimed_bytes) == (1, 1, 550)
    assert process.resident == 1050


def test_no_trim_below_the_growth_threshold_or_within_the_interval():
    process = _Process()
    reclaim = process.reclaim()
    process.now, process.resident = 2.0, 1400  # grew 400 < 500
    reclaim.between_runs()
    process.resident = 2000  # grew enough, but the last look was 0 s ago
    reclaim.between_runs()
    assert process.trims == 0
    process.now = 3.5
    reclaim.between_runs()
    assert process.trims == 1


def test_growth_is_counted_from_the_size_after_the_last_trim():
    process = _Process()
    reclaim = process.reclaim()
    process.now, process.resident = 2.0, 1600  # live data: the trim gives nothing back
    reclaim.between_runs()
    assert (process.trims, reclaim.reclaimed_bytes) == (1, 0)
    process.now, process.resident = 4.0, 2000  # 400 more than after that trim
    reclaim.between_runs()
    assert process.trims == 1


def test_without_malloc_trim_nothing_is_done():
    reclaim = HostMemoryReclaim(interval=0.0, growth=0, resident=lambda: 1 << 40)
    reclaim._trim = None  # as on a C library without malloc_trim (musl, macOS)
    reclaim.between_runs()
    assert reclaim.reclaims == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc are Linux's")
def test_on_linux_the_resident_size_is_read_and_glibc_trims():
    resident = resident_bytes()
    assert resident is not None and 10 << 20 < resident < 1 << 40
    reclaim = HostMemoryReclaim(interval=0.0, growth=0)
    reclaim.between_runs()  # a real malloc_trim(0): the process is at least as small after
    assert reclaim.reclaims == 1 and reclaim.reclaimed_bytes >= 0


def test_the_core_looks_between_top_level_kernels_not_inside_programs():
    core = NeuronCore(core_spec("trn2"))
    looks = []
    core.host_memory = type("Spy", (), {"between_runs": lambda self: looks.append(core._program is None)})()
    with core.kernel("alone"):
        pass
    assert looks == [True, True]  # at its start and its end
    looks.clear()
    with core.program(label="p"):
        with core.kernel("inside"):
            pass
        with core.kernel("inside too"):
            pass
    assert looks == [True, True]  # the program's start and end only
