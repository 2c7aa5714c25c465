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


# -- results shared by many tensors: fill and zero, whose result ignores the tensor's contents ----


def array_of(t):
    return T.buffer_of(t).block.array


def test_small_fills_share_one_array_and_stay_independent_tensors(dev):
    made = [torch.full((3, 7), 2.5, device=dev) for _ in range(4)]  # a shape no other test uses
    assert array_of(made[2]) is array_of(made[3])  # the program ran for the first two
    made[3].add_(1)  # a write gives its block a new array
    made[2][0, 1] = -1.0  # so does a write through a view
    assert made[3].cpu().tolist() == [[3.5] * 7] * 3
    assert made[2].cpu()[0].tolist() == [2.5, -1.0] + [2.5] * 5
    assert made[1].cpu().tolist() == [[2.5] * 7] * 3
    zeros = [torch.zeros(3, 7, device=dev) for _ in range(3)]
    assert array_of(zeros[1]) is array_of(zeros[2]) and zeros[2].cpu().abs().sum().item() == 0.0
    other = [torch.full((3, 7), 4.0, device=dev) for _ in range(3)]
    assert array_of(other[2]) is not array_of(made[1]) and other[2].cpu().tolist() == [[4.0] * 7] * 3


def test_a_shared_fill_keeps_the_sign_of_zero(dev):
    for value in (-0.0, 0.0, -0.0, 0.0, -0.0, 0.0):
        got = torch.full((5,), value, device=dev).cpu()
        assert torch.signbit(got).tolist() == [str(value).startswith("-")] * 5


def test_in_place_fills_of_a_whole_tensor_share_and_of_a_view_write_only_the_view(dev):
    a, b = torch.randn(2, 9, device=dev), torch.randn(2, 9, device=dev)
    for t in (a, b, a, b):
        t.fill_(0.25)
    assert array_of(a) is array_of(b)
    rows = torch.randn(4, 9, device=dev)
    expected = rows.cpu()
    for _ in range(3):
        rows[1:3].zero_()
    expected[1:3] = 0
    assert rows.cpu().tolist() == expected.tolist()


def test_shared_results_are_accounted_per_tensor_and_counted_per_call(dev):
    from accelkit_backends.tpu.cost import COSTS

    torch.zeros(6, 5, device=dev), torch.zeros(6, 5, device=dev)
    COSTS.reset()
    before = torch.tpu.memory_allocated()
    held = [torch.zeros(6, 5, device=dev) for _ in range(5)]
    assert len({id(array_of(t)) for t in held}) == 1
    assert torch.tpu.memory_allocated() - before >= 5 * 6 * 5 * 4  # each tensor is its own block
    assert accelkit.stats()["tpu"]["estimate"]["ops"]["aten.zero.default"]["calls"] == 5


def test_a_large_fill_is_not_kept(dev):
    made = [torch.full((129, 128), 1.5, device=dev) for _ in range(3)]  # 66 KB, over the 64 KiB kept
    assert array_of(made[1]) is not array_of(made[2])
    assert made[2].cpu().eq(1.5).all()


def test_synchronize_waits_for_the_programs_before_a_shared_result(dev):
    a = torch.randn(1500, 1500, device=dev)
    for _ in range(3):
        torch.zeros(11, 3, device=dev)
    torch.tpu.synchronize()
    y = a @ a  # about 7 GFLOP: far longer than a dispatch
    z = torch.zeros(11, 3, device=dev)  # the last array adopted: shared, finished long ago
    assert not array_of(y).is_ready(), "strict mode should dispatch asynchronously"
    torch.tpu.synchronize()
    assert array_of(y).is_ready()
    assert z.cpu().abs().sum().item() == 0.0


def test_fills_in_fused_mode_read_as_in_strict_mode(dev):
    from accelkit_backends.tpu import execution_mode

    with execution_mode("fused"):
        made = [torch.full((2, 11), 3.0, device=dev) + 1 for _ in range(4)]
        assert [t.cpu().tolist() for t in made] == [[[4.0] * 11] * 2] * 4
