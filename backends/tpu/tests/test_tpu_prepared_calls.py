"""Prepared calls on tpu: ``Lowering.specialize`` plans must run the same program, count the
same compiles and costs, and read the same values as the general path."""

from __future__ import annotations

import pytest
import torch

import accelkit
from accelkit import _runtime
from accelkit._runtime.device import tensors as T

aten = torch.ops.aten


def lowering_of(op):
    return next(entry.fn for entry in _runtime.active().kernels if entry.op == op)


def compiled(op: str) -> int:
    return accelkit.stats()["tpu"]["compiled_programs"].get(op, 0)


def test_a_prepared_call_and_the_general_path_share_one_program(dev):
    # A shape no other test uses: programs are compiled once per process.
    a, b = torch.randn(13, 29, device=dev), torch.randn(13, 29, device=dev)
    before = compiled("aten.add.Tensor")
    through_plan = a + b  # positional arguments: the prepared lane
    assert compiled("aten.add.Tensor") == before + 1
    ctx = _runtime.active()
    general = lowering_of(aten.add.Tensor)(T.read(ctx, a), T.read(ctx, b))  # arrays: no plan
    assert compiled("aten.add.Tensor") == before + 1
    torch.testing.assert_close(through_plan.cpu(), T.from_array(ctx, general).cpu(), rtol=0, atol=0)


def test_a_keyword_float_is_a_program_input_and_shares_the_general_paths_program(dev, monkeypatch):
    # SGD's update, add_(grad, alpha=-lr); a shape no other test uses.
    x, g = torch.randn(11, 17), torch.randn(11, 17)
    acc, grad = x.to(dev), g.to(dev)
    add = lowering_of(aten.add.Tensor)
    before = compiled("aten.add.Tensor")
    with monkeypatch.context() as patch:
        patch.setattr(add, "_structure", lambda *a: pytest.fail("add_ took the general path"))
        for lr in (0.1, 0.01, 0.001):
            acc.add_(grad, alpha=-lr)
            x.add_(g, alpha=-lr)
    torch.testing.assert_close(acc.cpu(), x)
    assert compiled("aten.add.Tensor") == before + 1  # one program for every learning rate
    ctx = _runtime.active()
    general = add(T.read(ctx, acc), T.read(ctx, grad), alpha=-0.5)
    assert compiled("aten.add.Tensor") == before + 1
    torch.testing.assert_close(T.from_array(ctx, general).cpu(), x - 0.5 * g)


def test_a_compile_time_keyword_float_is_left_to_the_general_path(dev):
    from accelkit.sdk import CallLayout, ViewSpec

    norm = lowering_of(aten.linalg_vector_norm.default)
    spec = ViewSpec(torch.float32, (3,), (1,), 0)
    allocator = _runtime.active().allocator
    assert norm.specialize(CallLayout((spec,), (("ord", float),)), allocator) is None
    assert norm.specialize(CallLayout((spec, float)), allocator) is None
    assert norm.specialize(CallLayout((spec, 2)), allocator) is not None  # an int is static anyway


def test_the_cost_estimate_counts_every_prepared_call(dev):
    from accelkit_backends.tpu.cost import COSTS

    a = torch.randn(32, device=dev)
    a + a
    COSTS.reset()
    for _ in range(5):
        a + a
    assert accelkit.stats()["tpu"]["estimate"]["ops"]["aten.add.Tensor"]["calls"] == 5


def test_a_new_storage_size_under_the_same_view_is_compiled_and_counted(dev):
    small = torch.arange(37.0, device=dev)[5:9]  # sizes no other test uses
    large = torch.arange(53.0, device=dev)[5:9]  # the same view geometry over more storage
    before = compiled("aten.neg.default")
    assert (-small).cpu().tolist() == [-5.0, -6.0, -7.0, -8.0]
    assert (-large).cpu().tolist() == [-5.0, -6.0, -7.0, -8.0]
    assert compiled("aten.neg.default") == before + 2


def test_a_compile_time_float_stays_a_compile_time_constant(dev):
    x = torch.tensor([3.0, -4.0, 1.0])
    d = x.to(dev)
    for order in (1.0, 2.0, 3.0, float("inf")):
        got = aten.linalg_vector_norm.default(d, order)
        torch.testing.assert_close(got.cpu(), torch.linalg.vector_norm(x, order))


def test_memory_never_written_reads_as_zeros_through_a_prepared_call(dev):
    fresh = torch.empty(4, device=dev)
    assert (fresh + 1).cpu().tolist() == [1.0] * 4
