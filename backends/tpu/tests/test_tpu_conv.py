"""tpu convolution (kernels/conv.py: ``convolution_overrideable`` and its backward) compared
with PyTorch on CPU, forward and backward: 1-d, 2-d and 3-d convolutions, strided, padded
(``"same"`` too), dilated and grouped, their transposes with ``output_padding``, bfloat16 and no
bias, and a backward that computes only the gradients asked for (``output_mask``).

The forward-and-backward checks are ``harness_nn.compare``; float32 is compared at 1e-5
(XLA sums in another order than PyTorch's CPU kernels: a few ulps), bfloat16 at its resolution.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from harness_nn import BF16, F32, compare, sample

aten = torch.ops.aten


CONV = ["aten.convolution_overrideable.default", "aten.convolution_backward_overrideable.default"]


CONVOLUTIONS = {
    "conv1d": (lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=2), (2, 3, 11), (4, 3, 3)),
    "conv2d_dilated_grouped": (lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, dilation=2, groups=2),
                               (2, 4, 9, 9), (6, 2, 3, 3)),
    "conv2d_same": (lambda x, w, b: F.conv2d(x, w, b, padding="same"), (2, 3, 7, 6), (5, 3, 3, 2)),
    "conv3d": (lambda x, w, b: F.conv3d(x, w, b, stride=(1, 2, 1), padding=(1, 0, 1)), (1, 2, 5, 6, 4),
               (3, 2, 2, 3, 3)),
    "conv_transpose1d": (lambda x, w, b: F.conv_transpose1d(x, w, b, stride=3, output_padding=2),
                         (2, 4, 5), (4, 3, 3)),
    "conv_transpose2d_grouped": (
        lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1, groups=2, dilation=2),
        (2, 4, 5, 5), (4, 3, 3, 3)),
    "conv_transpose3d": (lambda x, w, b: F.conv_transpose3d(x, w, b, stride=2, padding=1), (1, 2, 3, 4, 3),
                         (2, 3, 3, 3, 3)),
}


def _bias_size(name, weight_shape):
    groups = 2 if "grouped" in name else 1
    return weight_shape[1] * groups if "transpose" in name else weight_shape[0]


@pytest.mark.parametrize("name", list(CONVOLUTIONS))
def test_convolution(dev, name):
    fn, x, w = CONVOLUTIONS[name]
    compare(dev, fn, [sample(x), sample(w, seed=2), sample((_bias_size(name, w),), seed=3)], native=CONV)


def test_convolution_bfloat16_and_without_bias(dev):
    x, w = sample((2, 3, 8, 8), torch.bfloat16), sample((4, 3, 3, 3), torch.bfloat16, seed=2)
    compare(dev, lambda x, w: F.conv2d(x, w, padding=1), [x, w], native=CONV, tol=BF16, reference=torch.float32)


def test_convolution_backward_returns_only_requested_gradients(dev):
    """Only the input needs a gradient: the weight's is not computed (output_mask)."""
    x, w = sample((2, 3, 6, 6)), sample((4, 3, 3, 3), seed=2)
    compare(dev, lambda x, w: F.conv2d(x, w), [x, w], differentiable=[0], native=CONV)
    grads = aten.convolution_backward_overrideable(
        sample((2, 4, 4, 4)).to(dev), x.to(dev), w.to(dev), [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
        [False, True, False])
    assert grads[0] is None and grads[2] is None
    expected = aten.convolution_backward(sample((2, 4, 4, 4)), x, w, [4], [1, 1], [0, 0], [1, 1], False,
                                         [0, 0], 1, [False, True, False])[1]
    torch.testing.assert_close(grads[1].cpu(), expected, **F32)


@pytest.mark.parametrize("transposed", [False, True])
def test_convolution_bfloat16_adds_the_bias_before_rounding(dev, transposed):
    """The sum of products (8 + 5/128) stays float32 until the bias (-7.5) is added: rounding it
    to bfloat16 first (8.0) would return 0.5 for the exact 0.5390625, as a conv2d OpInfo
    sample did (3 bfloat16 ulps off)."""
    x = torch.tensor([8.0, 5 / 128], dtype=torch.bfloat16).reshape(1, 1, 1, 2)
    b = torch.tensor([-7.5], dtype=torch.bfloat16)
    if transposed:  # a 1x1 transposed convolution over two input channels sums them
        x, w = x.reshape(1, 2, 1, 1), torch.ones(2, 1, 1, 1, dtype=torch.bfloat16)
        fn = F.conv_transpose2d
    else:
        w = torch.ones(1, 1, 1, 2, dtype=torch.bfloat16)
        fn = F.conv2d
    got = fn(x.to(dev), w.to(dev), b.to(dev)).cpu()
    assert got.item() == 0.5390625
    cpu = fn(x, w, b)
    if transposed:
        # CPU's own transposed kernel differs by machine: on AVX-512 hosts it rounds once too
        # (0.5390625); on AVX2 hosts (seen on an AMD EPYC) it rounds the sum to bfloat16 first
        # (8.0625 - 7.5 = 0.5625), one bfloat16 ulp of the sum away. tpu keeps the exact one.
        assert cpu.item() in (0.5390625, 0.5625)
    else:
        assert torch.equal(got, cpu)
