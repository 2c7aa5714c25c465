"""The simulated NeuronCore on its own: calibration against public figures, rules, numerics.

Calibration (issue #4): in the model, a large bf16 matmul reaches at least 85 % of the
target's Tensor-engine peak; fp32 is about 4x slower than bf16 (N-arch2: "FP32 ≈ 4x the cost");
a large elementwise add is bound by HBM bandwidth, within ±20 % of bytes / bandwidth. These use
the tile programs the backend runs (``matmul_2d``, ``map_flat``) on a core of each generation,
without going through PyTorch, so every target is checked in one process.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from accelkit_backends.neuron.device import TARGETS, core_spec, device_model
from accelkit_backends.neuron.tiling import map_flat
from accelkit_backends.neuron.kernels import matmul as matmul_module
from accelkit_backends.neuron.kernels.matmul import _bias_epilogue, matmul_2d
from accelkit_backends.neuron.sim import (
    NeuronCore,
    NeuronDtypeError,
    PsumOverflowError,
    SbufOverflowError,
    TileShapeError,
)
from accelkit_backends.neuron.sim import cost as sim_cost
from accelkit_backends.neuron.sim import numerics as nx

BF16 = np.dtype(ml_dtypes.bfloat16)


def _run_matmul(target: str, n: int, dtype, k_major_lhs: bool):
    rng = np.random.default_rng(0)
    lhs = rng.standard_normal((n, n)).astype(dtype)
    if k_major_lhs:
        lhs = np.ascontiguousarray(lhs.T).T  # stored transposed, as x.t() views are
    rhs = rng.standard_normal((n, n)).astype(dtype)
    out = np.empty((n, n), dtype)
    core = NeuronCore(core_spec(target))
    with core.kernel("mm") as k:
        matmul_2d(k, lhs, rhs, out)
    return k.finish(), lhs, rhs, out


@pytest.mark.parametrize("target", TARGETS)
def test_large_bf16_matmul_reaches_85_percent_of_tensor_engine_peak(target):
    # NeuronCore-v2 has no DMA transpose; its kernels take the left operand K-major (lhsT),
    # as NKI's matmul examples do. v3 and v4 transpose a row-major operand while loading it.
    k_major = not core_spec(target).transpose_in_dma
    record, *_ = _run_matmul(target, 2048, BF16, k_major_lhs=k_major)
    achieved = record.flops / record.latency
    peak = device_model(target).peak_flops[torch.bfloat16]
    assert record.flops == 2 * 2048**3
    assert achieved >= 0.85 * peak, f"{target}: {achieved / peak:.1%} of peak"
    assert achieved <= peak


def test_fp32_matmul_is_about_four_times_slower_than_bf16():
    bf16, *_ = _run_matmul("trn2", 2048, BF16, k_major_lhs=False)
    fp32, *_ = _run_matmul("trn2", 2048, np.float32, k_major_lhs=False)
    ratio = fp32.latency / bf16.latency
    assert 3.0 <= ratio <= 4.5, ratio


def test_matmul_accumulates_bf16_products_in_fp32():
    _, lhs, rhs, out = _run_matmul("trn2", 192, BF16, k_major_lhs=False)
    exact = lhs.astype(np.float32) @ rhs.astype(np.float32)
    np.testing.assert_allclose(out.astype(np.float32), exact.astype(BF16).astype(np.float32), rtol=1e-2, atol=1e-2)
    # fp32 accumulation: rounding only at the end, so at most one bf16 ulp from the exact result
    ulp = np.abs(exact) * 2.0**-7 + 1e-30
    assert (np.abs(out.astype(np.float32) - exact) <= ulp).mean() > 0.99


def test_an_addmm_block_leaves_psum_in_one_instruction_that_adds_the_bias_and_rounds():
    """The epilogue reads the accumulator in PSUM and writes the bf16 result: one Vector-engine
    instruction per block, with the values of fp32 arithmetic rounded once."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(s).astype(BF16) for s in ((128, 128), (128, 512)))  # one K tile
    bias = rng.standard_normal(512).astype(BF16)
    out = np.empty((128, 512), BF16)
    core = NeuronCore(core_spec("trn2"))
    core.record_instructions = True
    with core.kernel("addmm") as k:
        matmul_2d(k, a, b, out, _bias_epilogue(bias, out.shape, 1, 1))
    k.finish()
    assert [i.name for i in k.log if i.engine == "vector"] == ["tensor_tensor.add"]
    product = nx.round_to(a.astype(np.float32) @ b.astype(np.float32), np.float32)
    np.testing.assert_array_equal(out, nx.round_to(product + bias.astype(np.float32), BF16))


def _matmul_durations(target: str, count: int) -> list[tuple[float, float]]:
    """(start, duration) of ``count`` back-to-back 128x128x512 bf16 matmuls on a cold engine."""
    core = NeuronCore(core_spec(target))
    core.record_instructions = True
    with core.kernel("matmuls") as k:
        stationary, moving = k.sbuf((128, 128), BF16, "s"), k.sbuf((128, 512), BF16, "m")
        acc = k.psum((128, 512), np.float32, "acc")
        for i in range(count):
            k.matmul(acc, stationary, moving, accumulate=i > 0)
    k.finish()
    return [(i.start - k.start, i.end - i.start) for i in k.log if i.name == "matmul"]


@pytest.mark.parametrize("target", TARGETS)
def test_the_tensor_engine_warms_up_from_half_speed_where_the_generation_does(target):
    """trn2 and trn3: TensorE starts at about 50% after idling and is at full speed about 3 us
    into its busy period (published); trn1 has no such figure."""
    spec = core_spec(target)
    durations = _matmul_durations(target, 80)
    cold = sim_cost.matmul_seconds(spec, 512, 128, torch.bfloat16, engine_was_idle=True)
    full = sim_cost.matmul_seconds(spec, 512, 128, torch.bfloat16, engine_was_idle=False)
    first, later = durations[0][1], durations[1:]
    assert bool(spec.tensor_warmup_s) == (target != "trn1")
    if not spec.tensor_warmup_s:
        assert first == pytest.approx(cold, rel=1e-9)
        assert all(d == pytest.approx(full, rel=1e-9) for _, d in later)
        return
    assert first == pytest.approx(2 * cold, rel=1e-9)  # half speed
    warm = [d for start, d in later if start >= spec.tensor_warmup_s]
    assert warm and all(d == pytest.approx(full, rel=1e-9) for d in warm)
    warming = [d for start, d in later if start < spec.tensor_warmup_s]
    assert warming and all(full < d < 2 * full for d in warming)
    assert warming == sorted(warming, reverse=True)  # faster and faster


@pytest.mark.parametrize("target", TARGETS)
def test_an_indirect_dma_pays_the_hardware_dge_latency_where_the_core_has_one(target):
    spec = core_spec(target)
    core = NeuronCore(spec)
    core.record_instructions = True
    table = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    with core.kernel("gather") as k:
        indices = k.sbuf((128, 1), np.int32, "idx")
        k.iota(indices, partition_step=0)
        rows = k.sbuf((128, 32), np.float32, "rows")
        k.gather_rows(rows, table, indices)
    k.finish()
    (gather,) = [i for i in k.log if i.name == "dma_gather"]
    # 16 KiB in 128-byte rows over 8 queues (2 KiB each), then the fixed latency.
    fixed = spec.hardware_dge_latency_s if spec.hardware_dge_latency_s is not None else spec.dma_fixed_latency_s
    assert (spec.hardware_dge_latency_s is None) == (target == "trn1")
    busy = max(sim_cost.dma_queue_seconds(spec, 2048, 128), sim_cost.hbm_seconds(spec, 2048) * spec.dma_queues)
    assert gather.end - gather.start == pytest.approx(busy + fixed, rel=1e-9)


def _matmul_after_a_slow_producer(budget: int, monkeypatch) -> float:
    """A program: a slow elementwise kernel writes a matmul's left operand, then the matmul
    multiplies it by a weight in HBM since long. Returns how long the matmul ends after it."""
    monkeypatch.setattr(matmul_module, "MOVING_BUDGET", budget)
    x = np.ones((128, 768), np.float32)
    activations, out = np.empty((128, 768), BF16), np.empty((128, 3072), BF16)
    weight = np.full((768, 3072), 0.5, BF16)
    core = NeuronCore(core_spec("trn2"))
    records = _collecting(core)
    with core.program():
        with core.kernel("producer") as k:
            for _ in range(16):  # longer than the weight takes to load
                map_flat(k, activations, [x], lambda dst, srcs: k.activation(dst, srcs[0], "exp"))
        with core.kernel("matmul") as k:
            matmul_2d(k, activations, weight, out)
    producer, product = records
    return product.end - producer.end


def test_a_weight_that_fits_the_budget_streams_in_while_the_kernels_before_it_run(monkeypatch):
    ahead = _matmul_after_a_slow_producer(matmul_module.MOVING_BUDGET, monkeypatch)
    six_deep = _matmul_after_a_slow_producer(0, monkeypatch)  # only the minimum in flight
    assert ahead < 0.75 * six_deep


@pytest.mark.parametrize("target", TARGETS)
def test_large_add_is_bound_by_hbm_bandwidth(target):
    spec = core_spec(target)
    x = np.ones(1 << 22, np.float32)
    y = np.full(1 << 22, 2.0, np.float32)
    out = np.empty_like(x)
    core = NeuronCore(spec)
    with core.kernel("add") as k:
        map_flat(k, out, [x, y], lambda dst, srcs: k.tensor_tensor(dst, srcs[0], srcs[1], "add"))
    record = k.finish()
    assert (out == 3.0).all()
    ideal = 3 * x.nbytes / spec.hbm_bandwidth
    assert 0.8 * ideal <= record.latency <= 1.2 * ideal, record.latency / ideal
    assert record.hbm_bytes == 3 * x.nbytes


# ---------------------------------------------------------------------------------------------
# Rules: tiles, SBUF, PSUM, matmul limits
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def kernel():
    core = NeuronCore(core_spec("trn1"))
    with core.kernel("test_kernel") as k:
        yield k


def test_tile_over_128_partitions_is_an_error(kernel):
    with pytest.raises(TileShapeError, match="129 partitions.*128"):
        kernel.sbuf((129, 4), np.float32)


def test_sbuf_overflow_names_kernel_and_capacity(kernel):
    per_partition = core_spec("trn1").sbuf_partition_bytes
    kernel.sbuf((128, per_partition // 8), np.float32, "first_half")
    with pytest.raises(SbufOverflowError, match=r"test_kernel: tile big .*SBUF.*196608 B per partition.*first_half"):
        kernel.sbuf((128, per_partition // 4), np.float32, "big")


def test_freed_sbuf_can_be_reused(kernel):
    per_partition = core_spec("trn1").sbuf_partition_bytes
    tile = kernel.sbuf((128, per_partition // 4), np.float32, "all")
    kernel.free(tile)
    kernel.sbuf((128, per_partition // 4), np.float32, "again")


def _load_after_a_freed_tile(kernel, pool: bool) -> tuple[float, float]:
    """A tile is loaded, read by a long Scalar-engine instruction and freed; then a new tile of
    the same size is loaded. Returns when the read ends and when the second load starts."""
    kernel.core.record_instructions = True
    source = np.ones((128, 2048), np.float32)
    tiles = kernel.pool(1) if pool else None
    first = tiles.tile((128, 2048), np.float32, "first") if pool else kernel.sbuf((128, 2048), np.float32, "first")
    kernel.dma(first, source)
    kernel.activation(kernel.sbuf((128, 2048), np.float32, "out"), first, "exp")
    if not pool:
        kernel.free(first)
    second = tiles.tile((128, 2048), np.float32, "second") if pool else kernel.sbuf((128, 2048), np.float32, "second")
    kernel.dma(second, source)
    kernel.finish()
    read_end = next(i.end for i in kernel.log if i.engine == "scalar")
    second_load = [i for i in kernel.log if i.engine == "dma"][1]
    return read_end, second_load.start


def test_a_new_tile_does_not_take_memory_an_instruction_still_reads(kernel):
    """Next-fit, as a compiler assigns buffers: the second load need not wait for the read of
    the tile freed before it (first-fit would give it that memory, and a false dependency)."""
    read_end, second_load = _load_after_a_freed_tile(kernel, pool=False)
    assert second_load < read_end


def test_a_pools_new_tile_takes_its_oldest_buffer_once_its_last_read_is_over(kernel):
    """A pool's buffers are its own: its depth bounds how far its loads run ahead."""
    read_end, second_load = _load_after_a_freed_tile(kernel, pool=True)
    assert second_load >= read_end - 1e-12


def test_next_fit_wraps_around_to_memory_freed_below(kernel):
    per_partition = core_spec("trn1").sbuf_partition_bytes
    low = kernel.sbuf((128, per_partition // 8), np.float32, "low")
    kernel.sbuf((128, per_partition // 8), np.float32, "high")
    kernel.free(low)
    again = kernel.sbuf((128, per_partition // 8), np.float32, "again")  # nothing fits above
    assert again.offset == low.offset


def test_psum_holds_eight_banks(kernel):
    accumulators = [kernel.psum((128, 512), np.float32, f"acc{i}") for i in range(8)]
    assert len(accumulators) == 8
    with pytest.raises(PsumOverflowError, match="8 banks"):
        kernel.psum((128, 512), np.float32, "ninth")


def test_matmul_operand_limits(kernel):
    acc = kernel.psum((128, 512), np.float32)
    stationary = kernel.sbuf((128, 128), BF16)
    too_wide = kernel.sbuf((128, 513), BF16)
    with pytest.raises(TileShapeError, match="moving free size 513"):
        kernel.matmul(kernel.psum((128, 513), np.float32), stationary, too_wide)
    mixed = kernel.sbuf((128, 512), np.float32)
    with pytest.raises(Exception, match="both in fp32"):
        kernel.matmul(acc, stationary, mixed)
    with pytest.raises(Exception, match="PSUM"):
        kernel.matmul(kernel.sbuf((128, 512), np.float32), stationary, kernel.sbuf((128, 512), BF16))


def test_engines_overlap_independent_work(kernel):
    a = kernel.sbuf((128, 2048), np.float32, "a")
    b = kernel.sbuf((128, 2048), np.float32, "b")
    kernel.dma(a, np.ones((128, 2048), np.float32))
    kernel.activation(b, b, "exp")  # independent of the DMA: runs at the same time
    record = kernel.finish()
    assert record.latency < record.busy["dma"] + record.busy["scalar"]
    kernel.tensor_tensor(b, a, b, "add")  # depends on both
    assert kernel.finish().latency >= max(record.busy["dma"], record.busy["scalar"])


def test_int64_values_outside_int32_are_refused_on_load(kernel):
    tile = kernel.sbuf((1, 2), np.int32)
    kernel.dma(tile, np.array([[1, 2**31 - 1]], np.int64))
    assert tile.data.tolist() == [[1, 2**31 - 1]]
    with pytest.raises(NeuronDtypeError, match="2147483648.*int32"):
        kernel.dma(tile, np.array([[1, 2**31]], np.int64))


def test_no_64_bit_tiles(kernel):
    with pytest.raises(NeuronDtypeError, match="64-bit"):
        kernel.sbuf((4, 4), np.float64)


# ---------------------------------------------------------------------------------------------
# Numerics
# ---------------------------------------------------------------------------------------------


def test_round_to_nearest_even_matches_torch_bfloat16():
    values = np.random.default_rng(1).standard_normal(10000).astype(np.float32) * 100
    ours = nx.round_to(values, BF16).astype(np.float32)
    theirs = torch.from_numpy(values).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(ours, theirs)


def test_stochastic_rounding_is_unbiased_and_lands_on_neighbours():
    value = np.float32(1.0 + 2.0**-9)  # a quarter of the way from 1.0 to the next bf16 value
    values = np.full(200_000, value, np.float32)
    with nx.stochastic_rounding():
        rounded = nx.round_to(values, BF16).astype(np.float32)
    assert set(np.unique(rounded)) == {1.0, 1.0 + 2.0**-7}
    assert abs(rounded.mean() - value) < 2e-5
    assert (nx.round_to(values, BF16).astype(np.float32) == 1.0).all()  # nearest-even: biased


def test_vector_engine_computes_in_fp32_and_rounds_on_write(kernel):
    a = kernel.sbuf((1, 3), BF16)
    kernel.dma(a, np.array([[1.0, 256.0, 3.0]], BF16))
    out = kernel.sbuf((1, 3), BF16)
    kernel.tensor_scalar(out, a, "add", 1.0 / 3.0)
    expected = (np.array([1.0, 256.0, 3.0], np.float32) + np.float32(1 / 3)).astype(BF16)
    np.testing.assert_array_equal(out.data[0], expected)


def test_int64_results_outside_int32_raise_while_int32_wraps(kernel):
    wide = kernel.sbuf((1, 1), np.int64)
    kernel.dma(wide, np.array([[2**31 - 1]], np.int64))
    with pytest.raises(NeuronDtypeError, match="2147483648"):
        kernel.tensor_scalar(wide, wide, "add", 1)
    narrow = kernel.sbuf((1, 1), np.int32)
    kernel.dma(narrow, np.array([[2**31 - 1]], np.int32))
    kernel.tensor_scalar(narrow, narrow, "add", 1)
    assert narrow.data[0, 0] == -(2**31)  # two's complement, as torch's int32 arithmetic


def _add_program(k, x, out, passes):
    for _ in range(passes):
        map_flat(k, out, [x], lambda dst, srcs: k.tensor_scalar(dst, srcs[0], "add", 1.0))


def test_a_kernel_instance_is_timed_once_and_its_timing_reused():
    # A compiled kernel instance is static: later runs execute its instructions and reuse the
    # schedule, which must be the one a fresh timing gives.
    x = np.arange(4096, dtype=np.float32).reshape(64, 64)
    core = NeuronCore(core_spec("trn2"))
    records = []
    for _ in range(3):
        out = np.empty_like(x)
        with core.kernel("add", instance="add-64x64") as k:
            _add_program(k, x, out, passes=1)
        records.append(k.finish())
        np.testing.assert_array_equal(out, x + 1)  # the numerics run every time
    fresh_core = NeuronCore(core_spec("trn2"))
    with fresh_core.kernel("add") as fresh:  # no instance: timed as it runs
        _add_program(fresh, x, np.empty_like(x), passes=1)
    want = fresh.finish()
    assert len(core._timings) == 1
    for record in records:
        assert record.latency == pytest.approx(want.latency, rel=1e-12)
        assert record.busy == pytest.approx(want.busy, rel=1e-12)
        assert (record.instructions, record.hbm_bytes) == (want.instructions, want.hbm_bytes)
    assert records[1].start == pytest.approx(records[0].end) and records[2].start == pytest.approx(records[1].end)


def test_an_instance_that_issues_other_instructions_is_timed_afresh():
    # A data-dependent program (more passes under the same instance) must not take the
    # instance's first timing.
    x = np.ones((64, 64), np.float32)
    core = NeuronCore(core_spec("trn2"))
    with core.kernel("add", instance="add") as k:
        _add_program(k, x, np.empty_like(x), passes=1)
    once = k.finish()
    with core.kernel("add", instance="add") as k:
        _add_program(k, x, np.empty_like(x), passes=3)
    thrice = k.finish()
    assert thrice.instructions == 3 * once.instructions and thrice.hbm_bytes == 3 * once.hbm_bytes
    assert thrice.busy["vector"] == pytest.approx(3 * once.busy["vector"]) and thrice.latency > once.latency


def _collecting(core):
    records = []
    core.listeners.append(lambda record, _instructions: records.append(record))
    return records


def _two_independent_adds_then_one_on_both(core, x, y):
    a, b, c = np.empty_like(x), np.empty_like(y), np.empty_like(x)
    with core.kernel("add_x") as k:
        _add_program(k, x, a, passes=1)
    with core.kernel("add_y") as k:
        _add_program(k, y, b, passes=1)
    with core.kernel("sum") as k:
        map_flat(k, c, [a, b], lambda dst, srcs: k.tensor_tensor(dst, srcs[0], srcs[1], "add"))
    return c


def test_kernels_of_a_program_overlap_where_their_data_allows_and_device_time_counts_it_once():
    x, y = np.ones((64, 64), np.float32), np.full((64, 64), 2.0, np.float32)
    eager_core, program_core = NeuronCore(core_spec("trn2")), NeuronCore(core_spec("trn2"))
    eager, in_program = _collecting(eager_core), _collecting(program_core)
    _two_independent_adds_then_one_on_both(eager_core, x, y)
    with program_core.program():
        got = _two_independent_adds_then_one_on_both(program_core, x, y)
    np.testing.assert_array_equal(got, x + y + 2)
    add_x, add_y, total = in_program
    assert add_y.start < add_x.end  # the second add does not wait for the first
    assert total.start >= min(add_x.end, add_y.end) - 1e-12  # the sum waits for its inputs' stores
    device = sum(r.device_seconds for r in in_program)
    assert device == pytest.approx(max(r.end for r in in_program) - min(r.start for r in in_program))
    assert device < sum(r.device_seconds for r in eager)  # eagerly each kernel waits for the last
    assert program_core.clock == pytest.approx(max(r.end for r in in_program))


def test_in_a_program_an_engine_runs_a_later_kernels_ready_work_in_its_idle_gap():
    """The compiler interleaves independent ops' instruction streams on each engine: a later
    kernel's Vector work that is ready runs while an earlier kernel's waits for its load. Within
    one kernel an engine keeps the kernel's order."""
    big = np.ones((128, 8192), np.float32)
    core = NeuronCore(core_spec("trn2"))
    core.record_instructions = True
    logs = {}
    core.listeners.append(lambda record, log: logs.setdefault(record.name, list(log)))
    with core.program():
        with core.kernel("waits for a load") as k:
            tile = k.sbuf(big.shape, np.float32, "big")
            k.dma(tile, big)
            k.tensor_scalar(tile, tile, "add", 1.0)
        with core.kernel("ready at once") as k:
            small = k.sbuf((128, 64), np.float32, "small")
            k.memset(small, 0.0)
            k.tensor_scalar(small, small, "add", 1.0)
    waiting = next(i for i in logs["waits for a load"] if i.engine == "vector")
    ready = [i for i in logs["ready at once"] if i.engine == "vector"]
    assert ready[-1].end <= waiting.start
    assert ready[0].end <= ready[1].start  # its own instructions in order


def test_a_kernel_reading_memory_through_another_view_waits_for_its_write():
    """Writes are found by address: ``as_strided`` views of one buffer share no owner object,
    and the runtime reads device memory through them."""
    x = np.ones((64, 64), np.float32)
    buffer = np.empty(64 * 64, np.float32)
    written = np.lib.stride_tricks.as_strided(buffer, (64, 64), (256, 4))
    read_back = np.lib.stride_tricks.as_strided(buffer, (64, 64), (256, 4))
    out = np.empty_like(x)
    core = NeuronCore(core_spec("trn2"))
    records = _collecting(core)
    with core.program():
        with core.kernel("write") as k:
            _add_program(k, x, written, passes=1)
        with core.kernel("read") as k:
            _add_program(k, read_back, out, passes=1)
    np.testing.assert_array_equal(out, x + 2)
    write, read = records
    assert read.start >= write.end - 1e-12  # its load waited for the store


def test_a_program_instance_is_timed_once_and_later_runs_reuse_that_schedule():
    x, y = np.ones((64, 64), np.float32), np.full((64, 64), 2.0, np.float32)
    core, fresh = NeuronCore(core_spec("trn2")), NeuronCore(core_spec("trn2"))
    runs = _collecting(core)
    for _ in range(3):
        with core.program("graph"):
            np.testing.assert_array_equal(_two_independent_adds_then_one_on_both(core, x, y), x + y + 2)
    fresh.record_instructions = True  # profiled: every instruction timed as it runs
    want = _collecting(fresh)
    with fresh.program("graph"):
        _two_independent_adds_then_one_on_both(fresh, x, y)
    assert len(core._program_timings) == 1
    for run in range(3):
        for got, expected in zip(runs[3 * run: 3 * run + 3], want):
            assert got.latency == pytest.approx(expected.latency, rel=1e-12)
            assert got.device_seconds == pytest.approx(expected.device_seconds, rel=1e-12)
            assert got.busy == pytest.approx(expected.busy, rel=1e-12)


def test_independent_kernels_of_a_program_take_disjoint_memory_and_run_side_by_side():
    x = np.ones((64, 64), np.float32)
    core = NeuronCore(core_spec("trn2"))
    records = _collecting(core)
    with core.kernel("alone") as k:
        _add_program(k, x, np.empty_like(x), passes=1)
    with core.program():
        for i in range(4):
            with core.kernel(f"add{i}") as k:
                _add_program(k, x, np.empty_like(x), passes=1)
    alone, together = records[0].latency, sum(r.device_seconds for r in records[1:])
    assert together < 1.5 * alone  # eagerly four adds take four times one


def test_a_kernel_that_does_not_fit_above_the_last_one_reuses_its_memory_after_it():
    spec = core_spec("trn2")
    columns = int(spec.sbuf_partition_bytes * 0.6) // 4  # each kernel fills 60 % of SBUF
    x = np.ones((128, columns), np.float32)
    core = NeuronCore(spec)
    records = _collecting(core)
    outs = [np.empty_like(x), np.empty_like(x)]
    with core.program():
        for out in outs:
            with core.kernel("big") as k:
                tile = k.sbuf(x.shape, np.float32, "big")
                k.dma(tile, x)
                k.tensor_scalar(tile, tile, "add", 1.0)
                k.dma(out, tile)
    for out in outs:
        np.testing.assert_array_equal(out, x + 1)
    first, second = records
    assert second.start >= first.end - 1e-12  # its memory was the first kernel's: it waits
