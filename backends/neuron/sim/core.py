"""The simulated NeuronCore: its memories, its clock, and how it runs kernels and programs.

A kernel is a tile program written against the instruction set (:mod:`.isa`) and run inside
:meth:`NeuronCore.kernel`; a compiled graph's kernels run inside :meth:`NeuronCore.program`,
sharing the engines' timelines. What they cost is recorded in :mod:`.timeline`'s records.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from accelkit_backends.neuron.device import CoreSpec
from accelkit_backends.neuron.sim.isa import Kernel, TilePool
from accelkit_backends.neuron.sim.memory import OnChipMemory
from accelkit_backends.neuron.sim.replay import Recording
from accelkit_backends.neuron.sim.residency import keep_on_chip
from accelkit_backends.neuron.sim.timeline import ENGINES, Instruction, KernelRecord, Program, ReplayedKernel

__all__ = ["ENGINES", "Instruction", "Kernel", "KernelRecord", "NeuronCore", "TilePool"]

#: Kernel and program instances whose timings a core keeps; past it, the table starts afresh
#: (its entries are re-timed when met again: the same schedule, computed again).
MAX_TIMED_INSTANCES = 65536


class NeuronCore:
    """One simulated NeuronCore: SBUF, PSUM, five engine queues and a device clock."""

    def __init__(self, spec: CoreSpec):
        self.spec = spec
        self.sbuf = OnChipMemory("SBUF", spec.partitions, spec.sbuf_partition_bytes)
        self.psum = OnChipMemory("PSUM", spec.partitions, spec.psum_partition_bytes,
                                 granule=spec.psum_partition_bytes // spec.psum_banks)
        self.clock = 0.0
        #: Called with each finished :class:`KernelRecord` and its instructions.
        self.listeners: list[Callable[[KernelRecord, list[Instruction]], None]] = []
        #: Called with each finished program's label and its kernels' records (after those
        #: records went to :attr:`listeners`).
        self.program_listeners: list[Callable[[str, list[KernelRecord]], None]] = []
        self.record_instructions = False
        #: Per kernel instance, its timing as first computed (see :meth:`kernel`).
        self._timings: dict[Any, tuple[int, KernelRecord]] = {}
        #: Per program instance, its kernels' timings as first computed (see :meth:`program`).
        self._program_timings: dict[Any, tuple[int, list[KernelRecord]]] = {}
        self._program: Program | None = None
        #: Kernels run (in full or replayed) since the core was made.
        self.kernels_run = 0

    @contextlib.contextmanager
    def kernel(self, name: str, instance: Any = None) -> Iterator[Kernel]:
        """Run a tile program; its SBUF/PSUM are freed and its timing recorded at exit.

        ``instance`` names what fixes the program's instructions (the op with its shapes, dtypes
        and static arguments). A compiled kernel instance is static, as a NEFF is: its schedule
        is computed the first time, and later runs only execute the instructions' numerics and
        reuse that timing — unless they issue a different number of instructions (a
        data-dependent program), which are then timed afresh. Recording instructions for a
        profile times every run. Inside :meth:`program`, the program times its kernels.
        """
        self.kernels_run += 1
        program = self._program
        if program is not None:
            # Timed when the program ends, once it is known what stays in SBUF (.residency).
            kernel = Kernel(self, name, program.start, defer_timing=True, program=program)
            try:
                yield kernel
            finally:
                kernel.release_all()
                kernel.sbuf_peak = self.sbuf.peak
                self.sbuf.reset(keep_released=True)
                self.psum.reset(keep_released=True)
            program.kernels.append(kernel)
            return
        timing = None if instance is None or self.record_instructions else self._timings.get(instance)
        kernel = Kernel(self, name, self.clock, defer_timing=instance is not None and not self.record_instructions)
        try:
            yield kernel
        finally:
            self.sbuf.reset()
            self.psum.reset()
        record = kernel.finish(timing)
        kernel.retire()
        if instance is not None and timing is None and not self.record_instructions:
            if len(self._timings) >= MAX_TIMED_INSTANCES:
                self._timings.clear()
            self._timings[instance] = (kernel.timed_steps, record.moved(-record.start))
        if kernel.recording is not None:
            kernel.recording.finished(record.flops, record.moved(-record.start))
        self.clock = record.end
        for listener in self.listeners:
            listener(record, kernel.log)

    def can_replay(self, instance: Any) -> bool:
        """Whether a run of a kernel instance may be a replay of its numerics (see
        :mod:`.replay`): its timing is known — from an earlier run, or as part of a program
        whose schedule is known — and no profile records instructions."""
        if self.record_instructions:
            return False
        program = self._program
        return program.timing_known if program is not None else instance in self._timings

    def replayed(self, name: str, instance: Any, recording: Recording) -> None:
        """Account for a replayed run of a kernel instance (its numerics are computed): its known
        timing on the clock, and its record to the listeners, as :meth:`kernel` does."""
        self.kernels_run += 1
        program = self._program
        if program is not None:
            program.kernels.append(ReplayedKernel(name, recording))
            return
        record = self._timings[instance][1].moved(self.clock, recording.flops)
        self.clock = record.end
        for listener in self.listeners:
            listener(record, [])

    @contextlib.contextmanager
    def detached(self) -> Iterator[None]:
        """Kernels run inside leave no trace: the clock, listeners and program listeners are
        restored after (a check that runs a program a second time)."""
        saved = (self.clock, self.listeners, self.program_listeners, self.kernels_run)
        self.listeners, self.program_listeners = [], []
        try:
            yield
        finally:
            self.clock, self.listeners, self.program_listeners, self.kernels_run = saved

    def can_replay_program(self, instance: Any) -> bool:
        """Whether a whole program instance may run as a replay: its schedule is known, it is
        not inside another program, and no profile records instructions."""
        return not self.record_instructions and self._program is None and instance in self._program_timings

    def replayed_program(self, instance: Any, label: str) -> None:
        """Account for a replayed program instance: its known schedule from the clock on, each
        kernel's record to the listeners, as :meth:`program` does."""
        relative = self._program_timings[instance][1]
        records = [r.moved(self.clock) for r in relative]
        self.kernels_run += len(records)
        self.clock = max([self.clock, *(r.end for r in records)])
        for record in records:
            for listener in self.listeners:
                listener(record, [])
        for listener in self.program_listeners:
            listener(label, records)

    @contextlib.contextmanager
    def program(self, instance: Any = None, label: str = "program") -> Iterator[Program | None]:
        """Run the kernels inside as one compiled program, as a NEFF runs a whole graph.

        The kernels share the engines' and DMA queues' timelines and the HBM write times: each
        instruction starts once its engine is free and its data is ready, so a kernel overlaps
        the ones before it wherever the data allows (a matmul on the Tensor engine under the
        previous op's Vector work), and on-chip memory a kernel reuses waits for the kernel that
        used it last. Each kernel's record spans its own instructions; device time counts the
        program once (:attr:`KernelRecord.advance`). A program instance is static: its schedule
        is computed the first time and reused while it issues as many timing steps. Nested
        calls join the outer program. ``label`` names the program in estimates and traces.

        Yields the :class:`Program` (None when nested); a caller that sets its ``boundary`` (the
        HBM arrays going in and out) lets intermediates stay in SBUF (:mod:`.residency`).
        """
        if self._program is not None:
            yield None
            return
        program = Program(self.clock, dict.fromkeys(ENGINES, self.clock),
                           [[] for _ in range(self.spec.dma_queues)], {e: [] for e in ENGINES}, {},
                           instance is not None and not self.record_instructions and instance in self._program_timings)
        self._program = program
        try:
            yield program
        finally:
            self._program = None
            self._finish_program(program, instance, label)

    def _finish_program(self, program: Program, instance: Any, label: str) -> None:
        kernels = program.kernels
        # Per kernel, its timing steps; a replayed kernel is static and issued what it did then.
        steps = [None if isinstance(k, ReplayedKernel) else k.timed_steps for k in kernels]
        cacheable = instance is not None and not self.record_instructions
        known = self._program_timings.get(instance) if cacheable else None
        if known is not None and len(known[0]) == len(steps) and all(
                mine is None or mine == then for mine, then in zip(steps, known[0])):
            records = [rel.moved(program.start, k.flops) for rel, k in zip(known[1], kernels)]
            for kernel, relative in zip(kernels, known[1]):
                if isinstance(kernel, Kernel) and kernel.recording is not None:
                    kernel.recording.finished(kernel.flops, relative.moved(-relative.start))
        else:
            if program.boundary is not None and program.touches and all(isinstance(k, Kernel) for k in kernels):
                keep_on_chip(program.touches, program.boundary, [k.sbuf_peak for k in kernels], self.spec)
            records, frontier = [], program.start
            for kernel in kernels:
                if isinstance(kernel, ReplayedKernel):
                    # Rare: another kernel's instruction count changed, so the program is timed
                    # afresh, and a replayed kernel has only its recorded timing: it runs after
                    # the kernels before it, overlapping none (a conservative estimate).
                    record = kernel.recording.timing.moved(frontier, kernel.flops)
                else:
                    record = kernel.finish()
                    if kernel.recording is not None:
                        kernel.recording.finished(record.flops, record.moved(-record.start))
                record.advance = max(0.0, record.end - frontier)
                frontier = max(frontier, record.end)
                records.append(record)
            if cacheable:
                if len(self._program_timings) >= MAX_TIMED_INSTANCES:
                    self._program_timings.clear()
                self._program_timings[instance] = ([k.timed_steps if isinstance(k, Kernel) else None for k in kernels],
                                                   [r.moved(-program.start) for r in records])
        self.sbuf.forget_released()
        self.psum.forget_released()
        self.clock = max([self.clock, *(r.end for r in records)])
        for kernel, record in zip(kernels, records):
            for listener in self.listeners:
                listener(record, kernel.log)
        for listener in self.program_listeners:
            listener(label, records)
        for kernel in kernels:
            if isinstance(kernel, Kernel):
                kernel.retire()
        program.kernels, program.touches, program.boundary = [], [], None
