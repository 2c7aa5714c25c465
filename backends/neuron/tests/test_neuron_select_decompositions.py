"""``nonzero``, ``nonzero_static``, ``masked_select`` and ``masked_scatter_`` on neuron
(``decompositions/select.py``) vs CPU PyTorch, fallback denied: exact (values are only moved)."""

from __future__ import annotations

import pytest
import torch

import accelkit

GEN = torch.Generator().manual_seed(0)
DTYPES = [torch.float32, torch.bfloat16, torch.int32, torch.bool]


def _on_device(fn, *tensors, dev):
    with accelkit.fallback_policy("deny"):
        return fn(*(t.to(dev) for t in tensors)).cpu()


def _sparse(shape, dtype):
    values = torch.randn(shape, generator=GEN)
    values[torch.rand(shape, generator=GEN) < 0.6] = 0
    return values.to(dtype)


def _equal(actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape and torch.equal(actual, expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(17,), (4, 6), (2, 3, 5), ()], ids=str)
def test_nonzero_matches_cpu(dev, dtype, shape):
    x = _sparse(shape, dtype)
    _equal(_on_device(torch.nonzero, x, dev=dev), torch.nonzero(x))
    for size in (0, 3, 40):
        fn = lambda t: torch.nonzero_static(t, size=size, fill_value=-7)  # noqa: E731
        _equal(_on_device(fn, x, dev=dev), fn(x))


def test_nonzero_of_nothing_and_of_everything(dev):
    for x in (torch.zeros(3, 4), torch.ones(3, 4), torch.zeros(0, 2)):
        _equal(_on_device(torch.nonzero, x, dev=dev), torch.nonzero(x))
    for size in (0, 3):  # a zero-size dim: all fill (it divided by the dim's size)
        fn = lambda t: torch.nonzero_static(t, size=size)  # noqa: E731
        _equal(_on_device(fn, torch.empty(5, 0, 5), dev=dev), fn(torch.empty(5, 0, 5)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_masked_select_matches_cpu_with_broadcasting(dev, dtype):
    x = _sparse((3, 5), dtype)
    for mask in (torch.rand(3, 5, generator=GEN) > 0.5, torch.tensor([True, False, True, True, False])):
        _equal(_on_device(torch.masked_select, x, mask, dev=dev), torch.masked_select(x, mask))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_masked_scatter_matches_cpu(dev, dtype):
    x, source = _sparse((4, 5), dtype), _sparse((30,), dtype)
    for mask in (torch.rand(4, 5, generator=GEN) > 0.4, torch.tensor([False, True, True, False, True])):
        fn = lambda t, m, s: t.masked_scatter_(m, s)  # noqa: E731
        _equal(_on_device(fn, x, mask, source, dev=dev), fn(x.clone(), mask, source))
        same_shape = _sparse((4, 5), dtype)
        _equal(_on_device(fn, x, mask, same_shape, dev=dev), fn(x.clone(), mask, same_shape))


def test_masked_scatter_with_a_short_source_raises_as_on_cpu(dev):
    x, mask = torch.zeros(6), torch.tensor([True, True, False, True, True, True])
    with pytest.raises(RuntimeError, match="Number of elements of source < number of ones in mask"):
        torch.zeros(6).masked_scatter_(mask, torch.ones(3))
    with pytest.raises(RuntimeError, match="Number of elements of source < number of ones in mask"):
        _on_device(lambda t, m, s: t.masked_scatter_(m, s), x, mask, torch.ones(3), dev=dev)


def test_repeat_interleave_bincount_put_and_equal_match_cpu(dev):
    repeats = torch.tensor([2, 0, 3, 1], dtype=torch.int64)
    _equal(_on_device(torch.repeat_interleave, repeats, dev=dev), torch.repeat_interleave(repeats))
    fn = lambda r: torch.repeat_interleave(r, output_size=6)  # noqa: E731
    _equal(_on_device(fn, repeats, dev=dev), fn(repeats))
    x = torch.tensor([1, 0, 4, 4, 2, 7, 1], dtype=torch.int64)
    _equal(_on_device(torch.bincount, x, dev=dev), torch.bincount(x))
    _equal(_on_device(lambda t: torch.bincount(t, minlength=12), x, dev=dev), torch.bincount(x, minlength=12))
    for accumulate in (False, True):
        target, index, source = _sparse((3, 4), torch.float32), torch.tensor([0, -1, 5, 5]), torch.arange(4.0)
        fn = lambda t, i, s: t.put_(i, s, accumulate=accumulate)  # noqa: E731
        _equal(_on_device(fn, target, index, source, dev=dev), fn(target.clone(), index, source))
    a = torch.tensor([1.0, 2.0, float("nan")])
    with accelkit.fallback_policy("deny"):
        assert torch.equal(a[:2].to(dev), a[:2].to(dev)) and not torch.equal(a.to(dev), a.to(dev))
        assert not torch.equal(a.to(dev), a[:2].to(dev))


def test_pow_in_place_with_a_tensor_exponent(dev):
    base, exponent = torch.tensor([2.0, 3.0, -1.5, 0.0]), torch.tensor([2.0, 0.5, 3.0, 0.0])
    fn = lambda b, e: b.pow_(e)  # noqa: E731
    actual, expected = _on_device(fn, base, exponent, dev=dev), fn(base.clone(), exponent)
    assert torch.equal(actual.isnan(), expected.isnan())
    torch.testing.assert_close(actual, expected, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_unique_consecutive_matches_cpu(dev, dtype):
    x = torch.tensor([[1.0, 1.0, 2.0, 0.0], [0.0, 3.0, 3.0, 3.0]]).to(dtype)
    for flags in ((False, False), (True, False), (False, True), (True, True)):
        fn = lambda t: torch.ops.aten.unique_consecutive(t, *flags)  # noqa: E731
        with accelkit.fallback_policy("deny"):
            actual = tuple(o.cpu() for o in fn(x.to(dev)))
        for a, e in zip(actual, fn(x)):
            _equal(a, e)
    with_nan = torch.tensor([1.0, float("nan"), float("nan"), 2.0])
    with accelkit.fallback_policy("deny"):
        values, _, counts = (o.cpu() for o in torch.ops.aten.unique_consecutive(with_nan.to(dev), False, True))
    expected = torch.ops.aten.unique_consecutive(with_nan, False, True)
    assert torch.equal(values.isnan(), expected[0].isnan()) and torch.equal(counts, expected[2])


@pytest.mark.parametrize("name", ["tril_indices", "triu_indices"])
@pytest.mark.parametrize("row, col, offset", [(4, 5, 0), (5, 3, 1), (6, 6, -2), (3, 7, 4), (0, 3, 0), (4, 4, -9),
                                              (4, 4, 9)])
def test_triangle_indices_match_cpu(dev, name, row, col, offset):
    fn = getattr(torch, name)
    with accelkit.fallback_policy("deny"):
        got = fn(row, col, offset, device=dev).cpu()
        narrow = fn(row, col, offset, dtype=torch.int32, device=dev).cpu()
    _equal(got, fn(row, col, offset))
    _equal(narrow, fn(row, col, offset, dtype=torch.int32))
