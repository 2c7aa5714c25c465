"""The simulated NeuronCore's NKI-like instruction set: it executes and is timed.

A kernel is a tile program run inside :meth:`NeuronCore.kernel`::

    with core.kernel("add") as k:
        a = k.sbuf((128, 512), np.float32, "a")
        k.dma(a, hbm_x)                          # HBM -> SBUF on a DMA queue
        k.tensor_scalar(a, a, "add", 1.0)        # VectorE
        k.dma(hbm_out, a)                        # SBUF -> HBM

Each instruction **executes** at once in numpy (fp32 engine arithmetic, rounding into narrower
tiles per :mod:`numerics`) and is **scheduled**: it starts when its engine is free and its
operands are ready (read-after-write, write-after-read, and reuse of freed memory are all
dependencies), and lasts as long as :mod:`cost` says. Engines therefore overlap wherever the
data allows, and a kernel has an estimated latency and per-engine busy time. Breaking a rule —
a tile over 128 partitions, SBUF/PSUM exhausted, a matmul operand over its limit — raises a
:class:`~accelkit_backends.neuron.sim.errors.NeuronKernelError` naming the kernel.
"""


from __future__ import annotations

import bisect
import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from numpy.lib.array_utils import byte_bounds

from accelkit.sdk import RandomDraw, random_stream
from accelkit_backends.neuron.sim import cost
from accelkit_backends.neuron.sim import numerics as nx
from accelkit_backends.neuron.sim.alu import (
    ACTIVATIONS, BINARY_OPS, REDUCE_OPS, check_int32, evaluate_activation, fp32,
)
from accelkit_backends.neuron.sim.errors import NeuronDtypeError, NeuronKernelError, TileShapeError
from accelkit_backends.neuron.sim.memory import OnChipMemory, Tile
from accelkit_backends.neuron.sim.replay import Recording
from accelkit_backends.neuron.sim.residency import Touch
from accelkit_backends.neuron.sim.timeline import ENGINES, Instruction, KernelRecord, Program

if TYPE_CHECKING:
    from accelkit_backends.neuron.sim.core import NeuronCore

_ON_CHIP_DTYPES = frozenset(np.dtype(d) for d in (
    np.float32, np.float16, nx.TORCH_TO_NUMPY[torch.bfloat16], nx.TORCH_TO_NUMPY[torch.float8_e4m3fn],
    nx.TORCH_TO_NUMPY[torch.float8_e5m2], np.int8, np.uint8, np.int16, np.uint16, np.int32,
    np.uint32, np.bool_,
))


class Kernel:
    """The instruction set, bound to one kernel execution (see the module docstring)."""

    def __init__(self, core: NeuronCore, name: str, start: float, defer_timing: bool = False,
                 program: Program | None = None):
        self.core = core
        self.spec = core.spec
        self.name = name
        self.start = start
        self.log: list[Instruction] = []
        # Deferred timing: each instruction executes at once and queues its timing here, to be
        # computed in order at the end (or replaced by the instance's known timing).
        self._untimed: list[Callable[[], None]] | None = [] if defer_timing else None
        #: How many timing steps (instructions, allocations, frees) the kernel took.
        self.timed_steps = 0
        self._program = program
        #: Bytes per partition this kernel's SBUF tiles needed at most (set when it ends).
        self.sbuf_peak = 0
        # In a program the record spans the kernel's own instructions (see NeuronCore.program).
        self._record = KernelRecord(name, math.inf if program is not None else start, start)
        if program is not None:
            self._engine_free = program.engine_free
            self._dma_queues = program.dma_queues
            self._hbm_writes = program.hbm_writes
            self._engine_busy: dict[str, list[tuple[float, float]]] | None = program.engine_busy
            self._tensor_warm = program.tensor_warm
            #: Where this kernel's own instruction stream is on each engine.
            self._own_free = dict.fromkeys(ENGINES, start)
        else:
            self._engine_busy = None
            self._tensor_warm = [-math.inf, -math.inf]
            self._engine_free = dict.fromkeys(ENGINES, start)
            self._own_free = self._engine_free  # alone, the engines run this kernel's stream only
            self._dma_queues = [[] for _ in range(core.spec.dma_queues)]  # busy intervals, sorted
            self._hbm_writes: dict[int, list[tuple[int, int, float]]] = {}  # see _hbm_buckets
        self._tensor_used = False
        #: The replay recording this run fills (see :mod:`.replay`), or None.
        self.recording: Recording | None = None

    @property
    def flops(self) -> int:
        """FLOPs this run executed (counted as instructions execute, not when they are timed)."""
        return self._record.flops

    def release_all(self) -> None:
        """Free every tile still live at the kernel's end, on the timeline too (in a program,
        the next kernel's tiles in that memory wait for this kernel's last use)."""
        for memory in (self.core.sbuf, self.core.psum):
            for tile in list(memory._live.values()):
                self._release(tile)

    # -- memory ---------------------------------------------------------------------------

    def sbuf(self, shape: tuple[int, ...], dtype: Any, name: str = "t") -> Tile:
        """A tile in SBUF. ``int64`` gives an int32 tile that refuses values outside int32
        (the int64 policy); other 64-bit and complex dtypes are errors."""
        return self._allocate(self.core.sbuf, shape, dtype, name)

    def psum(self, shape: tuple[int, ...], dtype: Any = np.float32, name: str = "acc") -> Tile:
        return self._allocate(self.core.psum, shape, dtype, name)

    def _allocate(self, memory: OnChipMemory, shape: tuple[int, ...], dtype: Any, name: str,
                  at: int | None = None) -> Tile:
        dtype = nx.numpy_dtype(dtype) if isinstance(dtype, torch.dtype) else np.dtype(dtype)
        checked = dtype == np.int64
        tile = memory.allocate(tuple(shape), self._on_chip(np.int32 if checked else dtype, name), name, self.name,
                               at)
        tile.checked = checked
        self._timed(lambda: memory.make_available(tile))
        if self.recording is not None:
            self.recording.tile(tile.data)
        return tile

    def free(self, *tiles: Tile) -> None:
        for tile in tiles:
            self._release(tile)

    def _release(self, tile: Tile) -> None:
        memory = tile.memory
        base = memory.release(tile)
        if base is not None:
            self._timed(lambda: memory.note_release(base))

    def live_tiles(self) -> list[Tile]:
        """The SBUF and PSUM tiles allocated and not yet freed."""
        return [*self.core.sbuf._live.values(), *self.core.psum._live.values()]

    def pool(self, bufs: int, memory: str = "sbuf") -> TilePool:
        """A rotating pool of ``bufs`` tiles (multi-buffering): allocating one more frees the
        oldest, so a loop's next loads go to other memory and overlap the current compute."""
        return TilePool(self, bufs, memory)

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Free every tile allocated inside the block when it ends (a loop body's tiles)."""
        marks = (set(self.core.sbuf._live), set(self.core.psum._live))
        try:
            yield
        finally:
            for memory, before in zip((self.core.sbuf, self.core.psum), marks):
                for offset in [o for o in memory._live if o not in before]:
                    self._release(memory._live[offset])

    def _on_chip(self, dtype: Any, name: str) -> np.dtype:
        dtype = nx.numpy_dtype(dtype) if isinstance(dtype, torch.dtype) else np.dtype(dtype)
        if dtype not in _ON_CHIP_DTYPES:
            raise NeuronDtypeError(
                f"{self.name}: tile {name} cannot be {dtype}: NeuronCore engines have no 64-bit "
                "or complex types (N-ndt). Load int64 as int32 and float64 as float32."
            )
        return dtype

    # -- scheduling -----------------------------------------------------------------------

    def _timed(self, step: Callable[[], None]) -> None:
        """Run a timing step now, or queue it when timing is deferred."""
        self.timed_steps += 1
        if self._untimed is None:
            step()
        else:
            self._untimed.append(step)

    def _run(self, compute: Callable[..., None], *hbm: np.ndarray) -> None:
        """Execute an instruction's numerics, ``compute(*hbm)`` (``hbm``: its HBM operands), now;
        a recording keeps them to replay on new memory (see :mod:`.replay`). Engines compute
        as IEEE says, silently: inf and NaN propagate without numpy's warnings."""
        with np.errstate(all="ignore"):
            compute(*hbm)
        if self.recording is not None:
            self.recording.step(compute, hbm)

    def _schedule(self, *args: Any, **kwargs: Any) -> None:
        self._timed(lambda: self._place(*args, **kwargs))

    def _place(self, name: str, engine: str, seconds: float, reads: tuple = (), writes: tuple = (),
               detail: str = "", earliest: float | None = None, busy: float | None = None) -> tuple[float, float]:
        """Place an instruction after its engine and operands are free; ``busy`` is the engine
        time it accounts for, when that differs from its span (DMA: queue time, not latency).

        An engine runs a kernel's instructions in order. In a program it may run one in an idle
        gap before instructions of earlier kernels, as the compiler's scheduler interleaves
        independent ops' instruction streams on each engine (a NEFF is one schedule, not a
        sequence of kernels); gaps are looked for among the engine's latest intervals only."""
        start = self._own_free[engine] if earliest is None else earliest
        for operand in reads:
            start = max(start, self._ready(operand))
        for operand in writes:
            start = max(start, self._write_ready(operand))
        if engine == "tensor" and self.spec.tensor_warmup_s:
            seconds = self._warming(start, seconds)
        if earliest is None and self._engine_busy is not None:
            busy_intervals = self._engine_busy[engine]
            start = _earliest_gap(busy_intervals, start, seconds)
            _occupy(busy_intervals, start, start + seconds)
        end = start + seconds
        if start < self._record.start:  # in a program, where the kernel's span begins
            self._record.start = start
        for operand in reads:
            self._mark_read(operand, end)
        for operand in writes:
            self._mark_written(operand, end)
        if earliest is None:
            self._engine_free[engine] = max(self._engine_free[engine], end)
            self._own_free[engine] = end
        self._record.busy[engine] += seconds if busy is None else busy
        self._record.instructions += 1
        self._record.end = max(self._record.end, end)
        if self.core.record_instructions:
            self.log.append(Instruction(self.name, name, engine, start, end, detail))
        return start, end

    def _warming(self, start: float, seconds: float) -> float:
        """How long a Tensor-engine instruction of ``seconds`` at full speed takes from ``start``:
        after idling for longer than the warm-up (``CoreSpec.tensor_warmup_s``, an assumption:
        the published figure says how long the warm-up takes, not after how long an idle engine
        cools) the engine starts at half speed and reaches full speed linearly over the warm-up."""
        window = self.spec.tensor_warmup_s
        since, until = self._tensor_warm
        if start > until + window:
            since = start
        speed = 0.5 + 0.5 * min(1.0, max(0.0, (start - since) / window))
        seconds /= speed
        self._tensor_warm[:] = [since, max(until, start + seconds)]
        return seconds

    def _ready(self, operand: Any) -> float:
        """When ``operand``'s data is ready to read: after the last write to it (for HBM, the
        last write to an overlapping byte range in this kernel)."""
        if isinstance(operand, Tile):
            return operand.base.ready_at if operand.base.ready_at else self.start
        low, high = byte_bounds(operand)
        ready = self.start
        for bucket in _hbm_buckets(low, high):
            for lo, hi, end in self._hbm_writes.get(bucket, ()):
                if lo < high and low < hi and end > ready:
                    ready = end
        return ready

    def _write_ready(self, operand: Any) -> float:
        """When ``operand`` may be overwritten: after its last write and read. Writes to HBM do
        not wait for each other (a kernel writes each output element once)."""
        if isinstance(operand, Tile):
            return max(self._ready(operand), operand.base.read_until)
        return self.start

    def _mark_read(self, operand: Any, end: float) -> None:
        if isinstance(operand, Tile):
            operand.base.read_until = max(operand.base.read_until, end)

    def _mark_written(self, operand: Any, end: float) -> None:
        if isinstance(operand, Tile):
            operand.base.ready_at = end
        else:
            low, high = byte_bounds(operand)
            for bucket in _hbm_buckets(low, high):
                self._hbm_writes.setdefault(bucket, []).append((low, high, end))

    def finish(self, known: tuple[int, KernelRecord] | None = None) -> KernelRecord:
        """The kernel's record: ``known`` (the instance's timing) when the kernel took as many
        timing steps as it did then, else the queued timing computed now, in order."""
        untimed, self._untimed = self._untimed, None
        if untimed is not None:
            if known is not None and known[0] == self.timed_steps:
                self._record = known[1].moved(self.start, self._record.flops)
            else:
                for step in untimed:
                    step()
                if self._program is None:  # a program's kernels wait on each other's memory
                    self.core.sbuf.forget_released()
                    self.core.psum.forget_released()
        if self._record.start == math.inf:  # a kernel in a program that issued no instruction
            self._record.start = self._record.end
        return self._record

    def retire(self) -> None:
        """Drop what only timing needed, once the kernel's record is made. A recording's steps
        keep the kernel (their numerics call its methods): through its queued timing steps and
        its program, it would also keep every array and tile the program touched — and those
        links are cycles, which only the cyclic collector frees, long after: one 4000-element
        sort left 1 GB of such garbage."""
        self._untimed = None
        self._program = None
        self._engine_free = self._dma_queues = self._hbm_writes = None  # type: ignore[assignment]
        self._engine_busy = self._own_free = self._tensor_warm = None  # type: ignore[assignment]

    def check(self, check: Callable[..., None], *hbm: np.ndarray) -> None:
        """``check(*hbm)``: a check of HBM values that the simulator makes and the hardware
        cannot (a target or index out of range), before the instructions that read them. Not an
        instruction (nothing is timed); a replay makes the check again on its new values."""
        self._run(check, *hbm)

    # -- DMA ------------------------------------------------------------------------------

    def dma(self, dst: Tile | np.ndarray, src: Tile | np.ndarray, transpose: bool = False,
            pattern: np.ndarray | None = None, reordered: bool = False) -> None:
        """Copy between HBM (numpy arrays) and SBUF tiles, or SBUF to SBUF.

        Shapes must match. DMA does not convert dtypes, with two policy exceptions: an int64 HBM
        tensor loads as int32 (an error if a value does not fit) and stores back sign-extended;
        float64 (only present under ``ACCELKIT_NEURON_FLOAT64=downcast``) loads as float32.
        ``transpose=True`` loads ``src.T`` (a DMA transpose, NeuronCore-v3 and later).
        ``pattern`` is the HBM view the transfer walks, when ``src`` holds values already
        gathered from it (a broadcast or strided input): the cost follows the pattern.
        ``reordered``: ``pattern`` is a dense block walked in memory order, and ``dst`` takes it in
        another dim order (a transposed view of a tensor), as a compiler loads such a view: a DMA
        transpose where the DMA engine has one (NeuronCore-v3 and later), else a copy in memory
        order then a reorder on chip (Tensor-engine transposes through PSUM, copied back by the
        Vector engine). Costed so; the values are ``src``'s either way.
        """
        if isinstance(dst, Tile) and dst.memory is self.core.psum:
            raise NeuronKernelError(f"{self.name}: DMA cannot write PSUM; matmuls write PSUM")
        values = src.data if isinstance(src, Tile) else src
        if transpose:
            if not self.spec.transpose_in_dma:
                raise NeuronKernelError(
                    f"{self.name}: DMA transpose needs NeuronCore-v3 or later ({self.spec.version} "
                    "transposes on the Tensor engine: use Kernel.transpose)"
                )
            values = values.T
        target = dst.data if isinstance(dst, Tile) else dst
        if values.shape != target.shape:
            raise TileShapeError(f"{self.name}: DMA of shape {values.shape} into {target.shape}")
        hbm = tuple(a for a in (src, dst) if not isinstance(a, Tile))
        from_hbm, to_hbm = not isinstance(src, Tile), not isinstance(dst, Tile)

        def copy(*hbm: np.ndarray) -> None:
            source = hbm[0] if from_hbm else src.data
            target = hbm[-1] if to_hbm else dst.data
            target[...] = self._dma_convert(source.T if transpose else source, target.dtype)

        if values.dtype == target.dtype:
            # A plain copy: replays written out as code (.straight_line) copy directly. None
            # stands for an HBM operand.
            copy.plain = (None if from_hbm else src.data, None if to_hbm else dst.data,  # type: ignore[attr-defined]
                          transpose)
        self._run(copy, *hbm)
        nbytes = values.size * max(values.dtype.itemsize, target.dtype.itemsize)
        hbm_side = src if not isinstance(src, Tile) else dst if not isinstance(dst, Tile) else None
        touches = tuple(t for t in (self._touch(src, write=False) if from_hbm else None,
                                    self._touch(dst, write=True) if to_hbm else None) if t is not None)
        walked = pattern if pattern is not None else hbm_side if hbm_side is not None else values
        run = contiguous_run_bytes(walked)
        transposing = transpose or (reordered and self.spec.transpose_in_dma)
        self._dma_schedule("dma_transpose" if transposing else "dma", nbytes, run, transposing,
                           reads=(src,), writes=(dst,), via_hbm=hbm_side is not None, touches=touches)
        if reordered and not self.spec.transpose_in_dma and isinstance(dst, Tile):
            self._timed(lambda: self._place_reorder(dst))

    def _place_reorder(self, tile: Tile) -> None:
        """The cost of putting a tile loaded in memory order into its dims' order on a core
        without DMA transposes: a Tensor-engine transpose per 128 columns into PSUM, and the
        Vector engine's copy back to SBUF."""
        p, f = tile.partitions, tile.free_size
        dtype = nx.torch_dtype(tile.dtype)
        for start in range(0, f, self.spec.partitions):
            columns = min(self.spec.partitions, f - start)
            idle = not self._tensor_used or self._engine_free["tensor"] < self._ready(tile)
            self._tensor_used = True
            self._place("transpose", "tensor", cost.matmul_seconds(self.spec, p, columns, dtype, idle), (tile,), (),
                        f"[{p}, {columns}] reorder")
        self._place("tensor_copy", "vector", cost.vector_seconds(self.spec, f, 1, tile.dtype.itemsize == 2),
                    (tile,), (tile,), "PSUM to SBUF")

    def gather_rows(self, dst: Tile, table: np.ndarray, indices: Tile) -> None:
        """Indirect DMA: ``dst[p] = table[indices[p, 0]]`` for each partition (an embedding lookup).

        An index outside the table raises (the simulator can check what the hardware cannot).
        """
        if dst.partitions != indices.partitions or dst.shape[1:] != table.shape[1:]:
            raise TileShapeError(f"{self.name}: gather of {table.shape[1:]} rows into {dst.shape}")

        def gather(table: np.ndarray) -> None:
            rows = self._rows(indices, table)
            dst.data[...] = self._dma_convert(table[rows], dst.dtype)

        self._run(gather, table)
        self._touch(table, write=False, indirect=True)
        nbytes = dst.data.size * dst.dtype.itemsize
        run = math.prod(table.shape[1:]) * table.dtype.itemsize
        self._dma_schedule("dma_gather", nbytes, run, False, reads=(indices, table), writes=(dst,),
                           via_hbm=True, indirect=True)

    def scatter_rows(self, table: np.ndarray, src: Tile, indices: Tile, accumulate: bool = False) -> None:
        """Indirect DMA store: ``table[indices[p, 0]] = src[p]`` for each partition, or ``+=``
        with ``accumulate`` (a DMA read-modify-write add: the DMA engine reads the row, adds in
        fp32 and writes the sum back in the table's dtype; NKI API, ``nki.isa.dma_compute``).

        Partitions naming the same row are applied in partition order (the last write wins;
        every add lands). The compiler synchronises read-modify-writes of a duplicated offset
        (NKI API, ``nki.isa.dma_copy`` ``dst_rmw_op``), so each add reads the previous one's
        rounded result: a bfloat16 table accumulates its duplicates in bfloat16, one rounding per
        add, not in one fp32 sum. An index outside the table raises, as in :meth:`gather_rows`.
        """
        if src.partitions != indices.partitions or src.shape[1:] != table.shape[1:]:
            raise TileShapeError(f"{self.name}: scatter of {src.shape} into {table.shape[1:]} rows")

        def scatter(table: np.ndarray) -> None:
            rows = self._rows(indices, table)
            if accumulate:
                work = nx.compute_dtype(table.dtype, src.dtype)
                values = src.data.astype(work)
                if np.unique(rows).size == rows.size:  # distinct rows: one read-modify-write each
                    updated = table[rows].astype(work) + values
                    check_int32(updated, self.name)
                    table[rows] = nx.round_to(updated, table.dtype)
                    return
                for p in range(rows.shape[0]):  # serialised, each add rounded back
                    updated = np.asarray(table[rows[p]].astype(work) + values[p])
                    check_int32(updated, self.name)
                    table[rows[p]] = nx.round_to(updated, table.dtype)
            else:
                values = self._dma_convert(src.data, table.dtype)
                for p in range(rows.shape[0]):
                    table[rows[p]] = values[p]

        self._run(scatter, table)
        self._touch(table, write=True, indirect=True)
        nbytes = src.data.size * src.dtype.itemsize * (2 if accumulate else 1)
        run = math.prod(table.shape[1:]) * table.dtype.itemsize
        self._dma_schedule("dma_scatter_add" if accumulate else "dma_scatter", nbytes, run, False,
                           reads=(indices, src), writes=(table,), via_hbm=True, indirect=True)

    def _rows(self, indices: Tile, table: np.ndarray) -> np.ndarray:
        """The row numbers an indirect DMA reads from ``indices``; one outside the table raises."""
        rows = indices.data.reshape(indices.partitions, -1)[:, 0].astype(np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= table.shape[0]):
            bad = rows[(rows < 0) | (rows >= table.shape[0])][0]
            raise IndexError(f"{self.name}: index {int(bad)} is out of range for {table.shape[0]} rows")
        return rows

    def _dma_convert(self, values: np.ndarray, dtype: np.dtype) -> np.ndarray:
        if values.dtype == dtype:
            return values
        if values.dtype == np.int64 or dtype == np.int64:
            check_int32(values, self.name)  # int64 data on the 32-bit datapath
            return values.astype(dtype)
        if values.dtype == np.float64 and dtype == np.float32 or values.dtype == np.float32 and dtype == np.float64:
            return values.astype(dtype)
        raise NeuronKernelError(
            f"{self.name}: DMA does not convert {values.dtype} to {dtype}; load as is, then "
            "tensor_copy into a tile of the new dtype"
        )

    def _touch(self, array: np.ndarray, write: bool, indirect: bool = False) -> Touch | None:
        """Note an HBM access for the program's choice of what stays on chip (.residency);
        a program whose schedule is known already needs none."""
        program = self._program
        if program is None or program.timing_known:
            return None
        touch = Touch(len(program.kernels), array, write, indirect)
        program.touches.append(touch)
        return touch

    def _dma_schedule(self, *args: Any, **kwargs: Any) -> None:
        self._timed(lambda: self._place_dma(*args, **kwargs))

    def _place_dma(self, name: str, nbytes: int, run: int, transpose: bool, reads: tuple,
                   writes: tuple, via_hbm: bool, touches: tuple = (), indirect: bool = False) -> None:
        """Split a transfer over DMA queues (at least 2 KiB each, N-dma) and place each part in
        the earliest gap of a queue after its operands are ready, as the compiler's scheduler
        does (a store waiting for its data does not hold back later, independent loads). A
        transfer touching HBM moves at most the core's HBM bandwidth shared by all queues.

        In a program, a transfer whose HBM accesses all stay on chip (:mod:`.residency`) is an
        SBUF-to-SBUF copy, and a store of such data is none: the compiler has the producer
        write where the data stays, so it takes no time past its data being ready. Nor is a
        load of a block already on chip as the load wants it (read in place)."""
        spec = self.spec
        if via_hbm and touches and all(t.on_chip for t in touches):
            self._record.kept_bytes += nbytes
            if isinstance(reads[0], Tile):
                self._place(name, "dma", 0.0, reads, writes, "kept in SBUF", earliest=self.start, busy=0.0)
                return
            if all(t.in_place for t in touches):
                self._place(name, "dma", 0.0, reads, writes, "read in place", earliest=self.start, busy=0.0)
                return
            via_hbm = False
        ready = self.start
        for operand in reads:
            ready = max(ready, self._ready(operand))
        for operand in writes:
            ready = max(ready, self._write_ready(operand))
        parts = min(spec.dma_queues, max(1, nbytes // cost.DMA_MIN_TRANSFER_BYTES))
        busy = cost.dma_queue_seconds(spec, -(-nbytes // parts), run, transpose)
        if via_hbm:
            # Each queue's share of HBM bandwidth bounds its rate.
            busy = max(busy, cost.hbm_seconds(spec, -(-nbytes // parts)) * spec.dma_queues)
            self._record.hbm_bytes += nbytes
        slots = sorted((_earliest_gap(q, ready, busy), i) for i, q in enumerate(self._dma_queues))[:parts]
        for slot, queue in slots:
            _occupy(self._dma_queues[queue], slot, slot + busy)
        first = min(slot for slot, _ in slots)
        # An indirect transfer's descriptors come from the indices at run time: the hardware DGE
        # makes them where the core has one, else software on GpSimd (the usual fixed cost).
        fixed = spec.hardware_dge_latency_s if indirect and spec.hardware_dge_latency_s is not None \
            else spec.dma_fixed_latency_s
        finish = max(slot for slot, _ in slots) + busy + fixed
        # DMA busy time: the queues' occupancy spread over all queues (latency overlaps).
        occupancy = busy * len(slots) / spec.dma_queues
        self._place(name, "dma", finish - first, reads, writes, f"{nbytes} B", earliest=first, busy=occupancy)

    # -- Tensor engine --------------------------------------------------------------------

    def matmul(self, dst: Tile, stationary: Tile, moving: Tile, accumulate: bool = False) -> None:
        """``dst[M, N] (+)= stationary[K, M].T @ moving[K, N]`` in fp32 (nc_matmul, N-mm).

        K is the partition dim of both inputs (at most 128); M at most 128; N at most 512;
        inputs in SBUF, ``dst`` an fp32 PSUM tile; fp32 inputs must come in pairs.
        """
        spec = self.spec
        self._need(dst, self.core.psum, "matmul output")
        self._need(stationary, self.core.sbuf, "matmul stationary")
        self._need(moving, self.core.sbuf, "matmul moving")
        k, m = stationary.partitions, stationary.free_size
        n = moving.free_size
        if moving.partitions != k:
            raise TileShapeError(f"{self.name}: matmul contracts {k} partitions with {moving.partitions}")
        if m > spec.gemm_stationary_fmax or n > spec.gemm_moving_fmax:
            raise TileShapeError(
                f"{self.name}: matmul stationary free size {m} (limit {spec.gemm_stationary_fmax}) "
                f"and moving free size {n} (limit {spec.gemm_moving_fmax}); tile M and N"
            )
        if dst.shape != (m, n) or dst.dtype != np.float32:
            raise TileShapeError(f"{self.name}: matmul writes a float32 [{m}, {n}] PSUM tile, got {dst!r}")
        fp32_inputs = (stationary.dtype == np.float32) + (moving.dtype == np.float32)
        if fp32_inputs == 1:
            raise NeuronKernelError(f"{self.name}: matmul with one fp32 input needs both in fp32 (N-mm)")

        def multiply() -> None:
            product = fp32(stationary.data.reshape(k, m)).T @ fp32(moving.data.reshape(k, n))
            if accumulate:
                dst.data += product
            else:
                dst.data[...] = product

        self._run(multiply)
        dtype = nx.torch_dtype(moving.dtype)
        self._record.flops += 2 * k * m * n
        reads = (stationary, moving, dst) if accumulate else (stationary, moving)

        def place() -> None:
            # The engine's speed depends on whether it was idle: part of the timing.
            idle = not self._tensor_used or self._engine_free["tensor"] < max(
                self._ready(stationary), self._ready(moving))
            self._tensor_used = True
            seconds = cost.matmul_seconds(spec, n, m, dtype, idle)
            self._place("matmul", "tensor", seconds, reads, (dst,), f"K={k} M={m} N={n} {dtype}")

        self._timed(place)

    def transpose(self, dst: Tile, src: Tile) -> None:
        """``dst[F, P] = src[P, F].T`` on the Tensor engine (a matmul with the identity)."""
        self._need(dst, self.core.psum, "transpose output")
        p, f = src.partitions, src.free_size
        if f > self.spec.partitions:
            raise TileShapeError(f"{self.name}: transpose of free size {f} > {self.spec.partitions}")
        if dst.shape != (f, p):
            raise TileShapeError(f"{self.name}: transpose of [{p}, {f}] into {dst.shape}")
        self._run(lambda: dst.data.__setitem__(..., nx.round_to(fp32(src.data.reshape(p, f)).T.copy(), dst.dtype)))

        def place() -> None:
            idle = not self._tensor_used or self._engine_free["tensor"] < self._ready(src)
            self._tensor_used = True
            seconds = cost.matmul_seconds(self.spec, p, f, nx.torch_dtype(src.dtype), idle)
            self._place("transpose", "tensor", seconds, (src,), (dst,), f"[{p}, {f}]")

        self._timed(place)

    # -- Vector, Scalar, GpSimd engines -----------------------------------------------------

    def tensor_tensor(self, dst: Tile, a: Tile, b: Tile, op: str) -> None:
        """``dst = a <op> b`` elementwise; ``b`` may broadcast along free dims (stride 0)."""
        fn = _lookup(BINARY_OPS, op, "binary op")
        self._same_partitions(dst, a, b)
        work = nx.compute_dtype(a.dtype, b.dtype)

        def compute() -> None:
            values = fn(a.data.astype(work, copy=False), b.data.astype(work, copy=False))
            self._store(dst, values)

        self._run(compute)
        self._elementwise(f"tensor_tensor.{op}", dst, (a, b), work)

    def tensor_scalar(self, dst: Tile, a: Tile, op: str, scalar: float | Tile, reverse: bool = False) -> None:
        """``dst = a <op> scalar`` (or ``scalar <op> a``); ``scalar`` is a number or a [P, 1] tile."""
        fn = _lookup(BINARY_OPS, op, "binary op")
        self._same_partitions(dst, a)
        operands: tuple = (a,)
        if isinstance(scalar, Tile):
            self._same_partitions(dst, scalar)
            work = nx.compute_dtype(a.dtype, scalar.dtype)
            operands = (a, scalar)
        else:
            work = nx.compute_dtype(a.dtype, np.asarray(scalar).dtype)
            number = np.asarray(scalar, dtype=work)

        def compute() -> None:
            if isinstance(scalar, Tile):
                other = scalar.data.reshape((scalar.partitions,) + (1,) * (a.data.ndim - 1)).astype(work)
            else:
                other = number
            x = a.data.astype(work, copy=False)
            values = fn(other, x) if reverse else fn(x, other)
            self._store(dst, values)

        self._run(compute)
        self._elementwise(f"tensor_scalar.{op}", dst, operands[:1], work)

    def activation(self, dst: Tile, src: Tile, func: str, scale: float | Tile = 1.0,
                   bias: float | Tile | None = None, reduce_into: Tile | None = None) -> None:
        """``dst = func(src * scale + bias)`` on the Scalar engine, optionally also summing each
        partition's results into the [P, 1] tile ``reduce_into`` (activation_reduce).

        Scale and bias cost nothing extra (N-arch2). ``func`` is one of :data:`ACTIVATIONS`.
        """
        fn = _lookup(ACTIVATIONS, func, "activation")
        self._same_partitions(dst, src)

        def compute() -> None:
            x = fp32(src.data)
            if not (isinstance(scale, (int, float)) and scale == 1.0):
                x = x * self._per_partition(scale, x.ndim)
            if bias is not None:
                x = x + self._per_partition(bias, x.ndim)
            result = evaluate_activation(fn, x)
            self._store(dst, result)
            if reduce_into is not None:
                total = result.astype(np.float32).reshape(dst.partitions, -1).sum(axis=1, dtype=np.float32)
                reduce_into.data[...] = nx.round_to(total.reshape(reduce_into.shape), reduce_into.dtype)

        self._run(compute)
        reads: tuple = (src,) + tuple(t for t in (scale, bias) if isinstance(t, Tile))
        writes: tuple = (dst,) if reduce_into is None else (dst, reduce_into)
        seconds = cost.scalar_seconds(self.spec, src.free_size)
        self._schedule(f"activation.{func}", "scalar", seconds, reads, writes, f"[{src.partitions}, {src.free_size}]")

    def tensor_reduce(self, dst: Tile, src: Tile, op: str, negate: bool = False) -> None:
        """Reduce each partition's free elements: ``dst[p, 0] = reduce(src[p, :])`` (VectorE).

        ``op`` is one of :data:`REDUCE_OPS` or ``argmax``/``argmin`` (the first index, as int32).
        """
        self._same_partitions(dst, src)
        work = nx.compute_dtype(src.dtype)
        fn = None if op in ("argmax", "argmin") else _lookup(REDUCE_OPS, op, "reduction")

        def compute() -> None:
            values = src.data.reshape(src.partitions, -1).astype(work, copy=False)
            if fn is None:
                with np.errstate(invalid="ignore"):
                    pick = np.argmax if op == "argmax" else np.argmin
                    result = pick(values, axis=1)
                    nan_rows = np.isnan(values).any(axis=1) if work.kind == "f" else np.zeros(len(values), bool)
                    result = np.where(nan_rows, np.argmax(np.isnan(values), axis=1), result)
            else:
                result = fn.reduce(values, axis=1, dtype=work) if values.shape[1] else np.full(
                    values.shape[0], fn.identity if fn.identity is not None else 0, dtype=work)
                if op in ("max", "min") and work.kind == "f" and values.shape[1]:
                    result = np.where(np.isnan(values).any(axis=1), np.nan, result)
            if negate:
                result = -result
            self._store(dst, result.reshape(dst.shape))

        self._run(compute)
        self._elementwise(f"tensor_reduce.{op}", src, (src,), work, writes=(dst,))

    def tensor_copy(self, dst: Tile, src: Tile, engine: str = "vector") -> None:
        """``dst = src`` with a dtype conversion (rounding per :mod:`numerics`); PSUM -> SBUF."""
        self._same_partitions(dst, src)
        if dst.shape != src.shape:
            raise TileShapeError(f"{self.name}: tensor_copy of {src.shape} into {dst.shape}")
        work = nx.compute_dtype(src.dtype)
        boolean = src.dtype.kind == "b"
        self._run(lambda: self._store(dst, src.data if boolean else src.data.astype(work, copy=False)))
        if engine == "scalar":
            self._schedule("tensor_copy", "scalar", cost.scalar_seconds(self.spec, src.free_size),
                           (src,), (dst,))
        else:
            self._elementwise("tensor_copy", dst, (src,), work, engine=engine)

    def select(self, dst: Tile, mask: Tile, on_true: Tile | float, on_false: Tile | float) -> None:
        """``dst = mask ? on_true : on_false`` (VectorE); scalars or [P, 1] tiles broadcast."""
        self._same_partitions(dst, mask)
        operands = [mask] + [t for t in (on_true, on_false) if isinstance(t, Tile)]
        work = nx.compute_dtype(*(t.dtype for t in operands[1:])) if len(operands) > 1 else np.dtype(np.float32)
        if dst.dtype.kind in "iub" and all(not isinstance(t, Tile) or t.dtype.kind in "iub" for t in (on_true, on_false)):
            work = np.dtype(np.int64)

        def compute() -> None:
            pick = [t.data.astype(work) if isinstance(t, Tile) else np.asarray(nx.element(t, dst.dtype)).astype(work)
                    for t in (on_true, on_false)]
            self._store(dst, np.where(mask.data.astype(bool), pick[0], pick[1]))

        self._run(compute)
        self._elementwise("select", dst, tuple(operands), work)

    def iota(self, dst: Tile, base: int = 0, partition_step: int = 0, free_step: int = 1) -> None:
        """``dst[p, f] = base + p * partition_step + f * free_step`` (GpSimd)."""
        p = np.arange(dst.partitions, dtype=np.int64).reshape((-1,) + (1,) * (dst.data.ndim - 1))
        f = np.arange(dst.free_size, dtype=np.int64).reshape((1,) + dst.shape[1:])
        self._run(lambda: self._store(dst, base + p * partition_step + f * free_step))
        self._schedule("iota", "gpsimd", cost.gpsimd_seconds(self.spec, dst.free_size), (), (dst,))

    def philox(self, words: Sequence[Tile], draw: RandomDraw, shape: tuple[int, ...], first: int) -> None:
        """The device stream's random words on GpSimd (:mod:`accelkit.sdk.random_stream`):
        element ``(p, f)`` of the ``[P, F]`` uint32 tiles ``words`` (one to four of them: words 0,
        1, ...) gets the words of element ``first + p * F + f`` of a random result of ``shape``
        drawn at ``draw``: Philox4x32-10 of its counter under the draw's seed.

        Counter-based generation is a custom operator on GpSimd's 32-bit integer lanes (the
        engines' own ``rng`` is a sequential XORWOW with no counter to address an element by):
        each element costs :data:`cost.PHILOX_LANE_OPERATIONS` lane operations (ten rounds of two
        32x32->64 multiplies, key additions and exclusive ors)."""
        if not 1 <= len(words) <= 4 or any(w.dtype != np.uint32 for w in words):
            raise NeuronDtypeError(f"{self.name}: philox writes one to four uint32 tiles")
        tile_shape = words[0].shape
        for w in words:
            self._same_partitions(w, words[0])
            if w.shape != tile_shape:
                raise TileShapeError(f"{self.name}: philox tiles of shapes {tile_shape} and {w.shape}")

        def compute() -> None:
            index = np.arange(first, first + math.prod(tile_shape), dtype=np.uint64).reshape(tile_shape)
            drawn = random_stream.philox4x32(random_stream.counters_at(draw, shape, index, np), draw.seed, np)
            for tile, values in zip(words, drawn):
                tile.data[...] = values

        self._run(compute)
        seconds = cost.gpsimd_seconds(self.spec, words[0].free_size, inputs=cost.PHILOX_LANE_OPERATIONS)
        self._schedule("philox", "gpsimd", seconds, (), tuple(words))

    def memset(self, dst: Tile, value: float) -> None:
        """``dst = value``, the number converted to ``dst``'s type as PyTorch converts it."""
        work = nx.compute_dtype(dst.dtype)
        element = nx.element(value, dst.dtype)
        self._run(lambda: self._store(dst, np.full(dst.shape, element)))
        self._elementwise("memset", dst, (), work)

    def partition_reduce(self, dst: Tile, src: Tile, op: str) -> None:
        """Reduce across partitions: ``dst[0, f] = reduce(src[:, f])`` (GpSimd, which reaches
        every partition; a sum is cheaper as a matmul with a ones vector on the Tensor engine)."""
        fn = _lookup(REDUCE_OPS, op, "reduction")
        if dst.partitions != 1 or dst.free_size != src.free_size:
            raise TileShapeError(f"{self.name}: partition_reduce of {src.shape} into {dst.shape}")
        work = nx.compute_dtype(src.dtype)

        def compute() -> None:
            values = fn.reduce(src.data.astype(work, copy=False), axis=0, keepdims=True)
            if op in ("max", "min") and work.kind == "f":
                values = np.where(np.isnan(src.data.astype(work)).any(axis=0, keepdims=True), np.nan, values)
            self._store(dst, values)

        self._run(compute)
        seconds = cost.gpsimd_seconds(self.spec, src.free_size, inputs=src.partitions // 16 + 1)
        self._schedule(f"partition_reduce.{op}", "gpsimd", seconds, (src,), (dst,))

    # -- helpers ---------------------------------------------------------------------------

    def _store(self, dst: Tile, values: np.ndarray) -> None:
        if dst.checked and np.asarray(values).dtype.kind in "iu":
            check_int32(np.asarray(values), self.name)
        if getattr(values, "shape", None) != dst.shape:
            values = np.broadcast_to(values, dst.shape)
        dst.data[...] = nx.round_to(values, dst.dtype)

    def _elementwise(self, name: str, dst: Tile, inputs: tuple, work: np.dtype, engine: str | None = None,
                     writes: tuple | None = None) -> None:
        if engine is None:
            # Exact integer arithmetic runs on GpSimd's 32-bit integer lanes; the Vector engine's
            # ALUs convert to fp32 (N-ndt), which would round integers above 2**24.
            engine = "gpsimd" if work.kind in "iu" else "vector"
        free = dst.free_size
        if engine == "gpsimd":
            seconds = cost.gpsimd_seconds(self.spec, free, len(inputs))
        else:
            sixteen = all(t.dtype.itemsize <= 2 for t in (dst, *inputs))
            seconds = cost.vector_seconds(self.spec, free, len(inputs), sixteen)
        self._schedule(name, engine, seconds, inputs, writes if writes is not None else (dst,),
                       f"[{dst.partitions}, {free}]")

    def _need(self, tile: Tile, memory: OnChipMemory, role: str) -> None:
        if not isinstance(tile, Tile) or tile.memory is not memory:
            raise NeuronKernelError(f"{self.name}: the {role} must be a {memory.name} tile")

    def _same_partitions(self, dst: Tile, *tiles: Tile) -> None:
        for tile in tiles:
            if tile.partitions != dst.partitions:
                raise TileShapeError(
                    f"{self.name}: {tile.name} spans {tile.partitions} partitions, {dst.name} "
                    f"{dst.partitions}; engines do not move data across partitions"
                )

    @staticmethod
    def _per_partition(value: float | Tile, ndim: int) -> Any:
        if isinstance(value, Tile):
            return fp32(value.data).reshape((value.partitions,) + (1,) * (ndim - 1))
        return np.float32(value)


class TilePool:
    """See :meth:`Kernel.pool`. Tiles of one pool must not be used after ``bufs`` newer ones."""

    def __init__(self, kernel: Kernel, bufs: int, memory: str):
        if bufs < 1:
            raise ValueError("a tile pool needs at least one buffer")
        self._kernel = kernel
        self._bufs = bufs
        self._memory = kernel.core.sbuf if memory == "sbuf" else kernel.core.psum
        self._live: list[Tile] = []

    def release(self) -> None:
        """Free every tile of the pool (reuse of their memory waits for their last use)."""
        self._kernel.free(*self._live)
        self._live.clear()

    def tile(self, shape: tuple[int, ...], dtype: Any, name: str = "t") -> Tile:
        at = None
        if len(self._live) >= self._bufs:  # the oldest buffer's memory, once its last use is over
            oldest = self._live.pop(0)
            at = oldest.base.offset
            self._kernel.free(oldest)
        tile = self._kernel._allocate(self._memory, shape, dtype, name, at)
        self._live.append(tile)
        return tile


def _lookup(table: dict, name: str, what: str) -> Any:
    try:
        return table[name]
    except KeyError:
        raise NeuronKernelError(f"unknown {what} {name!r}; known: {', '.join(sorted(table))}") from None


#: How many of a DMA queue's or an engine's latest busy intervals new work may slot in between
#: (the scheduler's window).
_GAP_LOOKBACK = 32


def _earliest_gap(intervals: list[tuple[float, float]], ready: float, duration: float) -> float:
    """The earliest start >= ``ready`` where ``duration`` fits between a queue's (or an
    engine's) busy intervals."""
    if not intervals or ready >= intervals[-1][1]:
        return ready  # the common case: the queue is idle by then
    start = ready
    first = max(0, len(intervals) - _GAP_LOOKBACK)
    if first:
        start = max(start, intervals[first - 1][1])
    for begin, end in intervals[first:]:
        if start + duration <= begin:
            return start
        start = max(start, end)
    return start


def _occupy(intervals: list[tuple[float, float]], begin: float, end: float) -> None:
    bisect.insort(intervals, (begin, end))


#: HBM writes are filed by the address buckets they touch, so a read scans only the writes near it.
_HBM_BUCKET_BITS = 20


def _hbm_buckets(low: int, high: int) -> range:
    """The buckets of the byte range ``[low, high)``. Writes are found by address, not by the
    array object: views of one buffer made by ``as_strided`` share no owner object, and a read
    through one must still wait for a write through another."""
    return range(low >> _HBM_BUCKET_BITS, ((max(high, low + 1) - 1) >> _HBM_BUCKET_BITS) + 1)


def contiguous_run_bytes(array: np.ndarray) -> int:
    """Bytes a DMA reads contiguously per descriptor: the innermost dims that are dense.

    Broadcast dims (stride 0) are re-reads of the same bytes and do not break a run.
    """
    run = array.dtype.itemsize
    for size, stride in zip(reversed(array.shape), reversed(array.strides)):
        if size == 1 or stride == 0:
            continue
        if stride != run:
            break
        run *= size
    return run
