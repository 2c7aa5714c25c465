"""Instruction costs on a NeuronCore, from AWS's published figures (hardware-facts.md §3.4).

Every function returns seconds of busy time on one engine (or DMA queue) for one instruction.
These are estimates from public specifications, not measurements of a Trainium chip.

- TensorE ``MultiplyMoving``: ``max(N, 64)`` cycles for a moving free size ``N`` (one 128-element
  column per cycle, ``MM_INIT_LATENCY`` 64), ×4 for fp32, faster for fp8 where the generation has
  a double-row mode (N-arch2, N-arch3, N-perf). ``LoadStationary`` is up to 4× faster than an MM
  of the same free size and runs in the background of the previous MM, so it is only paid when
  the engine was idle (N-arch2, N-perf).
- VectorE: about ``N`` cycles per input for a free size ``N`` at 128 elements per cycle; later
  generations process 2–4 elements per partition per cycle; cost does not depend on the number of
  partitions used (N-arch2, N-arch3).
- ScalarE, GpSimd: one input; ``N`` cycles at 128 elements per cycle (N-arch2).
- Every engine instruction pays ~60 cycles to start its SBUF/PSUM access (N-arch2, N-perf).
- DMA: a queue moves ``dma_queue_rate`` bytes per second; each transfer has ~1.3 µs of fixed
  latency that overlaps other transfers; short contiguous runs waste bandwidth (below 512 B the
  rate falls proportionally, N-dma); total HBM traffic is bounded by the core's HBM bandwidth.
"""

from __future__ import annotations

import math

import torch

from accelkit_backends.neuron.device import CoreSpec

ACCESS_OVERHEAD_CYCLES = 60
#: GpSimd lane operations per element of Philox4x32-10 (the device stream, ``isa.philox``): each
#: of ten rounds takes two 32x32->64 multiplies as high and low halves (4), two key additions
#: and four exclusive ors, about 10 operations; plus the element's counter (an estimate: no
#: published figure exists for this operator).
PHILOX_LANE_OPERATIONS = 104
MM_INIT_LATENCY_CYCLES = 64
#: A 128-column LoadStationary takes about 32 cycles (N-arch2): a quarter cycle per column.
LOAD_STATIONARY_CYCLES_PER_COLUMN = 0.25
#: Below this contiguous run length a DMA descriptor cannot keep its queue busy (N-dma).
DMA_EFFICIENT_RUN_BYTES = 512
#: The smallest transfer worth a queue of its own (N-dma: >= 2 KiB per partition minimum).
DMA_MIN_TRANSFER_BYTES = 2048
#: DMA transpose HBM->SBUF reaches about 90 % of a copy's throughput (N-arch3).
DMA_TRANSPOSE_EFFICIENCY = 0.9


def matmul_seconds(core: CoreSpec, moving_free: int, stationary_free: int, dtype: torch.dtype,
                   engine_was_idle: bool) -> float:
    cycles = max(moving_free, MM_INIT_LATENCY_CYCLES) * core.cycle_factor(dtype)
    if engine_was_idle:
        cycles += stationary_free * LOAD_STATIONARY_CYCLES_PER_COLUMN * core.cycle_factor(dtype)
    return cycles / core.tensor_clock


def vector_seconds(core: CoreSpec, free_size: int, inputs: int, sixteen_bit: bool) -> float:
    rate = core.vector_elements_per_cycle_16bit if sixteen_bit else core.vector_elements_per_cycle
    per_partition = rate / core.partitions
    cycles = ACCESS_OVERHEAD_CYCLES + math.ceil(free_size * max(inputs, 1) / per_partition)
    return cycles / core.vector_clock


def scalar_seconds(core: CoreSpec, free_size: int) -> float:
    per_partition = core.scalar_elements_per_cycle / core.partitions
    return (ACCESS_OVERHEAD_CYCLES + math.ceil(free_size / per_partition)) / core.scalar_clock


def gpsimd_seconds(core: CoreSpec, free_size: int, inputs: int = 1) -> float:
    per_partition = core.gpsimd_elements_per_cycle / core.partitions
    return (ACCESS_OVERHEAD_CYCLES + math.ceil(free_size * max(inputs, 1) / per_partition)) / core.gpsimd_clock


def dma_queue_seconds(core: CoreSpec, nbytes: int, run_bytes: int, transpose: bool = False) -> float:
    """Time a DMA queue is busy moving ``nbytes`` in contiguous runs of ``run_bytes``."""
    efficiency = min(1.0, max(run_bytes, 1) / DMA_EFFICIENT_RUN_BYTES)
    if transpose:
        efficiency *= DMA_TRANSPOSE_EFFICIENCY
    return nbytes / (core.dma_queue_rate * efficiency)


def hbm_seconds(core: CoreSpec, nbytes: int) -> float:
    return nbytes / core.hbm_bandwidth
