"""Which HBM accesses of a compiled program stay on chip.

A NEFF holds a whole graph, so the compiler keeps data in SBUF across the graph's ops when it
fits, instead of storing it to HBM and loading it back. The simulator runs every kernel against
HBM (the numerics are the same either way); this pass decides, before a program is timed, which
of its DMAs the estimate treats as on-chip. None moves HBM bytes: a store of data that stays is
no transfer (the producer writes where the data stays). A load of it is read **in place** when an
earlier access of the program moved the very same block (the same bytes, shape and strides: the
same elements on the same partitions), as a compiler has the consumer read the producer's buffer;
any other load of it (another block, another layout) is an SBUF-to-SBUF copy at the DMA queues'
rate. Two kinds of data stay:

- **Intermediates.** An allocation (an HBM array owning its memory, with every view of it) that
  is neither an input nor a result of the program (the boundary its caller names), that the
  program writes before it reads and never touches by an indirect DMA: all its accesses.
- **Reloads.** A read of an input or result whose bytes an earlier access of the program
  already brought on chip (a weight the forward and the backward both read, a result read back):
  the first access still goes to HBM, and every write of a result does.

Either stays only if it fits: at every kernel from its allocation's first access to its last
on-chip one, the allocations held there, each spread over all partitions, and the kernel's own
peak of SBUF tiles fit SBUF. Intermediates are taken first, then reloads, each in the order of
first access. A program whose caller names no boundary keeps everything in HBM.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np
from numpy.lib.array_utils import byte_bounds

from accelkit_backends.neuron.device import CoreSpec


@dataclass(slots=True)
class Touch:
    """One DMA's access to HBM inside a program: the ``kernel``-th kernel's read or write of
    ``array`` (through an indirect DMA: a gather or scatter by index). ``on_chip`` is this
    pass's verdict, read when the DMA is timed."""

    kernel: int
    array: np.ndarray
    write: bool
    indirect: bool = False
    on_chip: bool = False
    #: An on-chip read of a block an earlier access of the program moved as it is.
    in_place: bool = False


def _owner(array: np.ndarray) -> np.ndarray:
    """The end of ``array``'s chain of numpy bases (the array owning its memory, unless that
    memory came from elsewhere, as a torch view's does)."""
    while True:
        base = array.base
        if type(base).__name__ == "DummyArray":  # numpy's as_strided keeps its source here
            base = base.base
        if not isinstance(base, np.ndarray):
            return array
        array = base


class Allocations:
    """The HBM allocations a program's accesses fall in, as byte ranges ``(low, high)``.

    An array whose chain of bases ends at an array owning its memory belongs to that array's
    allocation; one whose memory numpy cannot trace (a view made by torch) to the known
    allocation holding its bytes (a boundary array untraced itself counts as one), else to a
    range of its own."""

    def __init__(self, arrays: list[np.ndarray], boundary: list[np.ndarray]):
        known = {byte_bounds(owning) for owning in map(_owner, arrays) if owning.flags.owndata}
        for array in boundary:
            owning = _owner(array)
            known.add(byte_bounds(owning if owning.flags.owndata else array))
        self._ranges = sorted(known)
        self._lows = [low for low, _ in self._ranges]

    def of(self, array: np.ndarray) -> tuple[int, int]:
        owning = _owner(array)
        if owning.flags.owndata:
            return byte_bounds(owning)
        low, high = byte_bounds(array)
        at = bisect.bisect_right(self._lows, low) - 1
        while at >= 0:
            start, end = self._ranges[at]
            if start <= low and high <= end:
                return start, end
            at -= 1
        return low, high


def keep_on_chip(touches: list[Touch], boundary: list[np.ndarray], sbuf_peaks: list[int],
                 spec: CoreSpec) -> None:
    """Mark the ``touches`` that stay on chip (see the module docstring).

    ``sbuf_peaks[i]``: bytes per partition the ``i``-th kernel's own tiles need at most.
    """
    allocations = Allocations([t.array for t in touches], boundary)
    outside = {allocations.of(a) for a in boundary}
    by_allocation: dict[tuple[int, int], list[Touch]] = {}
    for touch in touches:
        by_allocation.setdefault(allocations.of(touch.array), []).append(touch)
    held = [0] * len(sbuf_peaks)

    def hold(key: tuple[int, int], first: int, last: int) -> bool:
        size = -(-(key[1] - key[0]) // spec.partitions)
        span = range(first, last + 1)
        if any(held[k] + size + sbuf_peaks[k] > spec.sbuf_partition_bytes for k in span):
            return False
        for k in span:
            held[k] += size
        return True

    reloads = []
    for key, accesses in by_allocation.items():  # in the order of first access
        if any(t.indirect for t in accesses):
            continue
        if key not in outside and accesses[0].write:
            if hold(key, accesses[0].kernel, accesses[-1].kernel):
                for touch in accesses:
                    touch.on_chip = True
        else:
            reloads.append((key, accesses))
    for key, accesses in reloads:
        again = _reloads(accesses)
        if again and hold(key, accesses[0].kernel, again[-1].kernel):
            for touch in again:
                touch.on_chip = True
    for accesses in by_allocation.values():
        _mark_in_place(accesses)


def _mark_in_place(accesses: list[Touch]) -> None:
    """Mark the on-chip reads among one allocation's ``accesses`` (in order) of a block an
    earlier access moved with the same bytes, shape and strides: its tile holds them as the
    read wants them. An earlier access that did not stay (a first read from HBM) counts: the
    bytes it brought are what a reload finds on chip."""
    moved: set[tuple] = set()
    for touch in accesses:
        array = touch.array
        view = (*byte_bounds(array), array.shape, array.strides, array.dtype.str)
        if touch.on_chip and not touch.write and view in moved:
            touch.in_place = True
        moved.add(view)


def _reloads(accesses: list[Touch]) -> list[Touch]:
    """The reads among ``accesses`` of bytes an earlier access covered: one of the same view,
    or dense ones (a strided view's bounds hold bytes it did not touch)."""
    seen: set[tuple] = set()
    covered = _Ranges()
    again = []
    for touch in accesses:
        array = touch.array
        low, high = byte_bounds(array)
        view = (low, high, array.shape, array.strides)
        if not touch.write and (view in seen or covered.holds(low, high)):
            again.append(touch)
        seen.add(view)
        if high - low == array.size * array.itemsize:
            covered.add(low, high)
    return again


class _Ranges:
    """A set of byte ranges, kept as sorted disjoint ``[low, high)`` intervals."""

    def __init__(self) -> None:
        self._lows: list[int] = []
        self._highs: list[int] = []

    def holds(self, low: int, high: int) -> bool:
        at = bisect.bisect_right(self._lows, low) - 1
        return at >= 0 and high <= self._highs[at]

    def add(self, low: int, high: int) -> None:
        first = bisect.bisect_left(self._highs, low)  # the first interval that touches or follows
        last = bisect.bisect_right(self._lows, high)  # past the last one that touches
        if first < last:
            low, high = min(low, self._lows[first]), max(high, self._highs[last - 1])
        self._lows[first:last] = [low]
        self._highs[first:last] = [high]
