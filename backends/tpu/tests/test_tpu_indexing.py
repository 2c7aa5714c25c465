"""tpu indexing ops (kernels/indexing.py) compared with PyTorch on CPU: advanced indexing and
index_put (negative, repeated and boolean indices, accumulation), index_select, gather, take,
scatter and its reductions, index_add/copy/fill/reduce, masked_scatter and masked_select, the
data-dependent shapes (nonzero, unique and its variants), put, repeat_interleave, searchsorted and
bucketize, and the range factories (arange, linspace, logspace, eye, their ``out=`` forms) and
one_hot. Shape ops (cat, padding, flips, triangles, view scatters) are in ``test_tpu_shape.py``.

Each check runs the same call on CPU tensors and on tpu copies (non-contiguous views are re-made
on the device with the same geometry) under the ``deny`` fallback policy, so any CPU fallback
fails the test; in-place calls compare the mutated inputs too. Backward passes compare the
gradients. Indices include negative and repeated entries where PyTorch defines the result.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import accelkit
from harness_indexing import assert_native, compare, compare_grad, sample, transposed

aten = torch.ops.aten
DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.bool]
FLOAT_DTYPES = [torch.float32, torch.bfloat16]


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def sum_tolerance(dtype):
    """bfloat16 sums: CPU rounds after every addition, tpu accumulates in float32 and rounds
    once, so results may differ by the rounding of the partial sums."""
    return {"atol": 3e-2, "rtol": 3e-2} if dtype == torch.bfloat16 else {}


def long(*values):
    return torch.tensor(values, dtype=torch.int64)


# ---------------------------------------------------------------------------------------------
# Advanced indexing
# ---------------------------------------------------------------------------------------------

INDEXING = {
    "rows_negative_repeated": lambda x: x[long(0, -1, 2, 2)],
    "columns": lambda x: x[:, long(-1, 0)],
    "two_tensors_broadcast": lambda x: x[long(0, 1, -1).reshape(3, 1), long(1, 2)],
    "new_axis_then_index": lambda x: x[None, long(1, 2)],
    "zero_dim_index": lambda x: aten.index.Tensor(x, [torch.tensor(-2, device=x.device)]),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", sorted(INDEXING))
def test_index_matches_cpu(dev, case, dtype):
    compare(dev, INDEXING[case], transposed((4, 5), dtype))
    assert_native("aten.index.Tensor")


def test_index_separated_advanced_dims_move_first(dev):
    x = transposed((3, 4, 5))
    compare(dev, lambda t: t[long(0, -1), :, long(1, 4)], x)
    compare(dev, lambda t: t[long(0, 3, 1, 1).reshape(2, 2)], x[0])
    compare(dev, lambda t, i: torch.take(t, i), x, long(0, -1, 5, 5))
    assert_native("aten.index.Tensor")


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=str)
def test_boolean_mask_index_is_native(dev, dtype):
    x = transposed((4, 6), dtype)
    mask = sample((4, 6), torch.bool, seed=1)
    compare(dev, lambda t, m: t[m], x, mask)
    compare(dev, lambda t, m: t[:, m[0]], x, mask)
    compare(dev, lambda t, m: t[m & False], x, mask)  # nothing selected
    x3 = sample((2, 3, 4))
    compare(dev, lambda t, m: t[m], x3, sample((2, 3), torch.bool, seed=2))
    assert_native("aten.index.Tensor")


def test_boolean_mask_of_the_wrong_shape_raises_like_cpu(dev):
    x, mask = sample((4, 6)), sample((4, 5), torch.bool)
    with pytest.raises(IndexError) as on_cpu:
        x[mask]
    with pytest.raises(IndexError) as on_tpu:
        x.to(dev)[mask.to(dev)]
    assert str(on_tpu.value) == str(on_cpu.value)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_index_put_matches_cpu(dev, dtype):
    x = transposed((5, 4), dtype)
    rows = long(0, -1, 3)
    values = sample((3, 4), dtype, seed=3)
    compare(dev, lambda t, v: t.index_put((rows,), v), x, values)
    compare(dev, lambda t, v: t.index_put((rows, long(1, 2, -2)), v[:, 0]), x, values)
    compare(dev, lambda t, v: t.__setitem__((slice(None), long(2, 0)), v[:2, :1].T), x, values)  # on a view
    assert_native("aten.index_put.default", "aten.index_put_.default")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_index_put_accumulates_repeated_indices(dev, dtype):
    x = sample((5, 3), dtype)
    values = sample((6, 3), dtype, seed=4)
    repeated = long(1, 1, -4, 4, 4, 4)  # -4 is row 1 again
    tol = sum_tolerance(dtype)
    compare(dev, lambda t, v: t.index_put((repeated,), v, accumulate=True), x, values, **tol)
    compare(dev, lambda t, v: t.index_put_((repeated, long(0, 0, 0, 2, 2, 1)), v[:, 0], accumulate=True),
            x, values, **tol)
    assert_native("aten.index_put.default", "aten.index_put_.default")


def test_setitem_through_python_indexing(dev):
    def writes(t, mask, values):
        t[long(1, -1)] = 7.0
        t[:, long(0)] += 1.0
        t[mask] = 0.0  # one value for every selected element: no count needed
        t[mask[:, 0]] = values[0]  # rows selected by a mask, all given one row
        t[t.abs() > 1.5] = values.flatten()[: int((t.abs() > 1.5).sum())]  # one value per element
        return t

    x = transposed((4, 3))
    compare(dev, writes, x, sample((4, 3), torch.bool, seed=5), sample((4, 3), seed=6))
    assert_native("aten.index_put_.default")


def test_masked_write_accumulates_and_covers_bool(dev):
    mask = sample((3, 4), torch.bool, seed=7)
    compare(dev, lambda t, m: t.index_put_((m,), torch.tensor(2.0), accumulate=True), sample((3, 4)), mask)
    compare(dev, lambda t, m: t.__setitem__((slice(None), m[0]), True), sample((3, 4), torch.bool), mask)
    assert_native("aten.index_put_.default")


def test_index_backward_accumulates_repeated_rows(dev):
    rows = long(2, 0, 2, -1)
    compare_grad(dev, lambda t: t[rows] * 2, transposed((4, 3)))
    compare_grad(dev, lambda t: t[:, long(1, 1)], sample((4, 3)))
    compare_grad(dev, lambda t, m: t[m], sample((4, 3)), sample((4, 3), torch.bool))
    assert_native("aten.index.Tensor")


# ---------------------------------------------------------------------------------------------
# index_select, gather, scatter, index_add/copy/fill, masked_scatter
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool], ids=str)
def test_index_select_and_gather(dev, dtype):
    x = transposed((4, 5), dtype)
    compare(dev, lambda t, i: t.index_select(1, i), x, long(4, 0, 0))
    compare(dev, lambda t, i: t.index_select(0, i), x, torch.tensor(3))
    index = torch.tensor([[0, 4, 4], [1, 0, 2], [3, 3, 3]])
    compare(dev, lambda t, i: t.gather(1, i), x, index)  # index smaller than x in dim 0
    compare(dev, lambda t, i: t.gather(0, i), x, index.T[:, :2].clamp(max=3))
    compare(dev, lambda t, i: torch.take_along_dim(t, i, dim=1), x, long(1, -1, 0, 4).reshape(4, 1))
    assert_native("aten.index_select.default", "aten.gather.default")


def test_index_select_and_gather_backward(dev):
    x = transposed((4, 5))
    compare_grad(dev, lambda t, i: t.index_select(0, i), x, long(1, 1, 3))
    compare_grad(dev, lambda t, i: t.gather(1, i), x, torch.tensor([[0, 0], [4, 1], [2, 2], [3, 0]]))
    compare_grad(dev, lambda t, i: torch.take_along_dim(t, i, 1), x, long(1, 1, 0, 4).reshape(4, 1))
    assert_native("aten.index_select.default", "aten.gather.default", "aten.index_add_.default",
                  "aten.scatter_add_.default")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool], ids=str)
def test_scatter_overwrites(dev, dtype):
    x = transposed((3, 5), dtype)
    index = torch.tensor([[4, 0, 2], [1, 3, 0]])  # distinct per row: PyTorch defines the result
    src = sample((2, 4), dtype, seed=8)  # larger than index: only its corner is read
    compare(dev, lambda t, s, i: t.scatter(1, i, s), x, src, index)
    compare(dev, lambda t, i: t.scatter(1, i, 1), x, index)
    compare(dev, lambda t, i: t.scatter_(0, i, 0), x, index[:, :2].clamp(max=2))
    assert_native("aten.scatter.src", "aten.scatter.value", "aten.scatter_.value")


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_scatter_add_and_reduce_with_repeated_indices(dev, dtype):
    """Every reduction on float32; the ones where the dtype matters (bf16 sums, integer mean's
    floor division, products) on the others."""
    x = sample((3, 4), dtype)
    index = torch.tensor([[0, 0, 3, 3, 3], [1, 2, 1, 1, 0], [2, 2, 2, 0, 0]])
    src = sample((3, 5), dtype, seed=9)
    tol = sum_tolerance(dtype)
    compare(dev, lambda t, s, i: t.scatter_add(1, i, s), x, src, index, **tol)
    compare(dev, lambda t, s, i: t.scatter(1, i, s, reduce="add"), x, src, index, **tol)
    compare(dev, lambda t, s, i: t.scatter(1, i, s, reduce="multiply"), x, src, index, **tol)
    reduces = ("sum", "prod", "mean", "amax", "amin") if dtype == torch.float32 else ("mean", "prod")
    for reduce in reduces:
        for include_self in (True, False):
            compare(dev, lambda t, s, i, r=reduce, keep=include_self: t.scatter_reduce(1, i, s, r, include_self=keep),
                    x, src, index, **tol)
    assert_native("aten.scatter_add.default", "aten.scatter.reduce", "aten.scatter_reduce.two")


def test_scatter_and_scatter_add_backward(dev):
    index = torch.tensor([[0, 2], [1, 1]])
    compare_grad(dev, lambda t, s, i: t.scatter(1, i, s), sample((2, 3)), sample((2, 2), seed=1), index)
    compare_grad(dev, lambda t, s, i: t.scatter_add(0, i, s), sample((3, 3)), sample((2, 2), seed=2), index)
    assert_native("aten.scatter.src", "aten.scatter_add.default", "aten.gather.default")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_index_add_copy_fill(dev, dtype):
    x = transposed((4, 5), dtype)
    source = sample((4, 3), dtype, seed=10)
    tol = sum_tolerance(dtype)
    repeated = long(4, 0, 4)  # accumulates
    compare(dev, lambda t, s, i: t.index_add(1, i, s), x, source, repeated, **tol)
    compare(dev, lambda t, s, i: t.index_add(1, i, s, alpha=2), x, source, repeated, **tol)
    compare(dev, lambda t, s, i: t.index_copy(1, i, s), x, source, long(3, 0, 1))
    compare(dev, lambda t, i: t.index_fill(0, i, 3), x, long(-1, 1))
    compare(dev, lambda t, i: t.index_fill_(1, i, torch.tensor(-2).to(dtype)), x, long(2))
    assert_native("aten.index_add.default", "aten.index_copy.default", "aten.index_fill.int_Scalar",
                  "aten.index_fill_.int_Tensor")


def test_index_add_copy_fill_backward(dev):
    index = long(2, 0)
    compare_grad(dev, lambda t, s, i: t.index_add(0, i, s, alpha=3.0), sample((3, 2)), sample((2, 2), seed=1), index)
    compare_grad(dev, lambda t, s, i: t.index_copy(1, i[:1], s), sample((2, 3)), sample((2, 1), seed=2), index)
    compare_grad(dev, lambda t, i: t.index_fill(1, i, 0.5), sample((2, 3)), index)
    assert_native("aten.index_add.default", "aten.index_copy.default")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool], ids=str)
def test_masked_scatter(dev, dtype):
    x = transposed((3, 4), dtype)
    mask = sample((3, 4), torch.bool, seed=11)
    source = sample((4, 4), dtype, seed=12)
    compare(dev, lambda t, m, s: t.masked_scatter(m, s), x, mask, source)
    compare(dev, lambda t, m, s: t.masked_scatter(m[0], s), x, mask, source)  # broadcast mask
    assert_native("aten.masked_scatter.default")


def test_masked_scatter_and_masked_select_backward(dev):
    mask = sample((3, 4), torch.bool, seed=13)
    compare_grad(dev, lambda t, s: t.masked_scatter(mask.to(t.device), s), sample((3, 4)), sample((12,), seed=3))
    compare_grad(dev, lambda t: t.masked_select(mask.to(t.device)), sample((3, 4)))
    assert_native("aten.masked_scatter.default", "aten.masked_select.default")


# ---------------------------------------------------------------------------------------------
# Data-dependent shapes: nonzero, masked_select, unique
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool], ids=str)
def test_nonzero_and_masked_select(dev, dtype):
    x = transposed((4, 5), dtype)
    mask = sample((5,), torch.bool, seed=14)
    compare(dev, torch.nonzero, x)
    compare(dev, lambda t: torch.nonzero(t, as_tuple=True), x)
    compare(dev, lambda t, m: t.masked_select(m), x, mask)  # mask broadcasts over rows
    compare(dev, lambda t: torch.nonzero(t[:0]), x)  # empty input
    compare(dev, lambda t: torch.nonzero(torch.zeros_like(t)), x)  # nothing selected
    compare(dev, lambda t: t[0, 0].masked_select(t[1, 1].bool()), x)  # 0-d
    assert_native("aten.nonzero.default", "aten.masked_select.default")


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=str)
def test_unique_is_sorted_with_inverse_and_counts(dev, dtype):
    x = transposed((3, 6), dtype)
    compare(dev, torch.unique, x)
    compare(dev, lambda t: torch.unique(t, sorted=False, return_inverse=True, return_counts=True), x)
    compare(dev, lambda t: torch.unique(t[:0], return_counts=True), x)
    assert_native("aten._unique2.default")


def test_unique_consecutive_and_unique_dim(dev):
    x = torch.tensor([[3, 1], [3, 1], [1, 2], [3, 1]])
    compare(dev, lambda t: torch.unique_consecutive(t, return_inverse=True, return_counts=True), x)
    compare(dev, lambda t: torch.unique_consecutive(t, return_counts=True, dim=0), x)
    compare(dev, lambda t: torch.unique(t, dim=0, return_inverse=True, return_counts=True), x)
    compare(dev, lambda t: torch.unique(t.float(), dim=1), x)
    assert_native("aten.unique_consecutive.default", "aten.unique_dim.default")


def test_unique_consecutive_and_searchsorted_with_a_zero_size_dimension(dev):
    # A zero-size dimension made the row count -1 ambiguous (a ZeroDivisionError from jax).
    compare(dev, lambda t: torch.unique_consecutive(t, dim=1), torch.zeros(5, 0, 5))
    compare(dev, lambda b, v: torch.searchsorted(b, v), torch.zeros(0, 0), torch.zeros(0, 0))
    compare(dev, lambda b, v: torch.searchsorted(b, v), torch.zeros(3, 0), torch.zeros(3, 2))


def test_put_index_reduce_repeat_interleave_nonzero_static(dev):
    x = transposed((4, 5))
    compare(dev, lambda t, i, s: t.put(i, s, accumulate=True), x, long(0, -1, 0), sample((3,), seed=1))
    compare(dev, lambda t, i, s: t.put_(i, s), x, long(3, -2), sample((2,), seed=1))
    for reduce in ("prod", "mean", "amax", "amin"):
        compare(dev, lambda t, i, s, r=reduce: t.index_reduce(1, i, s, r, include_self=False), x, long(4, 0, 4),
                sample((4, 3), seed=2))
    compare(dev, lambda t, r: torch.repeat_interleave(t, r, dim=0), x, long(1, 0, 3, 1))
    compare(dev, lambda t: torch.nonzero_static(t, size=25, fill_value=-7), x)
    assert_native("aten.put.default", "aten.put_.default", "aten.index_reduce.default",
                  "aten.repeat_interleave.Tensor", "aten.nonzero_static.default")


# ---------------------------------------------------------------------------------------------
# searchsorted, bucketize
# ---------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:.*input value tensor is non-contiguous")
def test_searchsorted_and_bucketize(dev):
    boundaries = torch.tensor([-3.0, -1, 0, 0, 2, 4])
    values = transposed((3, 4))
    for right in (False, True):
        compare(dev, lambda b, v, r=right: torch.searchsorted(b, v, right=r), boundaries, values)
        compare(dev, lambda v, b, r=right: torch.bucketize(v, b, right=r, out_int32=True), values, boundaries)
    compare(dev, lambda b, v: torch.searchsorted(b, v, side="right"), boundaries, values)
    compare(dev, lambda b: torch.searchsorted(b, 0), boundaries)
    compare(dev, lambda b: torch.bucketize(1, b), boundaries)
    compare(dev, lambda b, v: torch.searchsorted(b, v), boundaries.long(), values.long())
    rows = torch.sort(sample((3, 5), seed=15), dim=1).values
    compare(dev, lambda b, v: torch.searchsorted(b, v), rows, values)  # one sequence per row
    order = torch.argsort(boundaries.flip(0))
    compare(dev, lambda b, v, s: torch.searchsorted(b, v, sorter=s), boundaries.flip(0), values, order)
    assert_native("aten.searchsorted.Tensor", "aten.searchsorted.Scalar", "aten.bucketize.Tensor",
                  "aten.bucketize.Scalar")


# ---------------------------------------------------------------------------------------------
# Range factories, eye, one_hot
# ---------------------------------------------------------------------------------------------

ARANGES = [(10,), (2.5,), (-3, 7, 2), (5, 0, -1), (0, 1, 0.1), (0.5, -2.0, -0.25)]


INTEGER_ARANGES = [(dtype, bounds) for dtype in (torch.int64, torch.int32)
                   for bounds in [(2.1, -2.9, -1.0), (-1.5, 4, 1.7), (5.9, 0, -2.5)]]
INTEGER_ARANGES += [(torch.int64, (0, 3, 0.5)), (torch.uint8, (5.9, 0, -2.5)), (torch.uint8, (0.7, 9.2, 2.9))]
INTEGER_ARANGES += [pytest.param(torch.int32, (0, 3, 0.5), marks=pytest.mark.xfail(
    strict=True, raises=RuntimeError,
    reason="CPU's int32 kernel truncates the step 0.5 to 0 and returns six zeros; PyTorch's meta "
           "kernel, which tpu takes the length from, refuses the step: an error, not other values"))]


@pytest.mark.parametrize("dtype, bounds", INTEGER_ARANGES, ids=str)
def test_an_integer_arange_with_float_bounds_truncates_start_and_step_first_as_the_cpu(dev, dtype, bounds):
    try:
        want = torch.arange(*bounds, dtype=dtype)
    except ValueError as exc:  # a step that truncates to 0
        with pytest.raises(ValueError, match=str(exc)):
            torch.arange(*bounds, dtype=dtype, device=dev)
        return
    assert torch.equal(torch.arange(*bounds, dtype=dtype, device=dev).cpu(), want)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8], ids=str)
@pytest.mark.parametrize("bounds", [(4.3, -3, 50), (4.3, 1, 50), (-7.9, 20.5, 30), (3, 3.9, 1), (2.5, 9.5, 0)], ids=str)
def test_an_integer_linspace_truncates_its_bounds_first_and_is_exact(dev, dtype, bounds):
    if dtype == torch.uint8 and min(bounds[:2]) < 0:
        return
    with accelkit.fallback_policy("deny"):
        got = torch.linspace(*bounds, dtype=dtype, device=dev).cpu()
    assert torch.equal(got, torch.linspace(*bounds, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=str)
@pytest.mark.parametrize("bounds", [(0, 1.2, 2), (0, 1.2, 4), (0, 1.2, 2, 5.0), (-0.5, 3.7, 5, 2.0), (0.9, 2.9, 3, 2.5)], ids=str)
def test_an_integer_logspace_truncates_its_bounds_first(dev, dtype, bounds):
    with accelkit.fallback_policy("deny"):
        got = torch.logspace(*bounds, dtype=dtype, device=dev).cpu()
    assert torch.equal(got, torch.logspace(*bounds, dtype=dtype))


@pytest.mark.parametrize("bounds", ARANGES, ids=str)
def test_arange_is_native(dev, bounds):
    with accelkit.fallback_policy("deny"):
        for dtype in (None, torch.bfloat16, torch.int64):
            if dtype == torch.int64 and any(isinstance(b, float) for b in bounds):
                continue
            torch.testing.assert_close(torch.arange(*bounds, device=dev, dtype=dtype).cpu(),
                                       torch.arange(*bounds, dtype=dtype))
    assert sum(accelkit.stats()["ops"].get(f"aten.arange.{o}", {}).get("native", 0)
               for o in ("default", "start", "start_step")) > 0
    assert_native()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_linspace_logspace_eye(dev, dtype):
    with accelkit.fallback_policy("deny"):
        for start, end, steps in [(0, 1, 7), (-2.0, 3.0, 1), (3, -1, 11)]:
            torch.testing.assert_close(torch.linspace(start, end, steps, device=dev, dtype=dtype).cpu(),
                                       torch.linspace(start, end, steps, dtype=dtype))
            if dtype.is_floating_point:
                for base in (10.0, 2.0)[: 1 if dtype == torch.bfloat16 else 2]:
                    torch.testing.assert_close(
                        torch.logspace(start, end, steps, base, device=dev, dtype=dtype).cpu(),
                        torch.logspace(start, end, steps, base, dtype=dtype))
        torch.testing.assert_close(torch.eye(3, device=dev, dtype=dtype).cpu(), torch.eye(3, dtype=dtype))
        torch.testing.assert_close(torch.eye(2, 4, device=dev, dtype=dtype).cpu(), torch.eye(2, 4, dtype=dtype))
    assert_native("aten.linspace.default", "aten.eye.default", "aten.eye.m")


def test_factories_with_out_run_natively(dev):
    """C++ composites (mvlgamma, ...) call ``arange_out`` and friends: the runtime derives these
    ``out=`` overloads from the functional factories."""
    with accelkit.fallback_policy("deny"):
        out = torch.empty(0, device=dev)
        torch.testing.assert_close(torch.arange(1, 10, 3, out=out).cpu(), torch.arange(1, 10, 3.0))
        ints = torch.empty(0, dtype=torch.int64, device=dev)
        torch.testing.assert_close(torch.arange(5, out=ints).cpu(), torch.arange(5))
        torch.testing.assert_close(torch.linspace(-1, 1, 5, out=out).cpu(), torch.linspace(-1, 1, 5))
        torch.testing.assert_close(torch.eye(2, 3, out=out).cpu(), torch.eye(2, 3))
    assert_native("aten.arange.start_out", "aten.arange.out", "aten.linspace.out", "aten.eye.m_out")


def test_one_hot(dev):
    labels = torch.tensor([[0, 3], [2, 2]])
    compare(dev, lambda t: F.one_hot(t, 5), labels)
    compare(dev, F.one_hot, labels)  # class count read from the data
    assert_native("aten.scatter_.value")
