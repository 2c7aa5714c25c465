"""What ``torch.compile`` did on the active backend: ``accelkit.stats()["compile"]``."""

from __future__ import annotations

import sys
import threading
from collections import Counter
from typing import Any


class CompileStats:
    """Counters the graph compiler updates; :meth:`snapshot` adds what Dynamo itself counted
    (graph breaks, recompiles and their reasons)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.programs = 0
            self.graphs_captured = 0
            self.aot_graphs: Counter[str] = Counter()
            self.segments = 0
            self.eager_nodes: Counter[str] = Counter()
            self.calls = 0
            self.program_cache_hits = 0
            self.compile_seconds = 0.0
        self._dynamo_baseline = _dynamo_counts()

    def add(self, **amounts: Any) -> None:
        with self._lock:
            for name, amount in amounts.items():
                setattr(self, name, getattr(self, name) + amount)

    def hit(self) -> None:
        """One program call that found its executable (``add(program_cache_hits=1, calls=1)``)."""
        with self._lock:
            self.calls += 1
            self.program_cache_hits += 1

    def graph(self, kind: str, segments: int, eager_ops: list[str]) -> None:
        with self._lock:
            self.aot_graphs[kind] += 1
            self.segments += segments
            self.eager_nodes.update(eager_ops)

    def snapshot(self, persistent: dict[str, Any] | None) -> dict[str, Any]:
        breaks, reasons, recompiles = _dynamo_counts()
        base_breaks, base_reasons, base_recompiles = self._dynamo_baseline
        with self._lock:
            return {
                "graphs_captured": self.graphs_captured,
                "aot_graphs": dict(self.aot_graphs),
                "programs_compiled": self.programs,
                "program_segments": self.segments,
                "program_calls": self.calls,
                "program_cache_hits": self.program_cache_hits,
                "compile_seconds": round(self.compile_seconds, 6),
                "eager_nodes": dict(self.eager_nodes),
                "graph_breaks": breaks - base_breaks,
                "graph_break_reasons": dict(reasons - base_reasons),
                "recompiles": recompiles[len(base_recompiles):],
                "persistent_cache": persistent,
            }


def _dynamo_counts() -> tuple[int, Counter[str], list[dict[str, str]]]:
    """Graph breaks (total and by reason) and recompiles (function and reason) Dynamo has
    recorded in this process; nothing when Dynamo was never imported."""
    if "torch._dynamo" not in sys.modules:
        return 0, Counter(), []
    from torch._dynamo.utils import counters, guard_failures

    reasons: Counter[str] = Counter()
    for reason, count in counters["graph_break"].items():
        reasons[str(reason).strip().split("\n")[0]] += count  # the headline, not the hints
    recompiles = [
        {"function": f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})", "reason": str(reason)}
        for code, failures in list(guard_failures.items())
        for reason in failures
    ]
    return sum(reasons.values()), reasons, recompiles


STATS = CompileStats()
