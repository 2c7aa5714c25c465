"""What kernels cost on the simulated core's clock: the records of executed instructions and
kernels, and the timelines a compiled program's kernels share (see ``NeuronCore.program``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from accelkit_backends.neuron.sim.replay import Recording

if TYPE_CHECKING:
    from accelkit_backends.neuron.sim.isa import Kernel

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")


@dataclass
class Instruction:
    """One executed instruction on the timeline (seconds since the core's clock started)."""

    kernel: str
    name: str
    engine: str
    start: float
    end: float
    detail: str = ""


@dataclass(slots=True)
class KernelRecord:
    """What one kernel execution cost: latency and busy time per engine (estimates). Once the
    kernel is finished, its record is not changed: records moved from it share its ``busy``."""

    name: str
    start: float
    end: float
    busy: dict[str, float] = field(default_factory=lambda: dict.fromkeys(ENGINES, 0.0))
    instructions: int = 0
    flops: int = 0
    hbm_bytes: int = 0
    #: Bytes its DMAs moved on chip in a program instead of through HBM (see .residency).
    kept_bytes: int = 0
    #: How far the kernel moved the device clock: its latency, or in a program (whose kernels
    #: overlap) only what it added past the kernels before it. Device time is the sum of these.
    advance: float | None = None

    @property
    def latency(self) -> float:
        return self.end - self.start

    @property
    def device_seconds(self) -> float:
        return self.latency if self.advance is None else self.advance

    def moved(self, by: float, flops: int | None = None) -> KernelRecord:
        """This record ``by`` seconds later (with a run's own FLOP count, if given)."""
        return KernelRecord(self.name, self.start + by, self.end + by, self.busy, self.instructions,
                            self.flops if flops is None else flops, self.hbm_bytes, self.kept_bytes,
                            self.advance)


@dataclass
class Program:
    """The shared timelines of the kernels one compiled program runs (see
    :meth:`~accelkit_backends.neuron.sim.core.NeuronCore.program`)."""

    start: float
    engine_free: dict[str, float]
    dma_queues: list[list[tuple[float, float]]]
    #: Each compute engine's busy intervals, sorted: a kernel's instruction may take an idle
    #: gap before an earlier kernel's (see ``Kernel._place``).
    engine_busy: dict[str, list[tuple[float, float]]]
    hbm_writes: dict[int, list[tuple[int, int, float]]]
    #: The program instance's schedule is known (a replayed kernel needs no timing of its own).
    timing_known: bool = False
    kernels: list[Kernel | ReplayedKernel] = field(default_factory=list)
    #: The HBM arrays that cross the program's boundary (its inputs and results), when its
    #: caller names them: then what it writes and reads only inside may stay in SBUF.
    boundary: list | None = None
    #: The HBM accesses of its DMAs, in order (see :mod:`.residency`).
    touches: list = field(default_factory=list)
    #: The Tensor engine's warm-up: since when it has been busy, and until when (see
    #: ``Kernel._warming``).
    tensor_warm: list[float] = field(default_factory=lambda: [-math.inf, -math.inf])


@dataclass
class ReplayedKernel:
    """A kernel of a program that ran as a replay (:mod:`.replay`): no instructions of its own
    to time, its recording's flops and timing instead."""

    name: str
    recording: Recording
    log: list = field(default_factory=list)

    @property
    def flops(self) -> int:
        return self.recording.flops
