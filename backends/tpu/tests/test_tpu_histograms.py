"""tpu histograms (kernels/histograms.py) against CPU: ``torch.histogram`` (bin count with or
without range, given bin edges; weights; density) and ``torch.histogramdd`` under
``fallback_policy("deny")``, including elements on the edges, outside the range, a single repeated
value, 0-d and empty input; and ``torch.histc`` (values on the edges, a degenerate range)."""

from __future__ import annotations

import pytest
import torch

import accelkit
from conftest import assert_native


def run(dev, x, bins, **kwargs):
    want = torch.histogram(x, bins, **kwargs)
    on_device = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    with accelkit.fallback_policy("deny"):
        got = torch.histogram(x.to(dev), bins.to(dev) if isinstance(bins, torch.Tensor) else bins, **on_device)
    torch.testing.assert_close(got.hist.cpu(), want.hist, equal_nan=True)
    torch.testing.assert_close(got.bin_edges.cpu(), want.bin_edges)


@pytest.mark.parametrize("density", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_histogram_bin_count(dev, density, weighted):
    x = torch.randn(5, 40, generator=torch.Generator().manual_seed(0))
    weight = torch.rand(5, 40) if weighted else None
    run(dev, x, 7, weight=weight, density=density)
    run(dev, x, 4, range=(-1.0, 1.0), weight=weight, density=density)  # elements outside are ignored
    assert_native("aten.histogram.bin_ct")


def test_histogram_edges_and_degenerate_ranges(dev):
    run(dev, torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0]), 4)  # the maximum falls in the last, closed bin
    run(dev, torch.tensor([2.0, 2.0, 2.0]), 3)  # one value: the range widens by 0.5 each way
    run(dev, torch.randn(3, 4), 3, range=(0.5, 0.5))
    run(dev, torch.tensor(1.5), 2)
    run(dev, torch.empty(5, 0, 5), 3)
    run(dev, torch.empty(0), 2, density=True)


def test_histogram_given_bin_edges(dev):
    x = torch.tensor([-3.0, -1.0, -0.5, 0.0, 0.2, 1.0, 2.5, 4.0, 9.0])
    edges = torch.tensor([-1.0, 0.0, 0.2, 2.0, 4.0])
    run(dev, x, edges)
    run(dev, x, edges, weight=torch.arange(9.0), density=True)
    assert_native("aten.histogram.bins_tensor")


def run_dd(dev, x, bins, **kwargs):
    want = torch.histogramdd(x, bins, **kwargs)
    on_device = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    device_bins = [b.to(dev) if isinstance(b, torch.Tensor) else b for b in bins]
    with accelkit.fallback_policy("deny"):
        got = torch.histogramdd(x.to(dev), device_bins, **on_device)
    torch.testing.assert_close(got.hist.cpu(), want.hist, equal_nan=True)
    assert len(got.bin_edges) == len(want.bin_edges)
    for g, w in zip(got.bin_edges, want.bin_edges):
        torch.testing.assert_close(g.cpu(), w)


@pytest.mark.parametrize("density", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_histogramdd_bin_counts_and_edges(dev, density, weighted):
    x = torch.randn(50, 3, generator=torch.Generator().manual_seed(1))
    weight = torch.rand(50) if weighted else None
    run_dd(dev, x, [2, 3, 4], weight=weight, density=density)
    run_dd(dev, x, [3, 1, 2], range=[-1.0, 1.0, 0.0, 2.0, -3.0, 0.5], weight=weight, density=density)
    edges = [torch.tensor([-2.0, 0.0, 1.0]), torch.tensor([-1.0, -0.5, 0.5, 2.0]), torch.tensor([-9.0, 9.0])]
    run_dd(dev, x, edges, weight=weight, density=density)
    assert_native("aten._histogramdd_from_bin_tensors.default")


def test_histogramdd_degenerate_and_empty(dev):
    run_dd(dev, torch.tensor([[1.0, 2.0], [1.0, 3.0]]), [2, 2])  # one value in dimension 0
    run_dd(dev, torch.empty(0, 2), [2, 3])


@pytest.mark.parametrize("bins, lo, hi", [(10, 0.0, 0.0), (7, -1.0, 1.0), (5, 0.5, 0.5)])
def test_histc(dev, bins, lo, hi):
    x = torch.randn(200, generator=torch.Generator().manual_seed(0))
    x[:3] = torch.tensor([1.0, -1.0, 0.5])  # values on the edges
    want = torch.histc(x, bins, lo, hi)
    got = torch.histc(x.to(dev), bins, lo, hi)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.cpu(), want)
    assert_native("aten.histc.default")
