"""The prepared-call lane's C++ front (``accelkit/_native/lane.cpp``) against its Python front.

With the native extension loaded, a functional op whose other arguments all have defaults gets
the C++ front as its PrivateUse1 kernel. Each test runs the same calls through it and through
the Python kernel it stands in for (registered over it for the duration, as a process with
``ACCELKIT_NATIVE_LANE=off`` or without the extension has it), and compares what the user sees:
values, dtype, geometry, storage, counts, memory, errors.
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

import accelkit
from accelkit import _native, _runtime

aten = torch.ops.aten


def _registered_at(op) -> str:
    return next(line for line in torch._C._dispatch_dump(op._schema.name + "." + op._schema.overload_name)
                .splitlines() if line.startswith("PrivateUse1"))


@pytest.fixture
def native_front():
    if _native.loaded() is None or _runtime._native_front() is None:
        pytest.skip("the native extension is not loaded, or ACCELKIT_NATIVE_LANE=off: every front is Python")
    return True


@contextlib.contextmanager
def python_kernels(*ops):
    """The Python kernels the C++ front stands in for, registered over it meanwhile."""
    ctx, pipeline = _runtime.active(), _runtime._pipeline
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
        for op in ops:
            fn = next(entry.fn for entry in ctx.kernels if entry.op == op)
            library.impl(op, _runtime._native_kernel(ctx, pipeline, op, fn), "PrivateUse1")
    try:
        yield
    finally:
        library._destroy()


@pytest.fixture(params=["native", "python"])
def front(request, native_front):
    """Run the test's calls through the C++ front, or through the Python kernel over it."""
    if request.param == "native":
        yield "native"
        return
    with python_kernels(aten.add.Tensor, aten.mul.Tensor, aten.sub.Tensor):
        yield "python"


def test_an_all_tensor_functional_op_gets_the_cpp_front(native_front):
    assert "lane.cpp" in _registered_at(aten.add.Tensor)
    assert "lane.cpp" in _registered_at(aten.mul.Tensor)
    # In-place variants keep their Python kernels (they write into self).
    assert "lane.cpp" not in _registered_at(aten.add_.Tensor)


CASES = {
    "contiguous": lambda d: (torch.randn(16), torch.randn(16)),
    "strided views": lambda d: (torch.randn(32)[::2], torch.randn(40)[3:35:2]),
    "transposed": lambda d: (torch.randn(5, 7).t(), torch.randn(7, 5)),
    "broadcast": lambda d: (torch.randn(4, 1, 3), torch.randn(5, 1)),
    "int and float": lambda d: (torch.arange(12, dtype=torch.int32), torch.randn(12)),
    "0-d": lambda d: (torch.tensor(2.5), torch.randn(3)),
    "empty": lambda d: (torch.randn(0, 3), torch.randn(3)),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("op", ["add", "mul", "sub"])
def test_results_match_the_cpu_and_the_python_fronts_geometry(dev, native_front, case, op):
    x, y = CASES[case](dev)
    fn = getattr(torch, op)
    expected = fn(x, y)
    a, b = x.to(dev), y.to(dev)
    with python_kernels(aten.add.Tensor, aten.mul.Tensor, aten.sub.Tensor):
        python = [fn(a, b) for _ in range(3)]
    native = [fn(a, b) for _ in range(3)]  # the first call of a layout takes the Python path
    for got in (*python, *native):
        assert (got.dtype, got.shape) == (expected.dtype, expected.shape)
        torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
    for p, n in zip(python, native):
        assert (n.stride(), n.storage_offset(), n.untyped_storage().nbytes()) == (
            p.stride(), p.storage_offset(), p.untyped_storage().nbytes())


def test_the_result_owns_a_device_buffer_at_its_address(dev, front):
    a, b = torch.randn(8, device=dev), torch.randn(8, device=dev)
    for _ in range(3):
        r = a * b
    storage = r.untyped_storage()
    assert storage.payload.nbytes == storage.nbytes() == 32
    assert storage.data_ptr() == storage.payload.address != a.untyped_storage().data_ptr()
    assert not storage.resizable()
    assert r.device == dev


def test_a_non_default_argument_and_the_in_place_variant_are_unchanged(dev, front):
    x, y = torch.randn(6), torch.randn(6)
    a, b = x.to(dev), y.to(dev)
    for _ in range(2):
        torch.testing.assert_close(torch.add(a, b, alpha=3).cpu(), torch.add(x, y, alpha=3))
    c = a.clone()
    c.add_(b)
    torch.testing.assert_close(c.cpu(), x + y)
    view = a.clone()[::2]
    torch.testing.assert_close((view + b[:3]).cpu(), x[::2] + y[:3])


def test_every_call_is_counted_native(dev, front):
    a, b = torch.randn(9, device=dev), torch.randn(9, device=dev)
    counters = _runtime.active().counters
    before = counters.snapshot().get(str(aten.add.Tensor), {}).get("native", 0)
    for _ in range(5):
        a + b
    assert counters.snapshot()[str(aten.add.Tensor)]["native"] == before + 5


def test_calls_counted_in_cpp_are_read_and_reset_with_the_others_and_a_paused_thread_counts_none(dev, front):
    a, b = torch.randn(9, device=dev), torch.randn(9, device=dev)
    counters, name = _runtime.active().counters, str(aten.add.Tensor)
    a + b  # the layout's first call (the Python front's)
    before = counters.snapshot()[name]["native"]
    for _ in range(3):
        a + b
    assert counters.totals()["native"] >= before + 3
    with counters.paused():
        for _ in range(4):
            a + b
    assert counters.snapshot()[name]["native"] == before + 3
    a + b
    a + b  # counted in C++, not read yet
    accelkit.reset_stats()
    a + b
    assert counters.snapshot()[name]["native"] == 1  # the reset took what C++ had counted too


def test_results_are_accounted_and_freed(dev, front):
    a, b = torch.randn(1024, device=dev), torch.randn(1024, device=dev)
    a + b  # the layout's first call
    torch.tpu.synchronize()
    start = torch.tpu.memory_allocated()
    kept = [a + b for _ in range(4)]
    assert torch.tpu.memory_allocated() == start + 4 * 4096
    del kept
    assert torch.tpu.memory_allocated() == start


@pytest.mark.parametrize("make", [
    lambda d: (torch.randn(16, device=d), torch.randn(3, device=d)),
    lambda d: (torch.randn(16, device=d), torch.randn(16)),
], ids=["shapes", "host operand"])
def test_errors_are_the_python_paths(dev, native_front, make):
    a, b = make(dev)
    with pytest.raises(RuntimeError) as native_error:
        a + b
    with python_kernels(aten.add.Tensor), pytest.raises(RuntimeError) as python_error:
        a + b
    assert str(native_error.value) == str(python_error.value)


def test_autograd_through_the_front(dev, native_front):
    x = torch.randn(5, requires_grad=True)
    a = x.detach().to(dev).requires_grad_()
    for _ in range(2):
        (a * a + a).sum().backward()
        (x * x + x).sum().backward()
    torch.testing.assert_close(a.grad.cpu(), x.grad)


@pytest.mark.parametrize("call", [
    pytest.param(lambda w, i, o, t: torch.nn.functional.embedding_bag(i, w, o, mode="sum"), id="embedding_bag-sum"),
    pytest.param(lambda w, i, o, t: torch.nn.functional.binary_cross_entropy(torch.sigmoid(w), t), id="bce-no-weight"),
])
def test_an_absent_optional_tensor_passed_from_cpp_takes_the_python_kernel_as_none(native_front, call):
    """C++ callers (embedding_bag's, binary_cross_entropy's composites) pass an absent optional
    tensor as an undefined tensor, not None: the front must hand it on as None, as PyTorch's
    Python kernel holder does, instead of asking it for its device."""
    g = torch.Generator().manual_seed(3)
    w = torch.rand(10, 3, generator=g)
    i, o = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 4])
    t = torch.rand(10, 3, generator=g)
    dev = accelkit.select_device("tpu")
    got = call(w.to(dev), i.to(dev), o.to(dev), t.to(dev)).cpu()
    torch.testing.assert_close(got, call(w, i, o, t))
