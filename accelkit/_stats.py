"""Per-op execution counters: how much of a program ran natively, decomposed or on the CPU."""

from __future__ import annotations

import threading
from collections import defaultdict

KINDS = ("native", "decomposed", "fallback")


class OpCounters:
    """Counts executions per aten overload and path (``native | decomposed | fallback``).

    Writes happen on autograd worker threads too, so updates take a lock; reads return copies.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(KINDS, 0))

    def count(self, op: str, kind: str) -> None:
        with self._lock:
            self._counts[op][kind] += 1

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {op: dict(c) for op, c in sorted(self._counts.items())}

    def totals(self) -> dict[str, int]:
        with self._lock:
            return {k: sum(c[k] for c in self._counts.values()) for k in KINDS}

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()
