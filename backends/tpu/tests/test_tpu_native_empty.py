"""``torch.empty``'s and ``empty_strided``'s C++ kernels (``accelkit/_native/factories.cpp``)
against the runtime's Python kernels they stand in for.

Each case runs through the C++ kernels and through the Python kernels registered over them for the
duration (as a process with ``ACCELKIT_NATIVE_LANE=off`` or without the extension has it), and
compares what the user sees: geometry, dtype, device, storage, memory figures, errors.
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

from accelkit import _native, _runtime
from accelkit._runtime.dispatch.core_ops import core_ops

aten = torch.ops.aten


@pytest.fixture
def native_empty():
    if _native.loaded() is None or _runtime._native_front() is None:
        pytest.skip("the native extension is not loaded, or ACCELKIT_NATIVE_LANE=off: empty is Python")


OPS = (aten.empty.memory_format, aten.empty_strided.default)


@contextlib.contextmanager
def python_empty():
    """The runtime's Python kernels of empty and empty_strided, registered over the C++ ones meanwhile."""
    library = torch.library.Library("aten", "IMPL")
    runtime_ops = core_ops(_runtime.active())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
        for op in OPS:
            library.impl(op, runtime_ops[op], "PrivateUse1")
    try:
        yield
    finally:
        library._destroy()


def _kernel_file(op) -> str:
    name = op._schema.name + ("." + op._schema.overload_name if op._schema.overload_name else "")
    return next(line for line in torch._C._dispatch_dump(name).splitlines() if line.startswith("PrivateUse1"))


@pytest.mark.parametrize("op", OPS, ids=str)
def test_empty_gets_the_cpp_kernel(native_empty, op):
    assert "factories.cpp" in _kernel_file(op)
    with python_empty():
        assert "factories.cpp" not in _kernel_file(op)


CALLS = {
    "1-d": lambda d: torch.empty(16, device=d),
    "3-d int32": lambda d: torch.empty(2, 3, 5, device=d, dtype=torch.int32),
    "bfloat16 by index": lambda d: torch.empty((7, 1), device=f"{d.type}:0", dtype=torch.bfloat16),
    "bool": lambda d: torch.empty(9, device=d, dtype=torch.bool),
    "complex": lambda d: torch.empty(4, device=d, dtype=torch.complex64),
    "requires grad": lambda d: torch.empty(3, 4, device=d, requires_grad=True),
    "contiguous format": lambda d: torch.empty(2, 3, 4, 5, device=d, memory_format=torch.contiguous_format),
    "channels last": lambda d: torch.empty(2, 3, 4, 5, device=d, memory_format=torch.channels_last),
    "zero elements": lambda d: torch.empty(2, 0, 3, device=d),
    "0-d": lambda d: torch.empty((), device=d),
    "strided layout": lambda d: torch.empty(5, device=d, layout=torch.strided),
    "like": lambda d: torch.empty_like(torch.empty(3, 2, device=d)),
    "new_empty": lambda d: torch.empty(1, device=d).new_empty((4, 4)),
    "zeros": lambda d: torch.zeros(6, 2, device=d),
    "strided": lambda d: torch.empty_strided((3, 4), (1, 3), device=d),
    "strided, a zero stride": lambda d: torch.empty_strided((3, 4), (0, 1), device=d, dtype=torch.int64),
    "strided, gaps": lambda d: torch.empty_strided((2, 3), (7, 2), device=d),
    "like a transposed tensor": lambda d: torch.empty_like(torch.empty(2, 3, device=d).t()),
    "ones_like": lambda d: torch.ones_like(torch.empty(4, 1, device=d)),
    "strided, zero elements": lambda d: torch.empty_strided((2, 0), (1, 1), device=d),
    "strided, negative stride": lambda d: torch.empty_strided((3, 4), (1, -1), device=d),
    "strided, too few strides": lambda d: torch.empty_strided((3, 4), (1,), device=d),
    "strided, unsupported dtype": lambda d: torch.empty_strided((3,), (1,), device=d, dtype=torch.float64),
    "negative size": lambda d: torch.empty(-2, device=d),
    "another device": lambda d: torch.empty(3, device=f"{d.type}:1"),
    "unsupported dtype": lambda d: torch.empty(3, device=d, dtype=torch.float64),
    "pinned": lambda d: torch.empty(3, device=d, pin_memory=True),
    "sparse layout": lambda d: torch.empty(3, device=d, layout=torch.sparse_coo),
    "out of memory": lambda d: torch.empty(1 << 42, device=d),
}


def _seen(call, dev):
    before = torch.tpu.memory_allocated()
    try:
        t = call(dev)
    except Exception as error:  # the same error and words (the dispatcher's own lists the kernels' files)
        return type(error).__name__, str(error).split(". ")[0]
    values = None
    if 0 not in t.stride():  # a write into overlapping elements runs on the CPU: not what is compared
        with torch.no_grad():
            values = t.fill_(1.5 if t.is_floating_point() or t.is_complex() else 1).cpu().tolist()
    return (t.shape, t.stride(), t.dtype, str(t.device), t.requires_grad, t.untyped_storage().nbytes(),
            torch.tpu.memory_allocated() - before, values)


@pytest.mark.parametrize("case", CALLS)
def test_a_call_sees_what_the_python_kernel_gives(native_empty, dev, case):
    native = _seen(CALLS[case], dev)
    with python_empty():
        python = _seen(CALLS[case], dev)
    assert native == python


def test_every_tensor_has_its_own_memory_and_frees_it(native_empty, dev):
    before = torch.tpu.memory_allocated()
    held = [torch.empty(8, device=dev) for _ in range(5)]
    assert len({t.data_ptr() for t in held}) == 5
    assert torch.tpu.memory_allocated() - before == 5 * 32
    for i in range(5):
        held[i].fill_(float(i))
    assert [held[i].cpu()[0].item() for i in range(5)] == [0.0, 1.0, 2.0, 3.0, 4.0]
    held.clear()
    assert torch.tpu.memory_allocated() == before
