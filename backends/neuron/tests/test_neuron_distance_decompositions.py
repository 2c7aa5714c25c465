"""``_pdist_forward``/``_pdist_backward`` and ``_cdist_backward`` (``decompositions/distance.py``)
against the CPU for each kind of p (incl. zero distances and zero differences), the fallback
denied, in float32 (the CPU's pdist and cdist kernels take no bfloat16)."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import assert_decomposed

aten = torch.ops.aten
NORMS = [0.0, 1.0, 2.0, 3.0, 0.5, math.inf]


pytestmark = pytest.mark.usefixtures("deny_fallback")


def _points(*shape, seed=0):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    x[1] = x[0]  # a zero distance: its gradient is 0
    x[2, 0] = x[0, 0]  # a zero difference element
    return x


@pytest.mark.parametrize("p", NORMS)
def test_pdist_forward_and_backward(dev, p):
    x = _points(6, 4)
    expected = aten._pdist_forward(x, p)
    got = aten._pdist_forward(x.to(dev), p)
    torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-5)
    grad = torch.randn(expected.shape, generator=torch.Generator().manual_seed(2))
    expected_grad = aten._pdist_backward(grad, x, p, expected)
    got_grad = aten._pdist_backward(grad.to(dev), x.to(dev), p, expected.to(dev))
    torch.testing.assert_close(got_grad.cpu(), expected_grad, atol=1e-4, rtol=1e-4)
    assert_decomposed("aten._pdist_forward.default")
    if p != 0:
        assert_decomposed("aten._pdist_backward.default")


@pytest.mark.parametrize("p", NORMS)
@pytest.mark.parametrize("batched", [False, True])
def test_cdist_backward(dev, p, batched):
    x1, x2 = _points(5, 3), _points(4, 3, seed=1)
    x2[0] = x1[0]
    if batched:
        x1, x2 = torch.stack([x1, x1 * 2]), torch.stack([x2, x2 - 1])
    distances = torch.cdist(x1, x2, p)
    grad = torch.randn(distances.shape, generator=torch.Generator().manual_seed(3))
    expected = aten._cdist_backward(grad, x1, x2, p, distances)
    got = aten._cdist_backward(grad.to(dev), x1.to(dev), x2.to(dev), p, distances.to(dev))
    torch.testing.assert_close(got.cpu(), expected, atol=1e-4, rtol=1e-4)
    assert_decomposed("aten._cdist_backward.default")
