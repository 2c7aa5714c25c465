"""tpu ``equal``, ``histc`` and the random ops ``normal`` (tensor mean/std), ``log_normal_``,
``cauchy_``, ``geometric_``: exact comparisons with CPU where values are deterministic, and
distribution checks (with wide, seed-fixed margins) where they are random."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_native


def test_equal(dev):
    a = torch.tensor([1.0, 2.0, float("nan")])
    cases = [(a[:2], a[:2]), (a, a), (a[:2], torch.tensor([1.0, 3.0])), (a[:2], a[:2].reshape(2, 1)),
             (torch.arange(3), torch.arange(3.0))]
    for x, y in cases:
        assert torch.equal(x.to(dev), y.to(dev)) is torch.equal(x, y)
    assert_native("aten.equal.default")


@pytest.mark.parametrize("bins, lo, hi", [(10, 0.0, 0.0), (7, -1.0, 1.0), (5, 0.5, 0.5)])
def test_histc(dev, bins, lo, hi):
    x = torch.randn(200, generator=torch.Generator().manual_seed(0))
    x[:3] = torch.tensor([1.0, -1.0, 0.5])  # values on the edges
    want = torch.histc(x, bins, lo, hi)
    got = torch.histc(x.to(dev), bins, lo, hi)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.cpu(), want)
    assert_native("aten.histc.default")


def test_normal_with_tensor_mean_and_std(dev):
    torch.manual_seed(0)
    means, stds = torch.tensor([-10.0, 0.0, 10.0]), torch.tensor([0.5, 1.0, 2.0])
    mean, std = means.repeat(6000, 1).to(dev), stds.to(dev)
    draws = [  # (samples of shape (6000, 3), expected column means, expected column stds)
        (torch.normal(mean, std), means, stds),
        (torch.normal(mean, 2.0), means, torch.full((3,), 2.0)),
        (torch.normal(3.0, std.expand(6000, 3)), torch.full((3,), 3.0), stds),
    ]
    for sample, want_mean, want_std in draws:
        sample = sample.cpu()
        torch.testing.assert_close(sample.mean(0), want_mean, atol=0.15, rtol=0)
        torch.testing.assert_close(sample.std(0), want_std, atol=0, rtol=0.1)
    assert_native("aten.normal.Tensor_Tensor", "aten.normal.Tensor_float", "aten.normal.float_Tensor")


def test_seeded_draws_repeat(dev):
    m = torch.zeros(100).to(dev)
    torch.manual_seed(3)
    a = torch.normal(m, 1.0).cpu()
    torch.manual_seed(3)
    b = torch.normal(m, 1.0).cpu()
    assert torch.equal(a, b)


def test_log_normal_cauchy_geometric_distributions(dev):
    torch.manual_seed(0)
    x = torch.empty(20000).to(dev)
    logs = x.log_normal_(1.0, 0.5).cpu().log()
    assert abs(logs.mean().item() - 1.0) < 0.05 and abs(logs.std().item() - 0.5) < 0.05
    c = x.cauchy_(2.0, 3.0).cpu()
    assert abs(c.median().item() - 2.0) < 0.2
    assert abs(((c - 2.0).abs() < 3.0).float().mean().item() - 0.5) < 0.03  # sigma is the half-width
    g = x.geometric_(0.25).cpu()
    assert g.min().item() >= 1 and torch.equal(g, g.round())
    assert abs(g.mean().item() - 4.0) < 0.2
    assert_native("aten.log_normal_.default", "aten.cauchy_.default", "aten.geometric_.default")
