"""Per-op execution counters: how much of a program ran natively, decomposed or on the CPU."""

from __future__ import annotations

import contextlib
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator

KINDS = ("native", "decomposed", "fallback")


class OpCounters:
    """Counts executions per aten overload and path (``native | decomposed | fallback``).

    Writes happen on autograd worker threads too, so updates take a lock; reads return copies.
    Some counts are kept elsewhere until a read (:meth:`add_source`): the native lane's fronts
    count their calls in C++.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(KINDS, 0))
        self._paused = threading.local()
        self._pausing = 0  # threads inside paused(): the thread-local is read only when some are
        self._sources: list[tuple[str, str, Callable[[], int]]] = []

    def add_source(self, op: str, kind: str, take: Callable[[], int]) -> None:
        """Executions of ``op`` by path ``kind`` are also counted by ``take()``, which returns
        those since it was last called; it is called at every read and reset. The source counts
        only while no thread is inside :meth:`paused` (it counts through :meth:`count` then)."""
        with self._lock:
            self._sources.append((op, kind, take))

    def _collect(self) -> None:
        """Add what the sources counted since the last read (lock held)."""
        for op, kind, take in self._sources:
            calls = take()
            if calls:
                self._counts[op][kind] += calls

    def count(self, op: str, kind: str) -> None:
        if self._pausing and getattr(self._paused, "depth", 0):
            return
        with self._lock:
            self._counts[op][kind] += 1

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self._lock:
            self._collect()
            return {op: dict(c) for op, c in sorted(self._counts.items())}

    def totals(self) -> dict[str, int]:
        with self._lock:
            self._collect()
            return {k: sum(c[k] for c in self._counts.values()) for k in KINDS}

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Count nothing on the current thread inside the block (e.g. while formatting)."""
        with self._lock:
            self._pausing += 1
        self._paused.depth = getattr(self._paused, "depth", 0) + 1
        try:
            yield
        finally:
            self._paused.depth -= 1
            with self._lock:
                self._pausing -= 1

    def reset(self) -> None:
        with self._lock:
            self._collect()  # what the sources counted so far goes too
            self._counts.clear()
