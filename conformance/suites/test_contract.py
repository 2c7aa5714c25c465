"""Contract: accelkit's own checks of the runtime on the backend under test.

Areas (the test name starts with its area, so ``contract/<area>*`` declares a whole area):
aliasing, autograd, rng, serialization, autocast, memory, accelerator (``torch.accelerator``
and the ``torch.<name>`` device module), transfer, stats, bad_input (the core cases of
:mod:`accelkit_conformance.bad_input`: out-of-range indices, integer division by zero,
overflowing fills). Where PyTorch defines the answer on the CPU, the device must give the
same one.
"""

from __future__ import annotations

import copy
import gc
import io

import pytest
import torch
import torch.nn.functional as F

import accelkit
from accelkit_conformance import bad_input, session
from accelkit_conformance.cases import param_id
from accelkit_conformance.compare import assert_same

SETTINGS = session.current()
DEV = SETTINGS.device
NAME = DEV.type
MODULE = torch.get_device_module(NAME)


def _both(fn):
    """``fn(device)`` on the CPU and on the device; returns (cpu_result, device_result)."""
    return fn(torch.device("cpu")), fn(DEV)


# -- aliasing -------------------------------------------------------------------------------------

VIEWS = {
    "select": lambda b: b[1],
    "column": lambda b: b[:, 2],
    "transpose": lambda b: b.t(),
    "flatten_view": lambda b: b.view(-1),
    "step_slice": lambda b: b[::2, 1::2],
    "diagonal": lambda b: b.diagonal(),
    "narrow": lambda b: b.narrow(1, 1, 3),
    "unsqueeze": lambda b: b.unsqueeze(0),
    "as_strided": lambda b: b.as_strided((3, 3), (6, 1), 1),
    "unfold": lambda b: b[0].unfold(0, 2, 2),
}
WRITES = {
    "add_": lambda v: v.add_(100),
    "mul_": lambda v: v.mul_(-2),
    "fill_": lambda v: v.fill_(7),
    "zero_": lambda v: v.zero_(),
    "copy_": lambda v: v.copy_(torch.arange(v.numel(), dtype=v.dtype).reshape(v.shape).to(v.device)),
    "index_put": lambda v: v.__setitem__(..., -1),
}


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_aliasing_views_share_storage_and_geometry(view):
    cpu_base = torch.arange(24.0).reshape(4, 6)
    base = cpu_base.to(DEV)
    v, cpu_v = VIEWS[view](base), VIEWS[view](cpu_base)
    assert v._base is base, f"{view} of a device tensor is not a view of it"
    assert v.untyped_storage().data_ptr() == base.untyped_storage().data_ptr(), f"{view} does not share storage"
    assert (v.shape, v.stride(), v.storage_offset()) == (cpu_v.shape, cpu_v.stride(), cpu_v.storage_offset())
    assert_same(v, cpu_v, where=view)


@pytest.mark.parametrize("write", sorted(WRITES))
@pytest.mark.parametrize("view", sorted(VIEWS))
def test_aliasing_write_through_view(view, write):
    def run(device):
        base = torch.arange(24.0, device=device).reshape(4, 6)
        other = base[:, 1:4]  # a second, overlapping view
        WRITES[write](VIEWS[view](base))
        return base, other

    (cpu_base, cpu_other), (base, other) = _both(run)
    assert_same(base, cpu_base, where=f"base after {write} through {view}")
    assert_same(other, cpu_other, where=f"overlapping view after {write} through {view}")


def test_aliasing_out_argument_writes_into_a_view():
    def run(device):
        base = torch.zeros(3, 4, device=device)
        torch.add(torch.ones(4, device=device), 2, out=base[1])
        torch.mul(torch.full((3,), 3.0, device=device), 2, out=base[:, 0])
        return base

    cpu, dev = _both(run)
    assert_same(dev, cpu, where="base after out= writes into views")


def test_aliasing_chain_of_views_and_writes():
    def run(device):
        base = torch.arange(60.0, device=device).reshape(3, 4, 5)
        a = base.transpose(0, 2)[1:, ::2]
        a.mul_(2)
        b = a.reshape(-1) if a.is_contiguous() else a[0]
        b.add_(1000)
        base.select(1, 3).neg_()
        return base, a

    (cpu_base, cpu_a), (base, a) = _both(run)
    assert_same(base, cpu_base, where="base")
    assert_same(a, cpu_a, where="view")


def test_aliasing_write_to_overlapping_memory_is_refused_like_cpu():
    def run(device):
        expanded = torch.zeros(1, 3, device=device).expand(4, 3)
        with pytest.raises(RuntimeError, match="single memory location"):
            expanded.add_(1)

    _both(run)


# -- autograd -------------------------------------------------------------------------------------


def _mlp(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    return model.to(device)


def test_autograd_mlp_gradients_match_cpu():
    def run(device):
        model = _mlp(device)
        x = torch.linspace(-1, 1, 40).reshape(5, 8).to(device)
        target = torch.linspace(0, 1, 15).reshape(5, 3).to(device)
        F.mse_loss(model(x), target).backward()
        return [p.grad for p in model.parameters()]

    cpu, dev = _both(run)
    assert_same(dev, cpu, where="parameter gradients")


def test_autograd_inplace_on_a_view_of_a_non_leaf():
    def run(device):
        leaf = torch.linspace(1, 2, 12, device=device).reshape(3, 4).requires_grad_()
        y = leaf * 2
        y[1].mul_(3)
        y[:, 0].exp_()
        (y * torch.arange(12.0, device=device).reshape(3, 4)).sum().backward()
        return leaf.grad

    cpu, dev = _both(run)
    assert_same(dev, cpu, where="gradient through in-place view writes")


def test_autograd_gradients_accumulate():
    def run(device):
        w = torch.ones(4, device=device, requires_grad=True)
        for k in range(3):
            (w * (k + 1)).pow(2).sum().backward()
        return w.grad

    cpu, dev = _both(run)
    assert_same(dev, cpu, where="accumulated gradient")


def test_autograd_modified_saved_tensor_is_detected():
    def run(device):
        x = torch.ones(3, device=device, requires_grad=True)
        y = x.exp()
        z = y * y  # saves y
        y.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            z.sum().backward()

    _both(run)


def test_autograd_no_grad_and_detach():
    x = torch.ones(3, device=DEV, requires_grad=True)
    with torch.no_grad():
        assert not (x * 2).requires_grad
    d = x.detach()
    assert not d.requires_grad and d.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


# -- rng ------------------------------------------------------------------------------------------

DRAWS = {
    "randn": lambda: torch.randn(64, device=DEV),
    "rand": lambda: torch.rand(64, device=DEV),
    "randint": lambda: torch.randint(0, 1000, (64,), device=DEV),
    "normal_": lambda: torch.empty(64, device=DEV).normal_(2.0, 3.0),
    "bernoulli": lambda: torch.bernoulli(torch.full((64,), 0.5, device=DEV)),
    "dropout": lambda: F.dropout(torch.ones(64, device=DEV), p=0.5, training=True),
}


@pytest.mark.parametrize("draw", sorted(DRAWS))
def test_rng_manual_seed_reproduces(draw):
    torch.manual_seed(1234)
    first = DRAWS[draw]().cpu()
    torch.manual_seed(1234)
    second = DRAWS[draw]().cpu()
    torch.manual_seed(4321)
    other = DRAWS[draw]().cpu()
    assert torch.equal(first, second), f"{draw}: the same seed gave different values"
    assert not torch.equal(first, other), f"{draw}: different seeds gave the same values"


def test_rng_state_save_and_restore():
    MODULE.manual_seed(8)
    torch.randn(10, device=DEV)
    state = MODULE.get_rng_state()
    expected = torch.randn(10, device=DEV).cpu()
    torch.randn(10, device=DEV)
    MODULE.set_rng_state(state)
    assert torch.equal(torch.randn(10, device=DEV).cpu(), expected)


def test_rng_fork_rng_isolates_the_device_stream():
    MODULE.manual_seed(31)
    state = MODULE.get_rng_state()
    expected = torch.randn(10, device=DEV).cpu()
    MODULE.set_rng_state(state)
    with torch.random.fork_rng(device_type=NAME):
        inside = torch.randn(10, device=DEV).cpu()
        torch.randn(100, device=DEV)
    assert torch.equal(inside, expected)
    assert torch.equal(torch.randn(10, device=DEV).cpu(), expected)


def test_rng_distributions_are_plausible():
    torch.manual_seed(0)
    u = torch.rand(20000, device=DEV).cpu()
    n = torch.randn(20000, device=DEV).cpu()
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.02
    assert abs(n.mean()) < 0.05 and abs(n.std() - 1) < 0.05


# -- serialization --------------------------------------------------------------------------------


def _roundtrip(obj, **load_kwargs):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False, **load_kwargs)


def _sample_of(dtype: torch.dtype, shape=(3, 5)) -> torch.Tensor:
    torch.manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, dtype=dtype)
    return torch.randint(-100 if dtype.is_signed else 0, 100, shape, dtype=dtype)


@pytest.mark.parametrize("dtype", SETTINGS.dtypes)
def test_serialization_tensor_round_trips_on_the_device(dtype):
    cpu = _sample_of(getattr(torch, dtype))
    loaded = _roundtrip(cpu.to(DEV))
    assert loaded.device == DEV
    assert torch.equal(loaded.cpu(), cpu)


def test_serialization_map_location_cpu():
    cpu = _sample_of(torch.float32)
    loaded = _roundtrip(cpu.to(DEV), map_location="cpu")
    assert loaded.device.type == "cpu" and torch.equal(loaded, cpu)


def test_serialization_views_saved_together_keep_aliasing():
    base = torch.arange(12.0, device=DEV).reshape(3, 4)
    loaded_base, loaded_view = _roundtrip([base, base[1:, ::2]])
    assert loaded_view.untyped_storage().data_ptr() == loaded_base.untyped_storage().data_ptr()
    assert (loaded_view.stride(), loaded_view.storage_offset()) == ((4, 2), 4)
    loaded_view.fill_(-1)
    expected = torch.arange(12.0).reshape(3, 4)
    expected[1:, ::2] = -1
    assert torch.equal(loaded_base.cpu(), expected)


def test_serialization_module_state_dict_round_trips():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6)).to(DEV)
    model(torch.randn(8, 4, device=DEV))  # moves the running statistics
    state = _roundtrip(model.state_dict())
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6)).to(DEV)
    fresh.load_state_dict(state)
    for key, value in model.state_dict().items():
        assert state[key].device == DEV, key
        assert torch.equal(fresh.state_dict()[key].cpu(), value.cpu()), key


def test_serialization_deepcopy_is_equal_and_independent():
    original = torch.arange(6.0, device=DEV)
    clone = copy.deepcopy(original)
    assert clone.device == DEV and torch.equal(clone.cpu(), original.cpu())
    clone.add_(1)
    assert torch.equal(original.cpu(), torch.arange(6.0))
    model = _mlp(DEV)
    twin = copy.deepcopy(model)
    for a, b in zip(model.parameters(), twin.parameters()):
        assert b.device == DEV and torch.equal(a.cpu(), b.cpu())
        assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()


# -- autocast -------------------------------------------------------------------------------------


def _policy():
    from accelkit.sdk import backends

    return backends()[NAME].autocast_policy()


def _low_dtype() -> torch.dtype:
    dtypes = MODULE.get_amp_supported_dtype()
    if not dtypes:
        pytest.skip(f"{NAME} supports no autocast dtype")
    return dtypes[0]


def test_autocast_matmul_runs_in_the_low_dtype():
    low = _low_dtype()
    if "mm" not in _policy().lower_precision:
        pytest.skip(f"{NAME}'s autocast policy keeps mm in full precision")
    a, b = _sample_of(torch.float32, (8, 16)), _sample_of(torch.float32, (16, 4))
    with torch.autocast(NAME, dtype=low):
        assert torch.is_autocast_enabled(NAME) and torch.get_autocast_dtype(NAME) == low
        out = a.to(DEV) @ b.to(DEV)
    assert not torch.is_autocast_enabled(NAME)
    assert out.dtype == low
    expected = (a.to(low) @ b.to(low))
    assert_same(out, expected, where="autocast matmul")
    assert (a.to(DEV) @ b.to(DEV)).dtype == torch.float32


def test_autocast_float32_ops_run_in_float32():
    low = _low_dtype()
    op = next((n for n in ("exp", "log", "rsqrt", "layer_norm") if n in _policy().float32), None)
    if op is None:
        pytest.skip(f"{NAME}'s autocast policy lists none of exp, log, rsqrt, layer_norm as float32 ops")
    x = _sample_of(torch.float32, (4, 8)).abs().add(0.5).to(low)
    fn = {"layer_norm": lambda t: F.layer_norm(t, (8,))}.get(op, getattr(torch, op))
    with torch.autocast(NAME, dtype=low):
        out = fn(x.to(DEV))
    assert out.dtype == torch.float32, f"{op} under autocast gave {out.dtype}, the policy says float32"
    assert_same(out, fn(x.float()), where=f"autocast {op}")


def test_autocast_training_step_gives_float32_gradients():
    low = _low_dtype()
    model = _mlp(DEV)
    x = _sample_of(torch.float32, (5, 8)).to(DEV)
    with torch.autocast(NAME, dtype=low):
        loss = model(x).float().pow(2).mean()
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.dtype == torch.float32, name


# -- memory ---------------------------------------------------------------------------------------


def _collect():
    gc.collect()
    MODULE.synchronize()


def test_memory_allocated_follows_tensors():
    _collect()
    before = MODULE.memory_allocated()
    x = torch.empty(1 << 20, dtype=torch.uint8, device=DEV)
    assert MODULE.memory_allocated() >= before + x.nbytes
    assert MODULE.max_memory_allocated() >= MODULE.memory_allocated()
    del x
    _collect()
    assert MODULE.memory_allocated() == before


def test_memory_peak_statistics_reset():
    _collect()
    MODULE.reset_peak_memory_stats()
    base = MODULE.memory_allocated()
    x = torch.empty(1 << 20, dtype=torch.uint8, device=DEV)
    del x
    _collect()
    assert MODULE.max_memory_allocated() >= base + (1 << 20)
    MODULE.reset_peak_memory_stats()
    assert MODULE.max_memory_allocated() == MODULE.memory_allocated()


def test_memory_capacity_is_reported_consistently():
    total = MODULE.get_device_properties(0).total_memory
    free, total_info = MODULE.mem_get_info()
    assert total > 0 and total_info == total and 0 <= free <= total
    stats = MODULE.memory_stats()
    assert isinstance(stats, dict) and stats


def test_memory_oom_is_clear_and_recoverable():
    _collect()
    total = MODULE.get_device_properties(0).total_memory
    before = MODULE.memory_allocated()
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(total + (1 << 20), dtype=torch.uint8, device=DEV)
    assert NAME in str(info.value), f"the OOM message does not name the device: {info.value}"
    _collect()
    assert MODULE.memory_allocated() == before
    assert torch.equal((torch.ones(4, device=DEV) * 2).cpu(), torch.full((4,), 2.0))


# -- accelerator ----------------------------------------------------------------------------------


def test_accelerator_reports_the_backend():
    acc = torch.accelerator.current_accelerator()
    assert acc is not None and acc.type == NAME
    assert torch.accelerator.is_available()
    assert torch.accelerator.device_count() >= 1
    assert torch.accelerator.current_device_index() == 0
    assert torch.ones(1, device=acc).device == DEV


def test_accelerator_device_index_context():
    torch.accelerator.set_device_index(0)
    with torch.accelerator.device_index(0):
        assert torch.accelerator.current_device_index() == 0
    assert torch.accelerator.current_device_index() == 0


def test_accelerator_device_module():
    assert MODULE.is_available() and MODULE.device_count() >= 1 and MODULE.current_device() == 0
    MODULE.synchronize()
    assert isinstance(MODULE.get_device_name(), str) and MODULE.get_device_name()
    with MODULE.device(0):
        assert torch.zeros(1, device=NAME).device == DEV


# -- transfer -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", SETTINGS.dtypes)
def test_transfer_round_trips_exactly(dtype):
    cpu = _sample_of(getattr(torch, dtype), (6, 7))
    on_device = cpu.to(DEV)
    assert on_device.device == DEV and on_device.dtype == cpu.dtype
    assert torch.equal(on_device.cpu(), cpu)
    strided = cpu.t()[::2]
    assert torch.equal(strided.to(DEV).cpu(), strided)
    assert torch.equal(on_device.t()[::2].cpu(), strided)
    assert torch.equal(on_device.clone().cpu(), cpu)


@pytest.mark.parametrize("dtype", SETTINGS.dtypes)
def test_transfer_copies_share_no_memory_with_the_host_tensor(dtype):
    # Large enough that a host runtime would hand over the tensor's own (aligned) memory.
    cpu = _sample_of(getattr(torch, dtype), (256, 256))
    before = cpu.clone()
    moved, copied = cpu.to(DEV), torch.empty_like(cpu, device=DEV).copy_(cpu)
    cpu.zero_()
    assert torch.equal(moved.cpu(), before) and torch.equal(copied.cpu(), before)
    back = moved.cpu()
    back.zero_()
    assert torch.equal(moved.cpu(), before)


def test_transfer_host_operands_are_taken_as_on_pytorchs_accelerators():
    x = torch.arange(6.0, device=DEV)
    assert torch.equal((x * torch.tensor(2.0)).cpu(), torch.arange(6.0) * 2)  # 0-dim: a number
    assert torch.equal(x[torch.tensor([5, 0])].cpu(), torch.tensor([5.0, 0.0]))  # host indices
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        x + torch.ones(6)
    assert torch.equal(x.cpu(), torch.arange(6.0))


@pytest.mark.parametrize("dtype", SETTINGS.dtypes)
def test_transfer_dtype_conversion_on_the_device_matches_cpu(dtype):
    cpu = _sample_of(torch.float32, (5, 4)) * 50
    target = getattr(torch, dtype)
    assert_same(cpu.to(DEV).to(target), cpu.to(target), where=f"float32 -> {dtype}")
    back = _sample_of(target, (5, 4))
    assert_same(back.to(DEV).to(torch.float32), back.to(torch.float32), where=f"{dtype} -> float32")


# -- stats ----------------------------------------------------------------------------------------


def test_stats_count_every_op_once_by_path():
    accelkit.reset_stats()
    x = torch.arange(6.0, device=DEV)
    (x + x).sum()
    torch.cumsum(x, 0)
    stats = accelkit.stats()
    assert stats["backend"] == NAME
    totals = {k: sum(c[k] for c in stats["ops"].values()) for k in ("native", "decomposed", "fallback")}
    assert totals == stats["totals"]
    assert sum(totals.values()) >= 3
    assert all(op.startswith("aten.") for op in stats["ops"])


def test_stats_deny_policy_never_uses_the_fallback():
    x = torch.linspace(0.1, 0.9, 8, device=DEV)
    accelkit.reset_stats()
    with accelkit.fallback_policy("deny"):
        for fn, args in ((torch.special.zeta, (x, x)), (torch.special.i1e, (x,)), (torch.nextafter, (x, x))):
            try:
                fn(*args)
            except accelkit.FallbackDeniedError as exc:
                assert NAME in str(exc), f"the denial does not name the backend: {exc}"
    assert accelkit.stats()["totals"]["fallback"] == 0


def test_stats_printing_works_under_deny_and_counts_nothing():
    x = torch.linspace(0, 1, 5, device=DEV)
    accelkit.reset_stats()
    with accelkit.fallback_policy("deny"):
        text = repr(x)
    assert NAME in text
    assert sum(accelkit.stats()["totals"].values()) == 0


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", [pytest.param(name, id=param_id(name)) for name in bad_input.CORE])
def test_bad_input_matches_cpu(case):
    """CPU's exception (type, and its message within the device's) by the next synchronisation,
    the inputs unchanged, and the device still working (see :mod:`accelkit_conformance.bad_input`)."""
    bad_input.check_like_cpu(bad_input.CORE[case], DEV)
