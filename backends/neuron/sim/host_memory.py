"""Giving the host memory the simulator freed back to the operating system.

The simulator computes with numpy arrays: tiles, operands densified for a kernel, the
temporaries of each instruction. Once glibc's malloc has seen a large array freed, it serves
arrays up to 32 MiB from its heap rather than from their own mappings, and a heap that small,
long-lived objects fragment is not shrunk when the arrays are freed. One 8000-element sort
allocates several GB over its program; without a reclaim the process stays at that size after
it, and the next large program grows it further (conformance workers were OOM-killed at 12-14
GB this way).

:class:`HostMemoryReclaim` watches the resident size between top-level kernels and programs
(at the start of each, when what the last one's caller held is freed, and at its end), at most every ``interval`` seconds, and calls ``malloc_trim(0)`` — which returns free
pages anywhere in the heap, not only at its top — when the process grew by ``growth`` bytes
since the last reclaim. Its cost when nothing is due is one clock read; a reclaim of a few GB
takes 25-100 ms, after programs that took seconds. Without glibc or ``/proc`` it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time
from collections.abc import Callable

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _find_malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS, Windows)
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def resident_bytes() -> int | None:
    """This process's resident set size in bytes, or None where ``/proc`` does not say."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return None


class HostMemoryReclaim:
    """Returns freed host memory to the OS after the programs that grew the process.

    :meth:`between_runs` is called when a top-level kernel or program starts and ends. ``reclaims`` counts the
    ``malloc_trim`` calls made and ``reclaimed_bytes`` the resident bytes they gave back.
    """

    def __init__(self, interval: float = 0.25, growth: int = 512 << 20,
                 trim: Callable[[int], int] | None = None, resident: Callable[[], int | None] = resident_bytes,
                 clock: Callable[[], float] = time.perf_counter):
        self.interval = interval
        self.growth = growth
        self._trim = trim if trim is not None else _find_malloc_trim()
        self._resident = resident
        self._clock = clock
        self._checked_at = clock()
        self._baseline = resident() or 0
        self.reclaims = 0
        self.reclaimed_bytes = 0

    def between_runs(self) -> None:
        """Reclaim if ``interval`` passed since the last look and the process grew by ``growth``."""
        now = self._clock()
        if self._trim is None or now - self._checked_at < self.interval:
            return
        self._checked_at = now
        before = self._resident()
        if before is None or before - self._baseline < self.growth:
            return
        self._trim(0)
        after = self._resident() or before
        self.reclaims += 1
        self.reclaimed_bytes += max(0, before - after)
        self._baseline = after
        self._checked_at = self._clock()  # the trim's own time does not count towards the next look
