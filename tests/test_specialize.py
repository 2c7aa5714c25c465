"""Prepared calls (``accelkit._runtime.dispatch.specialize``): a kernel offering ``specialize`` is asked
once per call layout, and its plans must give exactly what the general path gives.

The kernel here is a ref-backend add that records what the runtime asks of it, driven through
the pipeline's own wrappers for ``aten.add.Tensor`` and ``aten.add_.Tensor`` (called directly, not
registered).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import accelkit
from accelkit import _runtime
from accelkit._runtime.dispatch.pipeline import Pipeline
from accelkit.sdk import CallLayout, KernelDeclined, KernelTable, ViewSpec

aten = torch.ops.aten


class RecordingAdd:
    """``add.Tensor`` on ref arrays, with plans; records layouts, plan calls and general calls."""

    def __init__(self, decline_layouts: bool = False, decline_calls: bool = False):
        self.layouts: list[tuple] = []
        self.plan_calls: list[tuple[int, list]] = []  # (blocks given, numbers given)
        self.general_calls = 0
        self.decline_layouts = decline_layouts
        self.decline_calls = decline_calls

    def __call__(self, x, y, alpha=1):
        self.general_calls += 1
        return torch.add(x, y, alpha=alpha)

    def specialize(self, layout, allocator):
        self.layouts.append(layout)
        if self.decline_layouts:
            return None
        items = [*layout.args, *(item for _, item in layout.kwargs)]
        specs = [item for item in items if type(item) is ViewSpec]

        def plan(blocks, numbers):
            self.plan_calls.append((len(blocks), list(numbers)))
            if self.decline_calls:
                raise KernelDeclined("this test's plan declines every call")
            arrays = iter(allocator.read(b, s) for b, s in zip(blocks, specs))
            values = iter(numbers)

            def value(item):
                return next(arrays) if type(item) is ViewSpec else next(values) if item in (float, complex) else item

            return torch.add(*[value(item) for item in layout.args],
                             **{name: value(item) for name, item in layout.kwargs})

        return plan


@pytest.fixture
def pipeline(dev):
    return Pipeline(_runtime.active())


@pytest.fixture
def add_with(pipeline):
    """``make(kernel)``: the pipeline's PrivateUse1 wrapper of ``kernel`` for add.Tensor."""
    return lambda kernel: pipeline.native(aten.add.Tensor, kernel)


@pytest.fixture
def add_inplace_with(pipeline):
    """``make(kernel)``: the wrapper for add_.Tensor derived from ``kernel``."""
    return lambda kernel: pipeline.native_inplace(aten.add_.Tensor, kernel)


def test_the_first_call_of_a_layout_prepares_a_plan_and_later_calls_reuse_it(dev, add_with):
    kernel = RecordingAdd()
    run = add_with(kernel)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    for _ in range(3):
        out = run(x.to(dev), y.to(dev))
        torch.testing.assert_close(out.cpu(), x + y, rtol=0, atol=0)
    assert kernel.layouts == [CallLayout((ViewSpec(torch.float32, (3, 4), (4, 1), 0),) * 2)]
    assert len(kernel.plan_calls) == 3 and kernel.general_calls == 0


def test_every_geometry_is_its_own_layout_and_views_read_their_own_elements(dev, add_with):
    kernel = RecordingAdd()
    run = add_with(kernel)
    base = torch.arange(12.0).reshape(3, 4)
    d = base.to(dev)
    torch.testing.assert_close(run(d.t(), d.t()).cpu(), base.t() * 2, rtol=0, atol=0)
    torch.testing.assert_close(run(d[1:, 1:], d[:-1, :-1]).cpu(), base[1:, 1:] + base[:-1, :-1])
    assert [layout.args[0] for layout in kernel.layouts] == [
        ViewSpec(torch.float32, (4, 3), (1, 4), 0),
        ViewSpec(torch.float32, (2, 3), (4, 1), 5),
    ]


def test_a_later_call_reads_the_values_its_tensors_hold_then(dev, add_with):
    kernel = RecordingAdd()
    run = add_with(kernel)
    x, y = torch.ones(4).to(dev), torch.ones(4).to(dev)
    assert run(x, y).cpu().tolist() == [2.0] * 4
    x.mul_(5)  # a new buffer content under the same layout
    assert run(x, y).cpu().tolist() == [6.0] * 4
    assert len(kernel.layouts) == 1


def test_python_numbers_are_passed_per_call_and_statics_are_part_of_the_layout(dev, add_with):
    kernel = RecordingAdd()
    run = add_with(kernel)
    x = torch.randn(5).to(dev)
    for value in (0.5, 2.5):
        torch.testing.assert_close(run(x, value).cpu(), x.cpu() + value)
    spec = ViewSpec(torch.float32, (5,), (1,), 0)
    assert kernel.layouts == [CallLayout((spec, float))]
    assert [numbers for _, numbers in kernel.plan_calls] == [[0.5], [2.5]]
    run(x, 3)
    run(x, True)
    # 3 and True are different layouts (True == 1 in Python, and both hash alike).
    assert kernel.layouts[1:] == [CallLayout((spec, 3)), CallLayout((spec, True))]
    assert run(x, True).dtype == torch.float32


def test_keyword_names_are_part_of_the_layout_and_their_numbers_are_passed_per_call(dev, add_with):
    kernel = RecordingAdd()
    run = add_with(kernel)
    x, y = torch.randn(4), torch.randn(4)
    dx, dy = x.to(dev), y.to(dev)
    for alpha in (0.5, -0.25):  # one layout: a float keyword, as SGD's add_(grad, alpha=-lr)
        torch.testing.assert_close(run(dx, dy, alpha=alpha).cpu(), x + alpha * y)
    torch.testing.assert_close(run(dx, dy, alpha=2).cpu(), x + 2 * y)  # a static int keyword
    torch.testing.assert_close(run(dx, dy).cpu(), x + y)  # no keyword: another layout
    spec = ViewSpec(torch.float32, (4,), (1,), 0)
    assert kernel.layouts == [
        CallLayout((spec, spec), (("alpha", float),)),
        CallLayout((spec, spec), (("alpha", 2),)),
        CallLayout((spec, spec)),
    ]
    assert kernel.plan_calls == [(2, [0.5]), (2, [-0.25]), (2, []), (2, [])]
    assert kernel.general_calls == 0


def test_calls_the_lane_does_not_cover_take_the_general_path(dev, add_with):
    kernel = RecordingAdd()
    run = add_with(kernel)
    x, y = torch.randn(4), torch.randn(4)
    torch.testing.assert_close(run(x.to(dev), torch.tensor(2.0)).cpu(), x + 2)  # a host tensor
    torch.testing.assert_close(  # a host tensor as a keyword argument's value
        run(x.to(dev), y.to(dev), alpha=torch.tensor(2.0)).cpu(), x + 2 * y)
    z = torch.randn(4, dtype=torch.complex64)
    torch.testing.assert_close(run(z.to(dev).conj(), z.to(dev)).cpu(), z.conj() + z)  # conj bit
    assert kernel.layouts == [] and kernel.general_calls == 3


def test_a_declined_layout_is_asked_once_and_then_always_runs_the_kernel(dev, add_with):
    kernel = RecordingAdd(decline_layouts=True)
    run = add_with(kernel)
    x = torch.randn(4)
    for _ in range(3):
        torch.testing.assert_close(run(x.to(dev), x.to(dev)).cpu(), x * 2)
    assert len(kernel.layouts) == 1 and kernel.general_calls == 3


def test_a_plan_declining_a_call_hands_it_to_the_cpu_fallback(dev, add_with):
    kernel = RecordingAdd(decline_calls=True)
    run = add_with(kernel)
    x = torch.randn(4)
    before = accelkit.stats()["ops"].get("aten.add.Tensor", {}).get("fallback", 0)
    with accelkit.fallback_policy("allow"):
        out = run(x.to(dev), x.to(dev))
    torch.testing.assert_close(out.cpu(), x * 2)
    assert len(kernel.plan_calls) == 1 and kernel.general_calls == 0
    assert accelkit.stats()["ops"]["aten.add.Tensor"]["fallback"] == before + 1


@pytest.fixture
def add_declining_to(dev):
    """``make(kernel, decomposition)``: add.Tensor's wrapper of ``kernel`` in a pipeline whose
    backend sends the calls it declines to ``decomposition`` (KernelTable.decompose_declined)."""
    def make(kernel, decomposition):
        table = KernelTable("test")
        table.add(aten.add.Tensor, kernel)
        table.decompose_declined(aten.add.Tensor, decomposition)
        pipeline = Pipeline(dataclasses.replace(_runtime.active(), kernels=table))
        return pipeline.native(aten.add.Tensor, kernel)

    return make


def _add_by_subtracting(x, y, alpha=1):
    return torch.sub(x, y, alpha=-alpha)


@pytest.mark.parametrize("declining", ["plan", "kernel"])
def test_a_declined_call_runs_the_decomposition_its_backend_named(dev, add_declining_to, declining):
    kernel = RecordingAdd(decline_calls=True) if declining == "plan" else _declining_add
    run = add_declining_to(kernel, _add_by_subtracting)
    x = torch.randn(4)
    before = accelkit.stats()["ops"].get("aten.add.Tensor", {})
    with accelkit.fallback_policy("deny"):
        out = run(x.to(dev), x.to(dev))
    torch.testing.assert_close(out.cpu(), x * 2)
    counts = accelkit.stats()["ops"]["aten.add.Tensor"]
    assert counts["decomposed"] == before.get("decomposed", 0) + 1
    assert counts.get("fallback", 0) == before.get("fallback", 0)


def _declining_add(x, y, alpha=1):
    raise KernelDeclined("this test's kernel declines every call")


def test_a_decomposition_that_returns_not_implemented_leaves_the_call_to_the_cpu(dev, add_declining_to):
    run = add_declining_to(_declining_add, lambda x, y, alpha=1: NotImplemented)
    x = torch.randn(4)
    before = accelkit.stats()["ops"].get("aten.add.Tensor", {}).get("fallback", 0)
    with accelkit.fallback_policy("allow"):
        torch.testing.assert_close(run(x.to(dev), x.to(dev)).cpu(), x * 2)
    assert accelkit.stats()["ops"]["aten.add.Tensor"]["fallback"] == before + 1


def test_decompose_declined_needs_the_kernel_first_and_takes_one_decomposition():
    table = KernelTable("test")
    with pytest.raises(ValueError, match="has no kernel to decline"):
        table.decompose_declined(aten.add.Tensor, _add_by_subtracting)
    table.add(aten.add.Tensor, _declining_add)
    table.add(aten.relu, torch.relu)
    table.decompose_declined(aten.add.Tensor, _add_by_subtracting)
    table.decompose_declined(aten.relu, torch.nn.functional.relu)  # a packet stands for .default
    assert dict(table.declined_decompositions) == {
        aten.add.Tensor: _add_by_subtracting, aten.relu.default: torch.nn.functional.relu}
    with pytest.raises(ValueError, match="already sends declined calls to _add_by_subtracting"):
        table.decompose_declined(aten.add.Tensor, _add_by_subtracting)


def test_results_through_a_prepared_plan_count_as_native(dev, add_with):
    run = add_with(RecordingAdd())
    x = torch.randn(4).to(dev)
    before = accelkit.stats()["ops"].get("aten.add.Tensor", {}).get("native", 0)
    for _ in range(3):
        run(x, x)
    assert accelkit.stats()["ops"]["aten.add.Tensor"]["native"] == before + 3


def test_later_results_get_the_shape_dtype_and_fresh_memory_of_the_first(dev, add_with):
    run = add_with(RecordingAdd())
    x = torch.arange(6, dtype=torch.int32).reshape(2, 3).to(dev)
    first, second = run(x, 1), run(x, 2)
    assert (second.shape, second.stride(), second.dtype) == ((2, 3), (3, 1), torch.int32)
    assert second.untyped_storage().nbytes() == 24
    assert second.untyped_storage().payload is not first.untyped_storage().payload
    assert first.cpu().tolist() == [[1, 2, 3], [4, 5, 6]]
    assert second.cpu().tolist() == [[2, 3, 4], [5, 6, 7]]


def test_an_inplace_variant_writes_each_prepared_result_into_self(dev, add_inplace_with):
    kernel = RecordingAdd()
    run = add_inplace_with(kernel)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    dx, dy = x.to(dev), y.to(dev)
    for alpha in (1.0, -0.5, 2.0):
        assert run(dx, dy, alpha=alpha) is dx
        x.add_(y, alpha=alpha)
        torch.testing.assert_close(dx.cpu(), x)
    column = dx[:, 1]  # a strided view of self's storage writes through to it
    run(column, torch.ones(3).to(dev))
    x[:, 1] += 1
    torch.testing.assert_close(dx.cpu(), x)
    assert len(kernel.layouts) == 2 and kernel.general_calls == 0 and len(kernel.plan_calls) == 4


def test_an_inplace_result_is_cast_to_selfs_dtype_like_cpu(dev, add_inplace_with):
    run = add_inplace_with(RecordingAdd())
    x, y = torch.randn(5).to(torch.bfloat16), torch.randn(5)
    dx, dy = x.to(dev), y.to(dev)
    for _ in range(2):  # the first call checks the cast, the second repeats it
        run(dx, dy)
        x.add_(y)
        assert dx.dtype == torch.bfloat16
        torch.testing.assert_close(dx.cpu(), x, rtol=0, atol=0)


def test_an_inplace_result_self_cannot_hold_fails_every_time_and_writes_nothing(dev, add_inplace_with):
    run = add_inplace_with(RecordingAdd())
    small, wide = torch.zeros(1).to(dev), torch.ones(3).to(dev)
    integers = torch.zeros(3, dtype=torch.int64).to(dev)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
            run(small, wide)
        with pytest.raises(RuntimeError, match="result type Float can't be cast"):
            run(integers, wide)
    assert small.cpu().tolist() == [0.0] and integers.cpu().tolist() == [0, 0, 0]


def test_an_inplace_call_on_a_broadcast_view_goes_to_the_cpu_kernel_every_time(dev, add_inplace_with):
    kernel = RecordingAdd()
    run = add_inplace_with(kernel)
    expanded = torch.zeros(1).to(dev).expand(3)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="single memory location"):
            run(expanded, torch.ones(3).to(dev))
    assert kernel.plan_calls == [] and kernel.general_calls == 0


class RecordingForeachAdd:
    """``_foreach_add.List`` on ref arrays, with plans for layouts with lists of tensors (when
    ``lists``); records layouts, plan calls and general calls."""

    def __init__(self, lists: bool = True):
        self.specializes_tensor_lists = lists
        self.layouts: list[CallLayout] = []
        self.plan_calls = 0
        self.general_calls = 0

    def __call__(self, xs, ys, alpha=1):
        self.general_calls += 1
        return [torch.add(x, y, alpha=alpha) for x, y in zip(xs, ys)]

    def specialize(self, layout, allocator):
        self.layouts.append(layout)
        (xs, ys), names = layout.args, [name for name, _ in layout.kwargs]

        def plan(blocks, numbers):
            self.plan_calls += 1
            arrays = [allocator.read(b, s) for b, s in zip(blocks, (*xs, *ys))]
            alpha = {"alpha": numbers[0]} if names else {}
            return [torch.add(x, y, **alpha) for x, y in zip(arrays[:len(xs)], arrays[len(xs):])]

        return plan


@pytest.fixture
def foreach_add_inplace_with(pipeline):
    """``make(kernel)``: the wrapper for _foreach_add_.List derived from ``kernel``."""
    return lambda kernel: pipeline.native_inplace(aten._foreach_add_.List, kernel)


def test_lists_of_tensors_are_one_layout_with_their_specs_and_each_result_is_written(dev, foreach_add_inplace_with):
    kernel = RecordingForeachAdd()
    run = foreach_add_inplace_with(kernel)
    xs, ys = [torch.randn(3, 4), torch.randn(5)], [torch.randn(3, 4), torch.randn(5)]
    dxs, dys = [x.to(dev) for x in xs], [y.to(dev) for y in ys]
    for alpha in (1.0, -0.5, 2.0):
        assert run(dxs, dys, alpha=alpha) is None
        for x, y in zip(xs, ys):
            x.add_(y, alpha=alpha)
        for dx, x in zip(dxs, xs):
            torch.testing.assert_close(dx.cpu(), x)
    specs = tuple(ViewSpec(torch.float32, tuple(x.shape), x.stride(), 0) for x in xs)
    assert kernel.layouts == [CallLayout((specs, specs), (("alpha", float),))]
    assert kernel.plan_calls == 3 and kernel.general_calls == 0


def test_a_list_result_a_tensor_cannot_hold_fails_every_time_and_writes_no_tensor(dev, foreach_add_inplace_with):
    run = foreach_add_inplace_with(RecordingForeachAdd())
    first, integers = torch.zeros(3).to(dev), torch.zeros(3, dtype=torch.int64).to(dev)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="result type Float can't be cast"):
            run([first, integers], [torch.ones(3).to(dev), torch.ones(3).to(dev)])
    assert first.cpu().tolist() == [0.0, 0.0, 0.0] and integers.cpu().tolist() == [0, 0, 0]


def test_lists_of_tensors_take_the_general_path_unless_the_kernel_takes_them(dev, foreach_add_inplace_with):
    kernel = RecordingForeachAdd(lists=False)
    run = foreach_add_inplace_with(kernel)
    x = torch.zeros(3).to(dev)
    run([x], [torch.ones(3).to(dev)])
    assert x.cpu().tolist() == [1.0, 1.0, 1.0]
    assert kernel.layouts == [] and kernel.general_calls == 1
