"""What a test measures while it runs: dispatch paths, fallbacks, compilations, dynamic shapes,
comparisons settled by the float32 reference.

A test gets a :class:`Recorder` through the ``recorder`` fixture. Wrapping the work under test
in :meth:`Recorder.measure` limits the counts to it (so preparing inputs and computing the CPU
reference do not count); a test that never calls it is measured as a whole.

The run's CPU-fallback policy (``--fallback deny``) applies to the work under test: a test
that uses the fixture runs its harness (sample inputs made on the device, copies) with the
fallback allowed and the blocks inside :meth:`Recorder.measure` under the run's policy.

Compilations are read from ``accelkit.stats()["compiles"]``: a backend that compiles kernels
or programs reports its running total there (an int, through its ``accelkit_stats`` hook).
Without it, eager compile counts are None. ``torch.compile`` cases count compiled graphs
themselves and report them with :meth:`Recorder.add_compiles`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import accelkit
from accelkit_conformance.schema import PATH_KINDS


def _sample() -> tuple[dict[str, dict[str, int]], int | None]:
    stats = accelkit.stats()
    compiles = stats.get("compiles")
    return stats["ops"], compiles if isinstance(compiles, int) and not isinstance(compiles, bool) else None


class Recorder:
    """Accumulates one test's measurements; :meth:`as_record` gives the record fields."""

    def __init__(self, policy: str | None = None) -> None:
        self.policy = policy  # the run's fallback policy, applied inside measure()
        self.paths = dict.fromkeys(PATH_KINDS, 0)
        self.fallback_ops: set[str] = set()
        self.compiles: int | None = None
        self.dynamic: dict[str, Any] | None = None
        self.float_reference = 0
        self.measured = False

    @contextlib.contextmanager
    def measure(self) -> Iterator[None]:
        """Count the device work done inside the block (may be entered several times)."""
        ops_before, compiles_before = _sample()
        try:
            if self.policy is None:
                yield
            else:
                with accelkit.fallback_policy(self.policy):
                    yield
        finally:
            ops_after, compiles_after = _sample()
            self.measured = True
            for op, counts in ops_after.items():
                before = ops_before.get(op, {})
                for kind in PATH_KINDS:
                    delta = counts.get(kind, 0) - before.get(kind, 0)
                    if delta > 0:
                        self.paths[kind] += delta
                        if kind == "fallback":
                            self.fallback_ops.add(op)
            if compiles_before is not None and compiles_after is not None:
                self.add_compiles(compiles_after - compiles_before)

    def add_compiles(self, n: int) -> None:
        """Add ``n`` compilations caused by the test."""
        self.compiles = (self.compiles or 0) + max(0, int(n))

    def settled_by_float_reference(self) -> None:
        """Note a comparison that missed CPU's kernel and matched the float32 reference
        (:mod:`accelkit_conformance.float_reference`): a pass, but one the report shows."""
        self.float_reference += 1

    def set_dynamic(self, shapes: list[list[int]], recompiles: list[int] | None, correct: bool,
                    programs: list[int] | None = None) -> None:
        """Record a dynamic-shape case: shapes in order, new compilations at each change, and
        (compiled modes) the programs the backend built at each change."""
        self.dynamic = {
            "shapes": [list(map(int, s)) for s in shapes], "recompiles": recompiles, "correct": bool(correct),
            "programs": programs,
        }

    def as_record(self) -> dict[str, Any]:
        return {
            "paths": dict(self.paths) if self.measured else None,
            "fallback_ops": sorted(self.fallback_ops),
            "compiles": self.compiles,
            "dynamic": self.dynamic,
            "float_reference": self.float_reference,
        }
