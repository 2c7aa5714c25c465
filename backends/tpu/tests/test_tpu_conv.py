"""tpu convolution (kernels/conv.py: ``convolution_overrideable`` and its backward) compared
with PyTorch on CPU, forward and backward: 1-d, 2-d and 3-d convolutions, strided, padded
(``"same"`` too), dilated and grouped, their transposes with ``output_padding``, bfloat16 and no
bias, and a backward that computes only the gradients asked for (``output_mask``).

The forward-and-backward checks (``compare``) run one functional call on CPU leaf tensors and
on tpu copies, under ``fallback_policy("deny")``, compare the outputs, then back-propagate the
same random cotangent on both and compare every input gradient; they also assert that the ops
named ran as tpu lowerings. float32 is compared at 1e-5 (XLA sums in another order than
PyTorch's CPU kernels: a few ulps), bfloat16 at bfloat16's resolution.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import accelkit

aten = torch.ops.aten
F32 = {"rtol": 1e-5, "atol": 1e-5}
BF16 = {"rtol": 2e-2, "atol": 2e-2}


def sample(shape, dtype=torch.float32, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def compare(dev, fn, inputs, native=(), differentiable=None, tol=F32, reference=None):
    """Run ``fn`` on CPU and tpu copies of ``inputs``; compare outputs and the gradients of the
    floating inputs listed in ``differentiable`` (all floating inputs by default).

    ``reference``: a dtype the CPU computes in instead of the inputs' (results rounded back),
    where CPU's own low-precision kernel depends on the machine (its bfloat16 convolution
    accumulates differently with and without AVX-512).
    """
    if differentiable is None:
        differentiable = [i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    tpu = [t.detach().to(dev).requires_grad_(i in differentiable) if isinstance(t, torch.Tensor) else t
           for i, t in enumerate(inputs)]
    if reference is not None:
        inputs = [t.to(reference) if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs]
    cpu = [t.clone().requires_grad_(i in differentiable) if isinstance(t, torch.Tensor) else t
           for i, t in enumerate(inputs)]
    accelkit.reset_stats()
    with accelkit.fallback_policy("deny"):
        expected, actual = fn(*cpu), fn(*tpu)
        expected = expected if isinstance(expected, tuple) else (expected,)
        actual = actual if isinstance(actual, tuple) else (actual,)
        rounded = (lambda e, like: e.to(like.dtype)) if reference is not None else (lambda e, like: e)
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a.cpu(), rounded(e, a), equal_nan=True, **tol)
        if differentiable:
            cotangent = sample(actual[0].shape, actual[0].dtype, seed=1)
            expected[0].backward(cotangent.to(expected[0].dtype))
            actual[0].backward(cotangent.to(dev))
            for i in differentiable:
                torch.testing.assert_close(tpu[i].grad.cpu(), rounded(cpu[i].grad, tpu[i]), **tol,
                                           msg=f"gradient of input {i}")
    counts = accelkit.stats()["ops"]
    for op in native:
        assert counts.get(op, {}).get("native", 0) > 0, f"{op} did not run natively: {counts.get(op)}"
    return tpu


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
