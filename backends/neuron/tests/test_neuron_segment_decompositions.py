"""``segment_reduce`` (``decompositions/segment.py``) against the CPU, the fallback denied: every
reduction, empty segments, ``initial``, lengths and offsets, rows of several columns, float32
and bfloat16."""

from __future__ import annotations

import pytest
import torch

import accelkit


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 2.5])
@pytest.mark.parametrize("columns", [(), (3,)])
def test_segment_reduce_matches_the_cpu(dev, dtype, reduce, initial, columns):
    data = torch.randn((9,) + columns, generator=torch.Generator().manual_seed(0)).to(dtype)
    lengths = torch.tensor([2, 0, 3, 1, 3])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
    for form in (dict(lengths=lengths), dict(offsets=offsets)):
        expected = torch.segment_reduce(data, reduce, initial=initial, **form)
        with accelkit.fallback_policy("deny"):
            got = torch.segment_reduce(data.to(dev), reduce, initial=initial,
                                       **{name: t.to(dev) for name, t in form.items()}).cpu()
        tolerance = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(got, expected, equal_nan=True, **tolerance)
    counts = accelkit.stats()["ops"]["aten.segment_reduce.default"]
    assert counts["decomposed"] > 0 and not counts["fallback"]


def _special_rows(dtype):
    """Rows with ties, zeros and a NaN, in segments of 2, 0, 3, 1 and 3 rows."""
    data = torch.tensor([[1.0, 0.0], [1.0, 2.0], [3.0, -1.0], [0.0, -1.0], [3.0, 0.0], [5.0, 4.0],
                         [0.0, float("nan")], [2.0, 0.0], [-2.0, 2.0]])
    return data.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 2.5])
@pytest.mark.parametrize("rows", ["random", "special"])
def test_segment_reduce_backward_matches_the_cpu(dev, dtype, reduce, initial, rows):
    if rows == "random":
        data = torch.randn(9, 2, generator=torch.Generator().manual_seed(1)).to(dtype)
    else:
        data = _special_rows(dtype)
    lengths = torch.tensor([2, 0, 3, 1, 3])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
    grad = torch.tensor([[1.0, -2.0], [0.5, 0.5], [-1.5, 3.0], [2.0, -1.0], [0.25, 4.0]]).to(dtype)
    for form in (dict(lengths=lengths), dict(offsets=offsets)):
        output = torch.segment_reduce(data, reduce, initial=initial, **form)
        expected = torch.ops.aten._segment_reduce_backward(grad, output, data, reduce, initial=initial, **form)
        with accelkit.fallback_policy("deny"):
            got = torch.ops.aten._segment_reduce_backward(
                grad.to(dev), output.to(dev), data.to(dev), reduce, initial=initial,
                **{name: t.to(dev) for name, t in form.items()}).cpu()
        tolerance = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(got, expected, equal_nan=True, **tolerance)
    counts = accelkit.stats()["ops"]["aten._segment_reduce_backward.default"]
    assert counts["decomposed"] > 0 and not counts["fallback"]


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
def test_rows_past_the_segments_are_left_out_as_on_the_cpu(dev, reduce):
    """``unsafe=True`` skips the check that the lengths cover every row: the CPU leaves the rows
    past the last segment out of the result and gives them a zero gradient."""
    data = torch.randn(10, 3, generator=torch.Generator().manual_seed(2))
    lengths = torch.tensor([2, 0, 3, 1, 1])  # 7 of 10 rows
    output = torch.segment_reduce(data, reduce, lengths=lengths, unsafe=True, initial=1.0)
    grad = torch.ones_like(output)
    expected = torch.ops.aten._segment_reduce_backward(grad, output, data, reduce, lengths=lengths, initial=1.0)
    with accelkit.fallback_policy("deny"):
        got = torch.segment_reduce(data.to(dev), reduce, lengths=lengths.to(dev), unsafe=True, initial=1.0).cpu()
        got_grad = torch.ops.aten._segment_reduce_backward(grad.to(dev), output.to(dev), data.to(dev), reduce,
                                                           lengths=lengths.to(dev), initial=1.0).cpu()
    torch.testing.assert_close(got, output, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got_grad, expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_bfloat16_sums_are_float32_rounded_once(dev, reduce):
    """A long cancelling bfloat16 segment: the result is the float32 computation rounded once
    (what the conformance's float reference compares with), not a sum rounded at every add."""
    data = (torch.randn(400, 8, generator=torch.Generator().manual_seed(3)) * 100).bfloat16()
    data[200:] = -data[:200]  # each column's segment sums to the initial value
    data[:, 0] += 1
    lengths = torch.tensor([400, 0, 0])
    expected = torch.segment_reduce(data.float(), reduce, lengths=lengths, initial=1.0).bfloat16()
    with accelkit.fallback_policy("deny"):
        got = torch.segment_reduce(data.to(dev), reduce, lengths=lengths.to(dev), initial=1.0).cpu()
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected, atol=0, rtol=2.0**-8)
