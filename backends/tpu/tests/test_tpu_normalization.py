"""tpu normalization (kernels/normalization.py) against CPU under ``fallback_policy("deny")``:
the edge cases of the lowerings (empty batches for group norm, forward and backward;
evaluation-mode batch norm's saved statistics, which leaves the running statistics alone)."""

from __future__ import annotations

import pytest
import torch

import accelkit
from conftest import assert_native

aten = torch.ops.aten


@pytest.mark.parametrize("shape, groups", [((0, 2), 1), ((0, 6, 3), 3), ((2, 6, 0), 2), ((3, 6, 2, 2), 3)])
def test_group_norm_including_empty_inputs(dev, shape, groups):
    x, w, b = torch.randn(shape), torch.randn(shape[1]), torch.randn(shape[1])
    n, c = shape[0], shape[1]
    hxw = x[0, 0].numel() if n else int(torch.tensor(shape[2:]).prod())
    want = aten.native_group_norm(x, w, b, n, c, hxw, groups, 1e-5)
    with accelkit.fallback_policy("deny"):
        got = aten.native_group_norm(x.to(dev), w.to(dev), b.to(dev), n, c, hxw, groups, 1e-5)
        functional = torch.nn.functional.group_norm(x.to(dev), groups, w.to(dev), b.to(dev))
    for g, e in zip(got, want):  # an empty group's rstd is NaN on CPU too
        torch.testing.assert_close(g.cpu(), e, atol=1e-5, rtol=1e-5, equal_nan=True)
    torch.testing.assert_close(functional.cpu(), torch.nn.functional.group_norm(x, groups, w, b),
                               atol=1e-5, rtol=1e-5)
    assert_native("aten.native_group_norm.default")


def test_group_norm_backward_of_empty_batch(dev):
    x = torch.randn(0, 4, 3, requires_grad=True)
    xd = x.detach().to(dev).requires_grad_()
    with accelkit.fallback_policy("deny"):
        torch.nn.functional.group_norm(xd, 2).sum().backward()
    assert xd.grad.shape == (0, 4, 3)


def test_native_batch_norm_eval_saves_no_statistics(dev):
    x, w, b = torch.randn(3, 2, 4), torch.randn(2), torch.randn(2)
    mean, var = torch.randn(2), torch.rand(2) + 0.5
    want = aten.native_batch_norm(x, w, b, mean.clone(), var.clone(), False, 0.1, 1e-5)
    dmean, dvar = mean.to(dev), var.to(dev)
    with accelkit.fallback_policy("deny"):
        got = aten.native_batch_norm(x.to(dev), w.to(dev), b.to(dev), dmean, dvar, False, 0.1, 1e-5)
    for g, e in zip(got, want):
        assert g.shape == e.shape
        torch.testing.assert_close(g.cpu(), e, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dmean.cpu(), mean)  # evaluation leaves the running statistics alone
    torch.testing.assert_close(dvar.cpu(), var)
