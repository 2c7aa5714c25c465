"""Convolution's slow paths (``decompositions/conv.py``) against the CPU's own slow kernels, the
fallback denied: 2-d forward/backward, dilated and transposed 2-d and 3-d, float32 and bfloat16
(within float rounding: the products are summed in another order)."""

from __future__ import annotations

import accelkit
import pytest
import torch

from conftest import assert_decomposed

aten = torch.ops.aten
GEN = torch.Generator().manual_seed(0)


pytestmark = pytest.mark.usefixtures("deny_fallback")


def _random(*shape, dtype):
    return torch.randn(shape, generator=GEN).to(dtype)


def _close(device_result, expected):
    got = device_result.cpu()
    assert got.dtype == expected.dtype and got.shape == expected.shape
    # bfloat16: the CPU's slow kernels round partial sums to bfloat16 on the way (a 3-d one per
    # depth tap), these round once from float32; a wrong tap or offset misses by O(1)
    tolerance = dict(atol=8e-2, rtol=5e-2) if expected.dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got, expected, **tolerance)


def _both(op, tensors, *rest, dev):
    return op(*tensors, *rest), op(*(t.to(dev) if isinstance(t, torch.Tensor) else t for t in tensors), *rest)


DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_slow_conv2d_forward(dev, dtype, with_bias):
    x, w = _random(2, 3, 9, 8, dtype=dtype), _random(4, 3, 3, 2, dtype=dtype)
    bias = _random(4, dtype=dtype) if with_bias else None
    expected = aten._slow_conv2d_forward(x, w, [3, 2], bias, [2, 1], [1, 0])
    device_bias = None if bias is None else bias.to(dev)
    got = aten._slow_conv2d_forward(x.to(dev), w.to(dev), [3, 2], device_bias, [2, 1], [1, 0])
    _close(got, expected)
    assert_decomposed("aten._slow_conv2d_forward")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask", [[True, True, True], [True, False, False], [False, True, True]])
def test_slow_conv2d_backward(dev, dtype, mask):
    x, w = _random(2, 3, 9, 8, dtype=dtype), _random(4, 3, 3, 2, dtype=dtype)
    grad = _random(2, 4, 5, 7, dtype=dtype)
    args = ([3, 2], [2, 1], [1, 0], mask)
    expected = aten._slow_conv2d_backward.output_mask(grad, x, w, *args)
    got = aten._slow_conv2d_backward.output_mask(grad.to(dev), x.to(dev), w.to(dev), *args)
    for e, g, wanted in zip(expected, got, mask):
        if wanted:
            _close(g, e)
    assert_decomposed("aten._slow_conv2d_backward")


@pytest.mark.parametrize("dtype", DTYPES)
def test_slow_conv2d_backward_into_given_tensors(dev, dtype):
    x, w = _random(2, 3, 9, 8, dtype=dtype), _random(4, 3, 3, 2, dtype=dtype)
    grad = _random(2, 4, 5, 7, dtype=dtype)
    args = ([3, 2], [2, 1], [1, 0])
    expected = aten._slow_conv2d_backward.output_mask(grad, x, w, *args, [True, True, True])
    outs = [torch.empty(0, dtype=dtype, device=dev) for _ in range(3)]
    returned = aten._slow_conv2d_backward.grad_input(grad.to(dev), x.to(dev), w.to(dev), *args, grad_input=outs[0],
                                                     grad_weight=outs[1], grad_bias=outs[2])
    for e, out, r in zip(expected, outs, returned):
        _close(out, e)
        assert r is out
    assert_decomposed("aten._slow_conv2d_backward")


@pytest.mark.parametrize("dtype", DTYPES)
def test_slow_conv_dilated2d(dev, dtype):
    x, w, b = _random(2, 3, 11, 10, dtype=dtype), _random(5, 3, 3, 3, dtype=dtype), _random(5, dtype=dtype)
    expected, got = _both(aten.slow_conv_dilated2d, (x, w), [3, 3], None, [1, 2], [2, 1], [2, 3], dev=dev)
    _close(got, expected)
    expected, got = _both(aten.slow_conv_dilated2d, (x, w, [3, 3], b), [1, 1], [0, 0], [1, 1], dev=dev)
    _close(got, expected)
    assert_decomposed("aten.slow_conv_dilated2d")


@pytest.mark.parametrize("dtype", DTYPES)
def test_slow_conv_transpose2d(dev, dtype):
    x, w, b = _random(2, 3, 5, 6, dtype=dtype), _random(3, 4, 3, 2, dtype=dtype), _random(4, dtype=dtype)
    expected, got = _both(aten.slow_conv_transpose2d, (x, w, [3, 2], b), [2, 2], [1, 0], [1, 1], [1, 2], dev=dev)
    _close(got, expected)
    assert_decomposed("aten.slow_conv_transpose2d")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("geometry", [([1, 1, 1], [0, 0, 0]), ([2, 1, 2], [1, 0, 1])], ids=["plain", "strided"])
def test_slow_conv3d_forward(dev, dtype, geometry):
    stride, padding = geometry
    x, w, b = _random(2, 3, 6, 5, 7, dtype=dtype), _random(4, 3, 3, 2, 3, dtype=dtype), _random(4, dtype=dtype)
    expected, got = _both(aten.slow_conv3d_forward, (x, w, [3, 2, 3], b), stride, padding, dev=dev)
    _close(got, expected)
    assert_decomposed("aten.slow_conv3d_forward")


@pytest.mark.parametrize("dtype", DTYPES)
def test_slow_conv_dilated3d(dev, dtype):
    x, w = _random(1, 2, 8, 7, 7, dtype=dtype), _random(3, 2, 2, 3, 2, dtype=dtype)
    expected, got = _both(aten.slow_conv_dilated3d, (x, w, [2, 3, 2]), None, [1, 2, 1], [1, 1, 0], [3, 1, 2], dev=dev)
    _close(got, expected)
    assert_decomposed("aten.slow_conv_dilated3d")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("geometry", [([1, 1, 1], [0, 0, 0], [0, 0, 0], [1, 1, 1]),
                                      ([2, 2, 1], [1, 0, 1], [1, 1, 0], [2, 1, 1])], ids=["plain", "strided"])
def test_slow_conv_transpose3d(dev, dtype, geometry):
    stride, padding, output_padding, dilation = geometry
    x, w, b = _random(2, 3, 4, 5, 3, dtype=dtype), _random(3, 2, 3, 2, 2, dtype=dtype), _random(2, dtype=dtype)
    expected, got = _both(aten.slow_conv_transpose3d, (x, w, [3, 2, 2], b), stride, padding, output_padding,
                          dilation, dev=dev)
    _close(got, expected)
    assert_decomposed("aten.slow_conv_transpose3d")


# ``F.conv3d`` and ``F.conv_transpose3d`` reach the device as ``convolution_overrideable``, whose
# kernel is 2-d: it declines 3-d calls, which run as the depth-tap sums (decompose_declined)


def _conv3d_with_gradients(x, w, b, geometry, transposed, groups, grad_dtype):
    stride, padding, output_padding, dilation = geometry
    x, w, b = (t.detach().clone().requires_grad_() for t in (x, w, b))
    if transposed:
        y = torch.nn.functional.conv_transpose3d(x, w, b, stride, padding, output_padding, groups, dilation)
    else:
        y = torch.nn.functional.conv3d(x, w, b, stride, padding, dilation, groups)
    grad = torch.linspace(-1, 1, y.numel(), dtype=torch.float32).reshape(y.shape).to(grad_dtype).to(y.dtype)
    y.backward(grad.to(y.device))
    return [t.cpu() for t in (y, x.grad, w.grad, b.grad)]


CONV3D_GEOMETRIES = {  # stride, padding, output_padding (transposed only), dilation
    "plain": ([1, 1, 1], [0, 0, 0], [0, 0, 0], [1, 1, 1]),
    "strided": ([2, 1, 2], [1, 0, 1], [1, 0, 1], [1, 2, 1]),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("transposed", [False, True], ids=["direct", "transposed"])
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("geometry", list(CONV3D_GEOMETRIES.values()), ids=list(CONV3D_GEOMETRIES))
def test_conv3d_and_its_gradients_run_on_the_device(dev, dtype, transposed, groups, geometry):
    if not transposed:
        geometry = geometry[:2] + ([0, 0, 0],) + geometry[3:]
    shape = (4, 6 // groups) if transposed else (6, 4 // groups)
    x, w, b = _random(2, 4, 5, 6, 5, dtype=dtype), _random(*shape, 3, 2, 3, dtype=dtype), _random(6, dtype=dtype)
    # bfloat16: the CPU's kernels round partial sums to bfloat16 on the way (measured 0.14 off
    # at a cancelling output of 0.27), the tap sums round float32 sums once: so the reference is
    # the CPU's float32 result for the same values, rounded once, within one bfloat16 step
    expected = _conv3d_with_gradients(x.float(), w.float(), b.float(), geometry, transposed, groups, dtype)
    got = _conv3d_with_gradients(x.to(dev), w.to(dev), b.to(dev), geometry, transposed, groups, dtype)
    for g, e in zip(got, expected):
        assert g.dtype == dtype and g.shape == e.shape
        torch.testing.assert_close(g.float(), e.to(dtype).float(), atol=1e-4, rtol=2 ** -7 if dtype == torch.bfloat16 else 1e-4)
    assert_decomposed("aten.convolution_overrideable.default", "aten.convolution_backward_overrideable.default")


def test_an_integer_3d_convolution_is_left_to_the_cpu(dev):
    """The depth-tap sums take real floats only: an integer call goes on to the CPU fallback."""
    x = torch.arange(54, dtype=torch.int32).reshape(1, 2, 3, 3, 3)
    w = torch.arange(8, dtype=torch.int32).reshape(2, 2, 2, 1, 1)
    accelkit.reset_stats()
    with accelkit.fallback_policy("allow"):
        got = torch.nn.functional.conv3d(x.to(dev), w.to(dev))
    assert torch.equal(got.cpu(), torch.nn.functional.conv3d(x, w))
    counts = accelkit.stats()["ops"]["aten.convolution_overrideable.default"]
    assert counts["fallback"] == 1 and counts["decomposed"] == 0
