"""Prepared calls on tpu: ``Lowering.specialize`` plans must run the same program, count the
same compiles and costs, and read the same values as the general path."""

from __future__ import annotations

import torch

import accelkit
from accelkit import _runtime
from accelkit._runtime import _tensors as T

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
