"""The neuron backend as a PyTorch device: selection, device model, memory, dtype policy,
static-shape accounting, cost estimates and the profiling trace."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from conftest import DEVICE, run_python

import accelkit
import accelkit_backends.neuron as neuron
from accelkit.sdk import UnsupportedDtypeError
from accelkit_backends.neuron.device import TARGETS, device_model
from accelkit_backends.neuron.cost import SHAPE_CHURN_LIMIT, ShapeChurnWarning
from accelkit_backends.neuron.sim import NeuronDtypeError


def test_device_is_neuron_and_says_it_is_simulated():
    assert DEVICE.type == "neuron"
    report = next(r for r in accelkit.devices() if r.name == "neuron")
    assert report.simulated
    assert "simulated NeuronCore" in (report.reason or "")


def test_automatic_selection_never_picks_the_simulator():
    result = run_python("""
        import accelkit
        device = accelkit.select_device()
        print(device.type)
        print(accelkit.explain_selection())
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] != "neuron"
    assert "neuron: simulated; chosen only by name" in result.stdout


@pytest.mark.parametrize("target", TARGETS)
def test_every_generation_is_data_with_sources(target):
    model = device_model(target)
    core = model.extra["core"]
    assert model.simulated and model.vendor == "AWS Trainium"
    assert core.partitions == 128
    assert model.peak_flops[torch.bfloat16] > model.peak_flops[torch.float32]
    for field in ("memory_bytes", "memory_bandwidth", "peak_flops", "sbuf", "psum", "clocks", "dma"):
        assert model.sources.get(field), (target, field)
    # the SBUF figure is 128 partitions x the per-partition size
    assert model.extra["sbuf_bytes"] == 128 * core.sbuf_partition_bytes


def test_target_is_chosen_by_environment_and_bad_names_are_explained():
    result = run_python("""
        import accelkit, torch
        dev = accelkit.select_device("neuron")
        props = torch.neuron.get_device_properties()
        print(props.name, "|", torch.neuron.get_device_name(), "|", props.peak_flops["bfloat16"])
    """, env={"ACCELKIT_NEURON_TARGET": "trn1"})
    assert result.returncode == 0, result.stderr
    # The instance family, as Neuron's PyTorch backend names a device; the name says the rest.
    name, described, peak = result.stdout.strip().split(" | ")
    assert name == device_model("trn1").product == "trn1"
    assert described == "trn1 (simulated neuron)"
    assert float(peak) == device_model("trn1").peak_flops[torch.bfloat16]
    bad = run_python("""
        import accelkit
        print([r.reason for r in accelkit.devices() if r.name == "neuron"][0])
    """, env={"ACCELKIT_NEURON_TARGET": "trn9"})
    assert "trn9" in bad.stdout and "trn1, trn2, trn3" in bad.stdout


def test_out_of_memory_at_the_cores_hbm_share(dev):
    capacity = device_model().memory_bytes
    with pytest.raises(torch.OutOfMemoryError, match="neuron"):
        torch.empty(capacity // 4 + 1024, dtype=torch.float32, device=dev)
    x = torch.ones(4, device=dev)  # still usable afterwards
    assert x.sum().item() == 4


def test_float64_and_complex128_are_refused_with_the_fix(dev):
    with pytest.raises(UnsupportedDtypeError, match="ACCELKIT_NEURON_FLOAT64=downcast"):
        torch.ones(3, dtype=torch.float64).to(dev)
    with pytest.raises(UnsupportedDtypeError, match="complex"):
        torch.ones(3, dtype=torch.complex128).to(dev)


def test_uint64_is_refused_with_an_integer_fix(dev):
    with pytest.raises(UnsupportedDtypeError, match="no 64-bit unsigned integers") as refused:
        torch.ones(3, dtype=torch.uint64).to(dev)
    assert "floating" not in str(refused.value) and "uint32" in str(refused.value)
    assert torch.equal(torch.ones(3, dtype=torch.int64).to(dev).cpu(), torch.ones(3, dtype=torch.int64))


def test_float64_downcast_policy_computes_in_float32_and_warns():
    result = run_python("""
        import warnings, torch, accelkit
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            dev = accelkit.select_device("neuron")
            x = torch.tensor([1.0, 1e-9], dtype=torch.float64).to(dev)
            y = (x + 1.0).cpu()
        print(y.dtype, repr(y[1].item()), any("float32" in str(w.message) for w in caught))
    """, env={"ACCELKIT_NEURON_FLOAT64": "downcast"})
    assert result.returncode == 0, result.stderr
    dtype, second, warned = result.stdout.split()
    assert dtype == "torch.float64"
    assert float(second) == 1.0  # 1 + 1e-9 rounds to 1 in float32, not in float64
    assert warned == "True"


def test_int64_is_stored_wide_and_computed_on_the_32_bit_datapath(dev):
    x = torch.arange(10, dtype=torch.int64)
    assert torch.equal((x.to(dev) * 3 + 1).cpu(), x * 3 + 1)
    big = torch.tensor([2**40], dtype=torch.int64)
    assert big.to(dev).cpu().item() == 2**40  # storage keeps all 64 bits
    with pytest.raises(NeuronDtypeError, match="32-bit integer datapath"):
        (big.to(dev) + 1).cpu()
    with pytest.raises(NeuronDtypeError, match="int32"):
        (torch.tensor([2**31 - 1]).to(dev) + 1).cpu()  # an overflow is an error, never a wrap


def test_shape_churn_warns_once_and_names_the_op(dev):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # Sizes no other test uses: kernel instances outlive reset_stats(), so a shape another
        # test of this process compiled already would be no new instance here.
        for n in range(1, SHAPE_CHURN_LIMIT + 3):
            torch.ones(n, 3, 13, 7, device=dev).neg()
    churn = [str(w.message) for w in caught if issubclass(w.category, ShapeChurnWarning)]
    about_neg = [m for m in churn if m.startswith("neuron: neg.default ")]
    assert len(about_neg) == 1 and "bucketing" in about_neg[0]  # once, however often it recurs
    assert len(churn) == len({m.split()[1] for m in churn})  # at most one warning per op
    instances = accelkit.stats()["neuron"]["instances"]["neg.default"]
    assert instances == SHAPE_CHURN_LIMIT + 2


def test_fixed_layer_shapes_do_not_warn(dev):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):  # the same few shapes again and again, as a model's layers
            for shape in [(4, 3), (7, 3), (5,), (2, 2, 2), (9,)]:
                torch.ones(shape, device=dev).exp()
    assert not [w for w in caught if issubclass(w.category, ShapeChurnWarning)]
    assert accelkit.stats()["neuron"]["instances"]["exp.default"] == 5


def test_stats_give_estimated_device_time_per_op_and_engine(dev):
    a = torch.randn(256, 128, device=dev)
    b = torch.randn(128, 64, device=dev)
    (a @ b).relu().sum()
    estimate = accelkit.stats()["neuron"]["estimate"]
    assert "estimate" in estimate["note"] and "simulated" in estimate["note"]
    assert estimate["per_op"]["mm.default"]["flops"] == 2 * 256 * 128 * 64
    assert estimate["per_engine_seconds"]["tensor"] > 0
    assert estimate["per_engine_seconds"]["scalar"] > 0  # relu is an activation
    assert estimate["device_seconds"] >= max(estimate["per_engine_seconds"]["tensor"], 0)
    accelkit.reset_stats()
    assert accelkit.stats()["neuron"]["estimate"]["kernels"] == 0


def test_profile_exports_a_chrome_trace_that_parses(dev, tmp_path):
    x = torch.randn(64, 64, device=dev)
    with neuron.profile() as prof:
        y = torch.tanh(x @ x)
    y.cpu()
    path = prof.export_chrome_trace(tmp_path / "trace.json")
    events = json.loads(path.read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert [e["name"] for e in kernels] == ["mm.default", "tanh.default"]
    instructions = [e for e in events if e["ph"] == "X" and e.get("cat") != "kernel"]
    engines = {e["tid"] for e in instructions}
    assert len(engines) >= 3  # DMA, Tensor engine, Scalar engine at least
    for event in kernels + instructions:
        assert event["ts"] >= 0 and event["dur"] > 0
    mm, tanh = kernels
    assert tanh["ts"] >= mm["ts"] + mm["dur"] - 1e-6  # kernels run one after another
    names = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert {"kernels", "tensor", "dma"} <= names


def test_stochastic_rounding_switch_changes_bf16_results(dev):
    x = torch.full((4096,), 1.0, dtype=torch.bfloat16, device=dev)
    step = 2.0**-9  # a quarter of a bf16 ulp at 1.0
    nearest = (x + step).float().cpu()
    with neuron.stochastic_rounding():
        stochastic = (x + step).float().cpu()
    assert torch.all(nearest == 1.0)
    assert set(stochastic.unique().tolist()) == {1.0, 1.0 + 2.0**-7}
    assert abs(stochastic.mean().item() - (1 + step)) < 1e-3


def test_autograd_zero_tensors_reach_the_device(dev):
    x = torch.randn(4, requires_grad=True)
    torch.sgn(x.to(dev)).sum().backward()  # sgn's gradient is a symbolic ZeroTensor
    assert torch.equal(x.grad, torch.zeros(4))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
def test_abs_of_integers_is_the_cpus_at_every_magnitude(dev, dtype):
    info = torch.iinfo(dtype)
    values = torch.tensor([0, 1, 7, 25, 127, info.max, info.min, info.min + 1], dtype=torch.int64)
    x = values.clamp(info.min, info.max).to(dtype)
    assert torch.equal(torch.abs(x.to(dev)).cpu(), torch.abs(x))  # uint8 25 became 231 (max(x, -x) wrapped)


def test_an_empty_contraction_is_zeros_also_when_its_program_is_replayed(dev):
    bias = torch.arange(6.0).reshape(2, 3) - 2
    no_batches = torch.zeros(0, 2, 5), torch.zeros(0, 5, 3)
    want = torch.addbmm(bias, *no_batches, beta=2)
    for _ in range(6):  # adaptive eager builds the region's program, then replays it
        # Host memory freed here is what a replay's fresh result arrays are made from.
        stale = [np.full(6, 7.0, np.float32) for _ in range(20)]
        del stale
        got = torch.addbmm(bias.to(dev), *(t.to(dev) for t in no_batches), beta=2).cpu()
        assert torch.equal(got, want)  # the product's zeros were a host write, lost in a replay
