"""tpu adaptive max pooling (1-d, 2-d, 3-d; forward with indices, and backward) against CPU under
``fallback_policy("deny")``: windows of unequal length, output larger than the input, ties
(first maximum wins), NaN and -inf windows, unbatched input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import accelkit
from conftest import assert_native


def sample(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def check(dev, fn, x, output_size):
    want, want_index = fn(x, output_size, return_indices=True)
    with accelkit.fallback_policy("deny"):
        got, got_index = fn(x.to(dev), output_size, return_indices=True)
    torch.testing.assert_close(got.cpu(), want, equal_nan=True)
    torch.testing.assert_close(got_index.cpu(), want_index)


@pytest.mark.parametrize("shape, output_size", [
    ((2, 3, 7, 9), (3, 4)), ((2, 3, 5, 5), (5, 5)), ((1, 2, 3, 4), (6, 7)), ((3, 10, 6), (4, 1)), ((2, 1, 8, 8), (1, 1)),
])
def test_adaptive_max_pool2d(dev, shape, output_size):
    check(dev, F.adaptive_max_pool2d, sample(*shape), output_size)
    assert_native("aten.adaptive_max_pool2d.default")


def test_adaptive_max_pool1d_and_3d(dev):
    check(dev, F.adaptive_max_pool1d, sample(2, 3, 11), 4)
    check(dev, F.adaptive_max_pool3d, sample(1, 2, 5, 6, 7), (2, 3, 4))
    assert_native("aten.adaptive_max_pool3d.default")


def test_ties_nan_and_negative_infinity(dev):
    x = torch.zeros(1, 1, 4, 6)
    x[0, 0, 0, 1] = float("nan")
    x[0, 0, 2:, 3:] = -float("inf")
    check(dev, F.adaptive_max_pool2d, x, (2, 2))


def test_adaptive_max_pool2d_backward(dev):
    x = sample(2, 3, 7, 5)
    grad = sample(2, 3, 3, 2, seed=1)
    cpu = x.clone().requires_grad_()
    F.adaptive_max_pool2d(cpu, (3, 2)).backward(grad)
    device = x.to(dev).requires_grad_()
    with accelkit.fallback_policy("deny"):
        F.adaptive_max_pool2d(device, (3, 2)).backward(grad.to(dev))
    torch.testing.assert_close(device.grad.cpu(), cpu.grad)
    assert_native("aten.adaptive_max_pool2d_backward.default")
