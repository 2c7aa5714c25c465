"""Estimated time on the target TPU: XLA's cost analysis against the generation's roofline.

For every program executed, XLA reports the floating-point operations and the bytes it
accesses. On the target generation that program takes at least ``flops / peak`` (compute-bound)
and at least ``bytes / HBM bandwidth`` (memory-bound); the estimate is the larger of the two.
It is an **estimate** from public peak figures, not a measurement: real programs reach a
fraction of peak, and XLA on the CPU platform may fuse differently from XLA on a TPU.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from accelkit.sdk import DeviceModel, Estimate


@dataclass(frozen=True)
class ProgramCost:
    """XLA's cost analysis of one compiled program."""

    flops: float
    bytes_accessed: float
    low_precision: bool  # a bf16/fp16 input: the MXU's bf16 peak applies
    seconds: float | None = None  # the roofline estimate, once the ledger has a device model

    @classmethod
    def of(cls, lowered: Any, arrays: list) -> ProgramCost:
        """From a lowered program's HLO cost analysis (no second compilation)."""
        try:
            analysis = lowered.cost_analysis() or {}
            if isinstance(analysis, list):
                analysis = analysis[0] if analysis else {}
        except Exception:  # not every platform reports costs
            analysis = {}
        low = any(np.dtype(a.dtype).itemsize == 2 and np.dtype(a.dtype).kind == "f" or str(a.dtype) == "bfloat16"
                  for a in arrays)
        # XLA reports -1 for what it cannot count (a triangular solve's flops): unknown, not negative.
        cost = cls(max(0.0, float(analysis.get("flops", 0.0))), max(0.0, float(analysis.get("bytes accessed", 0.0))),
                   low)
        if COSTS.model is not None:
            cost = dataclasses.replace(cost, seconds=COSTS.seconds(cost))
        return cost


class Tally:
    """Executions of one compiled program (of one op) since the ledger was last reset."""

    __slots__ = ("op", "cost", "calls")

    def __init__(self, op: str, cost: ProgramCost):
        self.op = op
        self.cost = cost
        self.calls = 0


@dataclass
class CostLedger:
    """Per-op totals of executed programs and their estimated device time.

    Each compiled program gets a :class:`Tally` once (:meth:`tally`); running it only counts a
    call (:meth:`record`), and the totals are multiplied out when read (:meth:`summary`).
    """

    model: DeviceModel | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _tallies: list[Tally] = field(default_factory=list)

    def seconds(self, cost: ProgramCost) -> float:
        if self.model is None:
            return 0.0
        peak_dtype = torch.bfloat16 if cost.low_precision else torch.float32
        peak = self.model.peak_flops.get(peak_dtype) or max(self.model.peak_flops.values())
        compute = cost.flops / peak
        memory = cost.bytes_accessed / self.model.memory_bandwidth if self.model.memory_bandwidth else 0.0
        return max(compute, memory)

    def tally(self, op: str, cost: ProgramCost) -> Tally:
        """A new counter for one compiled program of ``op``, included in every summary."""
        tally = Tally(op, cost)
        with self._lock:
            self._tallies.append(tally)
        return tally

    def record(self, tally: Tally) -> None:
        """Count one execution of ``tally``'s program."""
        with self._lock:
            tally.calls += 1

    def reset(self) -> None:
        with self._lock:
            for tally in self._tallies:
                tally.calls = 0

    def summary(self) -> dict[str, Any]:
        with self._lock:
            ran = [(t.op, t.calls, t.cost) for t in self._tallies if t.calls]
        totals: dict[str, list[float]] = {}  # op -> [calls, flops, bytes, seconds]
        for op, calls, cost in ran:
            seconds = cost.seconds if cost.seconds is not None else self.seconds(cost)
            row = totals.setdefault(op, [0, 0.0, 0.0, 0.0])
            row[0] += calls
            row[1] += calls * cost.flops
            row[2] += calls * cost.bytes_accessed
            row[3] += calls * seconds
        ops = {op: {"calls": int(c), "flops": f, "bytes": b, "estimated_seconds": s}
               for op, (c, f, b, s) in sorted(totals.items())}
        return {
            "note": "estimate: XLA cost analysis (flops, bytes accessed) against the target's "
                    "published peak FLOP/s and HBM bandwidth; not a measurement",
            "target": self.model.name if self.model else None,
            "flops": sum(o["flops"] for o in ops.values()),
            "bytes": sum(o["bytes"] for o in ops.values()),
            "estimated_seconds": sum(o["estimated_seconds"] for o in ops.values()),
            "ops": ops,
        }

    def estimate(self) -> Estimate | None:
        """The summary as the contract's :class:`Estimate` (None before activation)."""
        if self.model is None:
            return None
        summary = self.summary()
        return Estimate(
            target=summary["target"], note=summary["note"], seconds=summary["estimated_seconds"],
            per_op={op: (row["calls"], row["estimated_seconds"]) for op, row in summary["ops"].items()},
            flops=summary["flops"], hbm_bytes=summary["bytes"],
        )


#: The process's ledger; its device model is set when the tpu backend is activated.
COSTS = CostLedger()
