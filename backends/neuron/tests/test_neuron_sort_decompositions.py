"""Sorting and its relatives (``decompositions/sort.py``) against the CPU, the fallback denied:
stable sort's values and indices exactly (ties, NaN, -0.0), ``topk``/``kthvalue`` values (and
indices where no ties make them unambiguous), medians with their indices, ``cummax``/``cummin``
and ``logcumsumexp``, in float32, bfloat16 and integers."""

from __future__ import annotations

import pytest
import torch

import accelkit
from conftest import assert_decomposed


pytestmark = pytest.mark.usefixtures("deny_fallback")

DTYPES = [torch.float32, torch.bfloat16, torch.int32, torch.int64]


def _with_ties_and_nans(dtype: torch.dtype, shape=(5, 33)) -> torch.Tensor:
    generator = torch.Generator().manual_seed(3)
    x = torch.randint(-4, 5, shape, generator=generator).to(dtype)
    if dtype.is_floating_point:
        x[1, 3] = x[1, 17] = x[3, 0] = float("nan")
        x[2, 0], x[2, 1] = -0.0, 0.0
    return x


def _same(cpu: torch.Tensor, device: torch.Tensor, signs: bool = True) -> None:
    device = device.cpu()
    assert device.dtype == cpu.dtype and device.shape == cpu.shape
    assert torch.equal(torch.nan_to_num(cpu, nan=123.0), torch.nan_to_num(device, nan=123.0)), (cpu, device)
    if signs and cpu.is_floating_point():  # -0.0 kept apart from 0.0
        assert torch.equal(torch.signbit(cpu), torch.signbit(device))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dim", [1, 0])
def test_stable_sort_matches_the_cpu(dev, dtype, descending, dim):
    x = _with_ties_and_nans(dtype)
    expected = torch.sort(x, dim=dim, descending=descending, stable=True)
    got = torch.sort(x.to(dev), dim=dim, descending=descending, stable=True)
    _same(expected.values, got.values)
    _same(expected.indices, got.indices)
    assert_decomposed("aten.sort")


def test_sort_without_stable_and_argsort_and_out(dev):
    """Without ``stable`` the CPU orders ties as it likes (values only compared); argsort."""
    x = _with_ties_and_nans(torch.float32)
    _same(torch.sort(x, dim=1).values, torch.sort(x.to(dev), dim=1).values, signs=False)
    _same(torch.argsort(x, dim=0, descending=True, stable=True),
          torch.argsort(x.to(dev), dim=0, descending=True, stable=True))
    values = torch.empty(0, device=dev)
    indices = torch.empty(0, dtype=torch.int64, device=dev)
    torch.sort(x.to(dev), dim=1, stable=True, out=(values, indices))
    _same(torch.sort(x, dim=1, stable=True).values, values)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("largest", [True, False])
def test_topk_values_match_and_distinct_values_indices_too(dev, dtype, largest):
    x = _with_ties_and_nans(dtype)
    _same(torch.topk(x, 6, dim=1, largest=largest).values, torch.topk(x.to(dev), 6, dim=1, largest=largest).values)
    distinct = torch.randperm(40, generator=torch.Generator().manual_seed(1)).reshape(4, 10).to(dtype)
    expected = torch.topk(distinct, 3, dim=1, largest=largest)
    got = torch.topk(distinct.to(dev), 3, dim=1, largest=largest)
    _same(expected.values, got.values)
    _same(expected.indices, got.indices)
    assert_decomposed("aten.topk")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("keepdim", [False, True])
def test_kthvalue(dev, dtype, keepdim):
    x = _with_ties_and_nans(dtype)
    _same(torch.kthvalue(x, 7, dim=1, keepdim=keepdim).values,
          torch.kthvalue(x.to(dev), 7, dim=1, keepdim=keepdim).values)
    distinct = torch.randperm(40, generator=torch.Generator().manual_seed(2)).reshape(4, 10).to(dtype)
    _same(torch.kthvalue(distinct, 4, 0, keepdim).indices, torch.kthvalue(distinct.to(dev), 4, 0, keepdim).indices)
    assert_decomposed("aten.kthvalue")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["median", "nanmedian"])
def test_medians_with_their_indices(dev, dtype, name):
    median = getattr(torch, name)
    x = _with_ties_and_nans(dtype)
    for dim in (0, 1):
        expected, got = median(x, dim=dim), median(x.to(dev), dim=dim)
        _same(expected.values, got.values)
        _same(expected.indices, got.indices)
    _same(median(x), median(x.to(dev)))
    _same(median(x[0]), median(x[0].to(dev)))
    assert_decomposed(f"aten.{name}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["cummax", "cummin"])
def test_cummax_cummin(dev, dtype, name):
    x = _with_ties_and_nans(dtype, (4, 37))
    for dim in (1, 0):
        expected, got = getattr(torch, name)(x, dim), getattr(torch, name)(x.to(dev), dim)
        _same(expected.values, got.values)
        _same(expected.indices, got.indices)
    assert_decomposed(f"aten._{name}_helper")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logcumsumexp_within_rounding(dev, dtype):
    x = torch.randn(3, 70, generator=torch.Generator().manual_seed(4)) * 5
    x[0, 5], x[1, 9], x[2, :4] = float("-inf"), float("inf"), float("-inf")
    x = x.to(dtype)
    for dim in (1, 0):
        expected, got = torch.logcumsumexp(x, dim), torch.logcumsumexp(x.to(dev), dim).cpu()
        assert got.dtype == dtype
        torch.testing.assert_close(got, expected, equal_nan=True)
    assert_decomposed("aten._logcumsumexp")


@pytest.mark.parametrize("dtype", DTYPES)
def test_mode_values_and_short_rows_indices(dev, dtype):
    """Values always; indices where the CPU sorts stably (rows of a few elements). No NaN: the
    CPU's mode sorts with ``<``, which NaN leaves without an order ([4, nan, -1, 4] -> -1)."""
    x = _with_ties_and_nans(dtype, (6, 40))
    if dtype.is_floating_point:
        x = x.nan_to_num(nan=2.0)
    for dim in (1, 0):
        _same(torch.mode(x, dim).values, torch.mode(x.to(dev), dim).values, signs=False)
    short = torch.tensor([[3, 1, 3, 1, 2, 0], [5, 5, 1, 1, 1, 5], [2, 9, 9, 1, 4, 4], [4, 4, 2, 2, 7, 2]]).to(dtype)
    expected, got = torch.mode(short, 1, keepdim=True), torch.mode(short.to(dev), 1, keepdim=True)
    _same(expected.values, got.values)
    _same(expected.indices, got.indices)
    assert_decomposed("aten.mode")


def test_rows_longer_than_the_ranking_bound_go_to_the_cpu(dev, monkeypatch):
    """A row past ``MAX_RANKED`` is the CPU's (O(n^2) ranks would stall the simulator): still
    the right result, counted as a fallback."""
    from accelkit_backends.neuron.decompositions import sort

    monkeypatch.setattr(sort, "MAX_RANKED", 8)
    x = torch.randn(3, 12, generator=torch.Generator().manual_seed(8))
    with accelkit.fallback_policy("allow"):
        got = torch.sort(x.to(dev), dim=1, stable=True)
        short = torch.sort(x[:, :8].to(dev), dim=1, stable=True)
    _same(torch.sort(x, dim=1, stable=True).indices, got.indices)
    _same(torch.sort(x[:, :8], dim=1, stable=True).indices, short.indices)
    counts = accelkit.stats()["ops"]["aten.sort.values_stable"]
    assert counts["fallback"] == 1 and counts["decomposed"] == 1


UNIQUE_CASES = {
    "ties and NaN": lambda dtype: _with_ties_and_nans(dtype, (4, 18)),
    "bool": lambda dtype: torch.tensor([[True, False], [True, True]]),
    "0-d": lambda dtype: torch.tensor(7).to(dtype),
    "empty": lambda dtype: torch.empty(0, 3).to(dtype),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(UNIQUE_CASES))
@pytest.mark.parametrize("return_inverse", [True, False])
@pytest.mark.parametrize("return_counts", [True, False])
def test_unique_matches_the_cpu(dev, dtype, case, return_inverse, return_counts):
    """Values (each NaN its own, last), the inverse in the input's shape and the counts, or the
    CPU's empty tensors for the ones not asked for; ``sorted=False`` sorts, as on the CPU. The
    CPU orders its NaNs among themselves as its unstable sort leaves them, so a NaN's inverse
    is checked to point at a NaN of the output, each at its own."""
    x = UNIQUE_CASES[case](dtype)
    for sorted_ in (True, False):
        expected = torch.ops.aten._unique2(x, sorted_, return_inverse, return_counts)
        got = [t.cpu() for t in torch.ops.aten._unique2(x.to(dev), sorted_, return_inverse, return_counts)]
        for e, g in zip(expected, got):
            assert (g.dtype, g.shape) == (e.dtype, e.shape)
        values, inverse, counts = got
        assert torch.equal(torch.where(values != values, 0, values), torch.where(expected[0] != expected[0], 0,
                                                                                expected[0]))
        assert torch.equal(counts, expected[2])
        if return_inverse:
            nan = x != x
            assert torch.equal(inverse[~nan], expected[1][~nan])
            assert values[inverse[nan]].isnan().all() and len(set(inverse[nan].tolist())) == int(nan.sum())
        unique_inverse = torch.ops.aten._unique(x.to(dev), sorted_, return_inverse)[1].cpu()
        assert torch.equal(unique_inverse, inverse)
    assert_decomposed("aten._unique2.default", "aten._unique.default")


def test_logcumsumexp_bfloat16_scans_in_float32_as_the_cpu(dev):
    """The CPU's scan is float32 for bfloat16, each result rounded once: so is neuron's (a
    bfloat16 scan rounds at each of its log2(n) steps, which the gradient's cancelling
    exponentials magnify: the full profile's 0.047)."""
    dev = "neuron"
    x = (torch.randn(6, 64, generator=torch.Generator().manual_seed(7)) * 4).bfloat16()
    upstream = torch.randn(6, 64, generator=torch.Generator().manual_seed(8)).bfloat16()

    def run(device):
        leaf = x.to(device).requires_grad_()
        out = torch.logcumsumexp(leaf, 1)
        (grad,) = torch.autograd.grad(out, leaf, upstream.to(device))
        return out.detach().cpu(), grad.cpu()

    (value, grad), (cpu_value, cpu_grad) = run(dev), run("cpu")
    _, exponent = torch.frexp(cpu_value.float())
    step = torch.ldexp(torch.ones(()), exponent - 8)  # one bfloat16 step (8 significant bits)
    assert bool(((value.float() - cpu_value.float()).abs() <= step).all())
    torch.testing.assert_close(grad, cpu_grad, rtol=2.0**-8, atol=1e-2)
