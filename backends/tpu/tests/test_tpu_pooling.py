"""tpu pooling (kernels/pooling.py) compared with PyTorch on CPU, forward and backward: max pooling
with indices (2-d and 3-d, ``ceil_mode``, dilation; ties, infinities and NaN follow CPU; unbatched
and bfloat16 input), average pooling (``ceil_mode``, ``count_include_pad``, ``divisor_override``),
adaptive average pooling, and adaptive max pooling in 1-d, 2-d and 3-d under
``fallback_policy("deny")`` (windows of unequal length, output larger than the input, first
maximum wins, NaN and -inf windows, unbatched input, and its backward).

The forward-and-backward checks are ``harness_nn.compare``; float32 is compared at 1e-5
(XLA sums in another order than PyTorch's CPU kernels: a few ulps), bfloat16 at its resolution.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import accelkit
from conftest import assert_native
from harness_nn import BF16, compare, sample


def normal_input(*shape, seed=0):
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
    check(dev, F.adaptive_max_pool2d, normal_input(*shape), output_size)
    assert_native("aten.adaptive_max_pool2d.default")


def test_adaptive_max_pool1d_and_3d(dev):
    check(dev, F.adaptive_max_pool1d, normal_input(2, 3, 11), 4)
    check(dev, F.adaptive_max_pool3d, normal_input(1, 2, 5, 6, 7), (2, 3, 4))
    assert_native("aten.adaptive_max_pool3d.default")


def test_ties_nan_and_negative_infinity(dev):
    x = torch.zeros(1, 1, 4, 6)
    x[0, 0, 0, 1] = float("nan")
    x[0, 0, 2:, 3:] = -float("inf")
    check(dev, F.adaptive_max_pool2d, x, (2, 2))


def test_adaptive_max_pool2d_backward(dev):
    x = normal_input(2, 3, 7, 5)
    grad = normal_input(2, 3, 3, 2, seed=1)
    cpu = x.clone().requires_grad_()
    F.adaptive_max_pool2d(cpu, (3, 2)).backward(grad)
    device = x.to(dev).requires_grad_()
    with accelkit.fallback_policy("deny"):
        F.adaptive_max_pool2d(device, (3, 2)).backward(grad.to(dev))
    torch.testing.assert_close(device.grad.cpu(), cpu.grad)
    assert_native("aten.adaptive_max_pool2d_backward.default")


@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("dims", [2, 3])
def test_max_pool_with_indices(dev, dims, ceil_mode):
    shape = (2, 3, 8, 9) if dims == 2 else (1, 2, 5, 6, 7)
    pool = F.max_pool2d if dims == 2 else F.max_pool3d
    compare(dev, lambda x: pool(x, 3, 2, 1, dilation=1 if dims == 3 else 2, ceil_mode=ceil_mode,
                                return_indices=True),
            [sample(shape)], native=[f"aten.max_pool{dims}d_with_indices.default",
                                     f"aten.max_pool{dims}d_with_indices_backward.default"])


def test_max_pool_ties_infinities_and_nan_follow_cpu(dev):
    """First maximum wins, NaN wins, and an all -inf window points at its first real element."""
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[[[1.0, 1.0, -inf, -inf], [1.0, nan, -inf, -inf], [2.0, 2.0, nan, 3.0],
                        [0.0, 0.0, 0.0, 0.0]]]])
    compare(dev, lambda x: F.max_pool2d(x, 2, 2, 1, return_indices=True), [x])


def test_max_pool_unbatched_and_bfloat16(dev):
    compare(dev, lambda x: F.max_pool2d(x, 2, return_indices=True), [sample((3, 8, 9))])
    compare(dev, lambda x: F.max_pool2d(x, 2, return_indices=True), [sample((2, 3, 8, 8), torch.bfloat16)],
            tol=BF16)


@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("ceil_mode", [False, True])
def test_avg_pool(dev, ceil_mode, count_include_pad):
    compare(dev, lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=ceil_mode, count_include_pad=count_include_pad),
            [sample((2, 3, 8, 9))], native=["aten.avg_pool2d.default", "aten.avg_pool2d_backward.default"])
    compare(dev, lambda x: F.avg_pool3d(x, (2, 3, 2), 2, (1, 1, 0), ceil_mode=ceil_mode,
                                        count_include_pad=count_include_pad),
            [sample((1, 2, 5, 6, 7))], native=["aten.avg_pool3d.default", "aten.avg_pool3d_backward.default"])


def test_avg_pool_divisor_override(dev):
    compare(dev, lambda x: F.avg_pool2d(x, 3, 2, 1, divisor_override=5), [sample((2, 3, 8, 9))])


@pytest.mark.parametrize("output_size", [(3, 4), (5, 7)])
def test_adaptive_avg_pool2d(dev, output_size):
    compare(dev, lambda x: F.adaptive_avg_pool2d(x, output_size), [sample((2, 3, 7, 5))],
            native=["aten._adaptive_avg_pool2d.default", "aten._adaptive_avg_pool2d_backward.default"])


def test_adaptive_avg_pool3d(dev):
    compare(dev, lambda x: F.adaptive_avg_pool3d(x, (2, 3, 4)), [sample((1, 2, 5, 6, 7))],
            native=["aten._adaptive_avg_pool3d.default", "aten._adaptive_avg_pool3d_backward.default"])
