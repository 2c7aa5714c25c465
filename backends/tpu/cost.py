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
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from accelkit.sdk import DeviceModel, Estimate, LaunchLedger, TargetComparison


#: Executions recorded between two settlings of the ledger at most (a bound on its backlog).
SETTLE_EVERY = 4096


@dataclass(frozen=True)
class ProgramCost:
    """XLA's cost analysis of one compiled program."""

    flops: float
    bytes_accessed: float
    low_precision: bool  # a bf16/fp16 input: the MXU's bf16 peak applies
    seconds: float | None = None  # the roofline estimate, once the ledger has a device model

    @classmethod
    def of(cls, compiled: Any, arrays: list, single_op: bool = False) -> ProgramCost:
        """From a compiled program's cost analysis, taken from its loaded executable.

        The executable's optimised HLO is analysed, so ``bytes_accessed`` counts memory
        traffic after XLA's fusion. (Analysing the lowered module instead converts it to HLO
        again: about 5 ms a program, twenty times this.)

        ``single_op``: the program is one op (eager), which a TPU runs reading its inputs and
        writing its results once, at their storage dtypes; its bytes are then at most those.
        XLA's CPU compiler counts more for a bf16 dot: it computes it in f32 and converts in a
        second pass (a 1024³ bf16 matmul: 14.7 MB where the operands and result are 6.3 MB).
        """
        try:
            analysis = compiled.cost_analysis() or {}
            if isinstance(analysis, list):
                analysis = analysis[0] if analysis else {}
        except Exception:  # not every platform reports costs
            analysis = {}
        low = any(np.dtype(a.dtype).itemsize == 2 and np.dtype(a.dtype).kind == "f" or str(a.dtype) == "bfloat16"
                  for a in arrays)
        # XLA reports -1 for what it cannot count (a triangular solve's flops): unknown, not negative.
        bytes_accessed = max(0.0, float(analysis.get("bytes accessed", 0.0)))
        if single_op:
            bytes_accessed = min(bytes_accessed, _storage_bytes(compiled, arrays))
        cost = cls(max(0.0, float(analysis.get("flops", 0.0))), bytes_accessed, low)
        if COSTS.model is not None:
            cost = dataclasses.replace(cost, seconds=COSTS.seconds(cost))
        return cost


def _storage_bytes(compiled: Any, arrays: list) -> float:
    """The bytes of a program's inputs and results at their dtypes (inf if unknown)."""
    import jax

    try:
        results = jax.tree_util.tree_leaves(compiled.out_info)
    except Exception:  # an executable that does not describe its results
        return float("inf")
    return float(sum(np.prod(a.shape, dtype=np.int64) * np.dtype(a.dtype).itemsize for a in [*arrays, *results]))


class Tally:
    """One compiled program (of one op): its cost, the row of its op's totals that each of its
    executions adds to, and its device time on each compared target (for the comparison
    ``compared`` is for; computed on its first execution under it)."""

    __slots__ = ("op", "cost", "row", "compared", "target_seconds")

    def __init__(self, op: str, cost: ProgramCost, row: list):
        self.op = op
        self.cost = cost
        self.row = row
        self.compared: TargetComparison | None = None
        self.target_seconds: tuple[float, ...] = ()


@dataclass
class CostLedger:
    """Per-op totals of executed programs and their estimated device time.

    Each compiled program gets a :class:`Tally` once (:meth:`tally`); running it adds its cost
    to its op's totals (:meth:`record`), so reading them (:meth:`summary`) takes one step per
    op, however many programs the process has compiled (a conformance run compiles thousands
    and reads the totals twice per test). Each execution is also one launch
    (:attr:`launches`); the allocator reports host waits to it (:meth:`wait`).

    With targets to compare (:attr:`comparison`, from ``ACCELKIT_ESTIMATE_ON``), each execution
    is also counted on every compared generation: the program's own roofline on that
    generation, the same launches and waits, so every target's figure comes from one record.
    """

    _model: DeviceModel | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    #: op -> [calls, flops, bytes accessed, estimated seconds] since the last reset.
    _totals: dict[str, list] = field(default_factory=dict)
    #: Executions not yet added to the totals and launches (see :meth:`record`).
    _executed: deque = field(default_factory=deque)
    launches: LaunchLedger = field(default_factory=LaunchLedger)
    comparison: TargetComparison | None = None

    @property
    def model(self) -> DeviceModel | None:
        """The target's device model (set when the backend is activated): its peaks and its
        per-launch time."""
        return self._model

    @model.setter
    def model(self, model: DeviceModel | None) -> None:
        self._model = model
        self.launches.launch_seconds = model.launch_seconds if model is not None else 0.0

    def seconds(self, cost: ProgramCost, model: DeviceModel | None = None) -> float:
        """The roofline of one execution of ``cost`` on ``model`` (default: the target)."""
        model = model or self.model
        if model is None:
            return 0.0
        peak_dtype = torch.bfloat16 if cost.low_precision else torch.float32
        peak = model.peak_flops.get(peak_dtype) or max(model.peak_flops.values())
        compute = cost.flops / peak
        memory = cost.bytes_accessed / model.memory_bandwidth if model.memory_bandwidth else 0.0
        return max(compute, memory)

    def tally(self, op: str, cost: ProgramCost) -> Tally:
        """The counter of one compiled program of ``op``, included in every summary."""
        with self._lock:
            row = self._totals.setdefault(op, [0, 0.0, 0.0, 0.0])
        return Tally(op, cost, row)

    def record(self, tally: Tally) -> None:
        """Count one execution of ``tally``'s program.

        Executions are kept in order and settled in batches (:meth:`_settle`: at a host wait,
        at every read or reset of the figures, and every :data:`SETTLE_EVERY` executions): a
        small op's record is one append, and the figures read are the same as if every
        execution had been added at once."""
        executed = self._executed
        executed.append(tally)
        if len(executed) >= SETTLE_EVERY:
            self._settle()

    def backlog(self) -> tuple[deque, int, Callable[[], None]]:
        """:meth:`record` in parts, for a caller that inlines it on every op: the executions
        not yet settled, the length at which they must be, and the settling; i.e.
        ``backlog.append(tally)``, then ``if len(backlog) >= limit: settle()``."""
        return self._executed, SETTLE_EVERY, self._settle

    def _settle(self) -> None:
        """Add the executions recorded since the last settling to the totals and the launch
        ledgers, in the order they ran."""
        with self._lock:
            executed = self._executed
            # One popleft at a time: an execution recorded meanwhile stays for the next batch.
            batch = [executed.popleft() for _ in range(len(executed))]
            if not batch:
                return
            seconds: dict[Tally, float] = {}
            for tally, runs in Counter(batch).items():
                cost = tally.cost
                seconds[tally] = cost.seconds if cost.seconds is not None else self.seconds(cost)
                row = tally.row
                row[0] += runs
                row[1] += runs * cost.flops
                row[2] += runs * cost.bytes_accessed
                row[3] += runs * seconds[tally]
            self.launches.launch_all([seconds[tally] for tally in batch])
            comparison = self.comparison
            if comparison is not None:
                for tally in seconds:
                    if tally.compared is not comparison:
                        tally.target_seconds = tuple(self.seconds(tally.cost, m) for m in comparison.models)
                        tally.compared = comparison
                comparison.launch_all([tally.target_seconds for tally in batch])

    def wait(self) -> None:
        """The host waits for the device (a read to the host)."""
        self._settle()
        self.launches.wait()
        if self.comparison is not None:
            self.comparison.wait()

    def reset(self) -> None:
        with self._lock:
            self._executed.clear()
            self.launches.reset()
            if self.comparison is not None:
                self.comparison.reset()
            for row in self._totals.values():
                row[:] = [0, 0.0, 0.0, 0.0]

    def summary(self) -> dict[str, Any]:
        self._settle()
        with self._lock:
            ran = sorted((op, tuple(row)) for op, row in self._totals.items() if row[0])
        ops = {op: {"calls": int(c), "flops": f, "bytes": b, "estimated_seconds": s} for op, (c, f, b, s) in ran}
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
            flops=summary["flops"], hbm_bytes=summary["bytes"], **self.launches.fields(),
            by_target=self.comparison.by_target() if self.comparison else {},
            not_estimated=self.comparison.not_estimated if self.comparison else {},
        )


#: The process's ledger; its device model is set when the tpu backend is activated.
COSTS = CostLedger()
