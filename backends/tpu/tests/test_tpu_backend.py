"""The tpu backend as a device: generations as data, capacity, dtype policy, modes, custom ops, stats."""

from __future__ import annotations

import contextlib
import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from conftest import host_peak_growth, run_python

import accelkit
from accelkit import _runtime
from accelkit_backends.tpu import device as tpu_device
from accelkit_backends.tpu import execution_mode, register_jax_kernel
from accelkit_backends.tpu.modes import TpuExecutionError

GiB = 1 << 30


# -- device model ---------------------------------------------------------------------------


@pytest.mark.parametrize("target", tpu_device.TARGETS)
def test_every_generation_has_sourced_capacity_bandwidth_and_bf16_peak(target):
    model = tpu_device.device_model(target)
    assert model.memory_bytes > 8 * GiB
    assert model.memory_bandwidth > 500e9
    assert model.peak_flops[torch.bfloat16] > 100e12
    for figure in ("memory_bytes", "memory_bandwidth", "peak_flops"):
        assert model.sources[figure], f"{target}: {figure} has no source"
    assert torch.float64 not in model.dtypes


def test_generations_follow_the_published_ordering():
    peak = {t: tpu_device.device_model(t).peak_flops[torch.bfloat16] for t in tpu_device.TARGETS}
    assert peak["v5e"] < peak["v4"] < peak["v5p"] < peak["v6e"]
    assert tpu_device.device_model("v5p").memory_bytes > tpu_device.device_model("v4").memory_bytes


@pytest.mark.parametrize("target", tpu_device.TARGETS)
def test_each_generation_is_named_as_jax_names_a_device_of_it(target):
    from jax._src.pallas.mosaic import tpu_info

    product = tpu_device.device_model(target).product
    version = tpu_info.chip_version_from_device_kind(product)
    assert version is not None and version.name == f"TPU_{target.upper()}", (product, version)


def test_properties_name_the_chosen_generation_with_its_peak_flops():
    result = run_python("""
        import accelkit, torch
        accelkit.select_device("tpu")
        props = torch.tpu.get_device_properties()
        print(props.name, "|", torch.tpu.get_device_name(), "|", props.peak_flops["bfloat16"])
    """, env={tpu_device.TARGET_ENV: "v6e"})
    assert result.returncode == 0, result.stderr
    model = tpu_device.device_model("v6e")
    name, described, peak = result.stdout.strip().split(" | ")
    assert name == model.product == "TPU v6e"
    assert described == "TPU v6e (simulated tpu)"
    assert float(peak) == model.peak_flops[torch.bfloat16]


def test_the_default_target_is_v5e_and_properties_say_simulated(dev):
    props = torch.tpu.get_device_properties()
    assert props.target == tpu_device.DEFAULT_TARGET == "v5e"
    assert props.simulated and "simulated" in torch.tpu.get_device_name()
    assert props.total_memory == tpu_device.device_model("v5e").memory_bytes


def test_an_unknown_target_is_reported_by_the_probe(monkeypatch):
    monkeypatch.setenv(tpu_device.TARGET_ENV, "v9z")
    probe = tpu_device.probe()
    assert not probe.available
    assert "v9z" in probe.reason and "v5e" in probe.reason


def test_a_target_is_chosen_by_environment(monkeypatch):
    monkeypatch.setenv(tpu_device.TARGET_ENV, "v6e")
    assert tpu_device.target_name() == "v6e"
    assert tpu_device.device_model().name == "v6e"


# -- memory ---------------------------------------------------------------------------------


def test_an_allocation_beyond_the_targets_hbm_raises_out_of_memory_naming_it(dev):
    before = torch.tpu.memory_allocated()
    capacity = torch.tpu.get_device_properties().total_memory
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(capacity // 4 + 1024, dtype=torch.float32, device=dev)
    message = str(info.value)
    assert "tpu:0" in message and "14.90 GiB" in message  # v5e: 16 GB
    assert torch.tpu.memory_allocated() == before


def test_a_result_the_device_cannot_hold_is_refused_before_it_is_computed(dev):
    capacity = torch.tpu.get_device_properties().total_memory
    big = torch.zeros(1, device=dev).expand(capacity // 4 + 1)  # a view: 4 bytes held
    held = torch.tpu.memory_allocated()
    with host_peak_growth(2**30):  # computing it first would fill the host with capacity + 4 bytes
        with pytest.raises(torch.OutOfMemoryError, match="tpu:0"):
            big * 2
    assert torch.tpu.memory_allocated() == held
    del big
    gc.collect()  # the error's traceback holds ``big``: later tests count memory from zero


def test_memory_counts_live_tensors(dev):
    before = torch.tpu.memory_allocated()
    x = torch.ones(1024, 1024, device=dev)
    assert torch.tpu.memory_allocated() >= before + x.numel() * 4
    del x
    assert torch.tpu.memory_allocated() == before


# -- dtype policy ---------------------------------------------------------------------------


def test_float64_is_refused_with_the_reason_and_both_ways_out(dev):
    with pytest.raises(accelkit.sdk.UnsupportedDtypeError) as info:
        torch.ones(3, dtype=torch.float64).to(dev)
    message = str(info.value)
    assert "float64" in message and "tpu:0" in message
    assert "float32" in message and "ACCELKIT_TPU_FLOAT64=emulate" in message


@pytest.mark.parametrize(("dtype", "way_out"), [
    (torch.complex32, "complex64"),
    (torch.float8_e4m3fnuz, "float8_e4m3fn"),
    (torch.uint4, "uint8"),
])
def test_a_dtype_xla_lacks_is_refused_naming_the_nearest_one_it_has(dev, dtype, way_out):
    with pytest.warns(UserWarning) if dtype == torch.complex32 else contextlib.nullcontext():
        source = torch.zeros(2, dtype=torch.uint8).view(dtype) if dtype.itemsize == 1 else torch.zeros(2, dtype=dtype)
    before = torch.tpu.memory_allocated()
    with pytest.raises(accelkit.sdk.UnsupportedDtypeError) as info:
        source.to(dev)
    assert info.value.dtype == dtype
    assert f"XLA has no {str(dtype).removeprefix('torch.')} type" in str(info.value)
    assert way_out in str(info.value)
    assert torch.tpu.memory_allocated() == before


def test_float64_runs_exactly_when_emulation_is_chosen():
    from conftest import run_python

    done = run_python(
        """
        import torch, accelkit
        dev = accelkit.select_device("tpu")
        x = torch.tensor([1e-300, 3.0], dtype=torch.float64)
        y = (x.to(dev) * 2).cpu()
        assert y.dtype == torch.float64 and torch.equal(y, x * 2), y
        print("ok")
        """,
        env={"ACCELKIT_TPU_FLOAT64": "emulate"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_fast_compiles_change_floating_point_results_by_rounding_only(tmp_path):
    # ACCELKIT_FAST_COMPILE=1 (the conformance quick profile's) compiles without LLVM's
    # optimisations and with XLA's older fusion emitters. The HLO is the same; where the
    # optimised code fuses a multiply-add or vectorises rsqrt or tanh, a float differs by
    # rounding (1-2 ulp), which a formula such as gelu's 1 + tanh(...) can magnify relative to
    # a small result, as between two CPUs. Integers, dtypes and shapes never differ.
    from conftest import run_python

    code = """
        import os, sys, torch, accelkit
        dev = accelkit.select_device("tpu")
        g = torch.Generator().manual_seed(0)
        x, w = torch.randn(64, 96, generator=g), torch.randn(96, 48, generator=g)
        xd, wd = x.to(dev).requires_grad_(), w.to(dev).requires_grad_()
        y = torch.nn.functional.gelu(xd @ wd).softmax(-1)
        (y * torch.arange(48.0, device=dev)).sum().backward()
        z = x.to(dev)
        composite = [y.detach(), xd.grad, wd.grad]
        floats = [torch.rsqrt(z.abs() + 0.1), torch.tanh(z), torch.log1p(z.abs()),
                  torch.nn.functional.gelu(z, approximate="tanh"), torch.exp(z), z @ z.T]
        n = torch.randint(-1000, 1000, (64, 96), generator=g).to(dev)
        ints = [n * 7 // 3, n.cumsum(1), (n > 5).sum(0), n.sort(1).indices]
        torch.save({"floats": [t.cpu() for t in floats], "ints": [t.cpu() for t in ints],
                    "composite": [t.cpu() for t in composite],
                    "flags": os.environ.get("XLA_FLAGS", "")}, sys.argv[-1])
        """
    runs = {}
    for fast in ("0", "1"):
        out = tmp_path / f"{fast}.pt"
        done = run_python(code.replace("sys.argv[-1]", repr(str(out))), env={"ACCELKIT_FAST_COMPILE": fast})
        assert done.returncode == 0, done.stderr
        runs[fast] = torch.load(out)
    assert "xla_backend_optimization_level" not in runs["0"]["flags"]
    assert "--xla_backend_optimization_level=0" in runs["1"]["flags"]
    assert "--xla_cpu_use_fusion_emitters=false" in runs["1"]["flags"]
    for optimised, fast in zip(runs["0"]["ints"], runs["1"]["ints"]):
        assert torch.equal(optimised, fast)
    for optimised, fast in zip(runs["0"]["floats"] + runs["0"]["composite"], runs["1"]["floats"] + runs["1"]["composite"]):
        assert optimised.dtype == fast.dtype and optimised.shape == fast.shape
        torch.testing.assert_close(fast, optimised)  # rounding only: float32's test tolerances


def test_int64_keeps_64_bits(dev):
    big = torch.tensor([2**40 + 1, -(2**50)], dtype=torch.int64)
    assert torch.equal((big.to(dev) + 1).cpu(), big + 1)
    assert torch.arange(5, device=dev).dtype == torch.int64


# -- execution modes ------------------------------------------------------------------------


def _failing_on_device(x):
    def explode(values):
        raise ValueError("the device program failed")

    return jax.pure_callback(explode, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


@torch.library.custom_op("accelkit_test::explode", mutates_args=())
def explode(x: torch.Tensor) -> torch.Tensor:
    raise AssertionError("only the tpu kernel runs in these tests")


@explode.register_fake
def _(x):
    return torch.empty_like(x)


@pytest.fixture(scope="module")
def failing_op():
    register_jax_kernel(explode, _failing_on_device)
    return explode


def test_debug_mode_raises_at_the_failing_op_and_names_it(dev, failing_op):
    x = torch.ones(4, device=dev)
    with execution_mode("debug"):
        with pytest.raises(TpuExecutionError, match=r"accelkit_test.explode.default.*\(4,\)") as info:
            failing_op(x)
    assert "the device program failed" in str(info.value)


def test_strict_mode_returns_before_the_program_finishes_and_debug_mode_waits(dev):
    a = torch.randn(1500, 1500, device=dev)
    torch.tpu.synchronize()
    from accelkit._runtime import active
    from accelkit._runtime.device import tensors as T

    def ready(t):
        return T.buffer_of(t).block.array.is_ready()

    y = a @ a  # about 7 GFLOP: far longer than a dispatch
    assert not ready(y), "strict mode should dispatch asynchronously"
    torch.tpu.synchronize()
    assert ready(y)
    with execution_mode("debug"):
        z = a @ a
        assert ready(z), "debug mode waits for every op"
    assert active().name == "tpu"


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="strict"):
        with execution_mode("fast"):
            pass


# -- custom ops with JAX kernels ------------------------------------------------------------


@torch.library.custom_op("accelkit_test::gelu_tanh", mutates_args=())
def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x, approximate="tanh")


@gelu_tanh.register_fake
def _(x):
    return torch.empty_like(x)


def test_a_custom_op_runs_its_jax_kernel_on_tpu(dev):
    register_jax_kernel(gelu_tanh, lambda x: jax.nn.gelu(x, approximate=True))
    x = torch.randn(8, 5)
    with accelkit.fallback_policy("deny"):
        got = gelu_tanh(x.to(dev).t())  # a non-contiguous view goes in
    torch.testing.assert_close(got.cpu(), gelu_tanh(x.t()))
    assert accelkit.stats()["ops"]["accelkit_test.gelu_tanh.default"]["native"] == 1


# -- compile cache and cost estimate --------------------------------------------------------


def test_programs_are_cached_per_signature_and_counted(dev):
    a = torch.randn(7, 3, device=dev)
    compiled = lambda: accelkit.stats()["tpu"]["compiled_programs"].get("aten.mul.Tensor", 0)  # noqa: E731
    a * a
    first = compiled()
    for _ in range(3):
        a * a
    assert compiled() == first
    b = torch.randn(9, 3, device=dev)
    b * b
    assert compiled() == first + 1


def test_a_changing_python_float_does_not_recompile(dev):
    a = torch.randn(5, 5, device=dev)
    a * 0.5
    count = accelkit.stats()["tpu"]["compiled_programs"]["aten.mul.Tensor"]
    for scale in (0.25, 0.125, 3.0):
        torch.testing.assert_close((a * scale).cpu(), a.cpu() * scale)
    assert accelkit.stats()["tpu"]["compiled_programs"]["aten.mul.Tensor"] == count


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_python_scalars_kept_on_the_device_act_as_weakly_typed_numbers(dev, dtype):
    host = torch.tensor([1, -2, 3], dtype=dtype)
    x = host.to(dev)
    for scale in (0.5, 0.5, -0.0, 0.0, float("inf"), float("nan"), 3.0, 1e-30):
        got, want = (x * scale).cpu(), host * scale
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)
        assert torch.equal(torch.signbit(got), torch.signbit(want)), scale  # -0.0 keeps its sign
    complex_host = torch.tensor([1 + 1j, 2 - 1j], dtype=torch.complex64)
    torch.testing.assert_close((complex_host.to(dev) * (0.5 - 2j)).cpu(), complex_host * (0.5 - 2j))


def test_the_roofline_estimate_is_labelled_and_scales_with_work(dev):
    from accelkit_backends.tpu.cost import COSTS

    COSTS.reset()
    small = torch.randn(64, 64, device=dev)
    small @ small
    little = accelkit.stats()["tpu"]["estimate"]
    big = torch.randn(512, 512, device=dev)
    big @ big
    more = accelkit.stats()["tpu"]["estimate"]
    assert "estimate" in little["note"] and little["target"] == "v5e"
    assert little["ops"]["aten.mm.default"]["flops"] >= 2 * 64**3
    assert more["estimated_seconds"] > little["estimated_seconds"]
    # 2 * 512**3 flops at v5e's float32 rate, or the bytes at its bandwidth: whichever is larger.
    mm = more["ops"]["aten.mm.default"]
    model = tpu_device.device_model("v5e")
    floor = max(2 * 512**3 / model.peak_flops[torch.float32], 3 * 512 * 512 * 4 / model.memory_bandwidth)
    assert mm["estimated_seconds"] >= floor * 0.99


def test_host_copies_keep_bf16_bits(dev):
    x = torch.randn(33).to(torch.bfloat16)
    assert torch.equal(x.to(dev).cpu(), x)
    array = np.asarray(jnp.asarray([1.5], dtype=jnp.bfloat16))
    assert array.dtype.name == "bfloat16"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_array_made_from_a_host_tensor_keeps_its_values_when_the_tensor_changes(dev, dtype):
    # XLA's CPU client would otherwise keep the tensor's own (aligned) memory as the array.
    allocator = _runtime.active().allocator
    for numel in (16, 1 << 18):
        host = torch.zeros(numel, dtype=dtype)
        array = allocator.from_host(host)
        host.add_(1)
        assert allocator.to_host(array).count_nonzero() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64])
def test_an_adopted_host_tensor_lives_as_long_as_the_array_that_keeps_its_memory(dev, dtype):
    allocator = _runtime.active().allocator
    host = (torch.arange(1 << 12) % 7).to(dtype)
    want, address = host.clone(), host.data_ptr()
    gone = []
    weakref.finalize(host, gone.append, True)
    array = allocator.adopt_host(host)
    del host
    gc.collect()
    assert array.unsafe_buffer_pointer() == address  # kept, not copied, on XLA's CPU platform
    assert not gone  # the runtime would reuse the memory once the tensor object is gone
    assert torch.equal(allocator.to_host(array), want)
    del array
    gc.collect()
    assert gone


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64])
def test_host_transfers_use_jax_s_direct_path_and_give_device_put_s_arrays(dev, dtype):
    allocator = _runtime.active().allocator
    assert allocator._put.__name__ == "direct"  # this jax's internals passed the probe
    host = (torch.randn(4, 5) * 10).to(dtype)
    array = allocator.from_host(host)
    want = jax.device_put(np.asarray(array), allocator.jax_device)
    assert array.aval == want.aval and array.sharding == want.sharding and array.committed
    assert torch.equal(allocator.to_host(array), host)


def test_host_transfers_fall_back_to_device_put_when_jax_s_internals_change(monkeypatch):
    from jax._src.lib import xla_client

    from accelkit_backends.tpu import buffers

    device = _runtime.active().allocator.jax_device
    wrong = jax.device_put(np.zeros((2, 3), np.int32), device)

    def changed(aval, sharding, xs, devices, committed):  # the same name, another meaning
        return wrong

    monkeypatch.setattr(xla_client, "batched_device_put", changed)
    put = buffers._host_transfer(device)
    assert put.__name__ == "public"
    monkeypatch.undo()
    assert np.array_equal(np.asarray(put(np.arange(3))), np.arange(3))


def test_an_op_with_a_host_operand_is_not_changed_by_later_writes_to_it(dev):
    # Host indices are the operands PyTorch's accelerators take at any size.
    x = torch.arange(1 << 20, dtype=torch.float32).to(dev)
    for _ in range(5):
        index = torch.arange(1 << 20)
        picked = x[index]
        index.zero_()  # while the (asynchronous) gather may still be running
        assert torch.equal(picked.cpu(), torch.arange(1 << 20, dtype=torch.float32))
