"""tpu activations (kernels/activations.py) compared with PyTorch on CPU, forward and backward:
relu, gelu (exact and tanh), sigmoid, tanh, silu, mish, softplus, elu and selu (in place
too), leaky_relu, hardtanh and relu6, hardsigmoid, hardswish, threshold, logsigmoid and logit, in
float32 and, where opmath or dtype-dependent branch edges matter, bfloat16; and the backward ops
called directly at their branch edges (exactly on the thresholds).

Each check runs the same call on CPU tensors and on tpu copies (non-contiguous views made on the
device) under the ``deny`` fallback policy; values and gradients must match in value and dtype
(bfloat16 with bfloat16 tolerances), and the forward and backward ops must have run natively.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import accelkit
from conftest import assert_native, on_device
from harness_elementwise import assert_same, compare, sample, tolerance, transposed

aten = torch.ops.aten

#: bfloat16 keeps 8 bits of mantissa: one rounding is up to 2**-8 relative.


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Activations, forward and backward
# ---------------------------------------------------------------------------------------------

#: name -> (function, forward op, backward op or None when autograd decomposes the backward)
ACTIVATIONS = {
    "relu": (F.relu, "aten.relu.default", "aten.threshold_backward.default"),
    "gelu": (F.gelu, "aten.gelu.default", "aten.gelu_backward.default"),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), "aten.gelu.default", "aten.gelu_backward.default"),
    "sigmoid": (torch.sigmoid, "aten.sigmoid.default", "aten.sigmoid_backward.default"),
    "tanh": (torch.tanh, "aten.tanh.default", "aten.tanh_backward.default"),
    "silu": (F.silu, "aten.silu.default", None),  # silu_backward is CompositeImplicitAutograd
    "mish": (F.mish, "aten.mish.default", None),  # mish_backward is CompositeImplicitAutograd
    "softplus": (F.softplus, "aten.softplus.default", "aten.softplus_backward.default"),
    "softplus_beta": (lambda x: F.softplus(x * 10, beta=2, threshold=5), "aten.softplus.default",
                      "aten.softplus_backward.default"),
    "elu": (lambda x: F.elu(x, alpha=0.7), "aten.elu.default", "aten.elu_backward.default"),
    "selu": (F.selu, "aten.elu.default", "aten.elu_backward.default"),
    "elu_inplace": (lambda x: F.elu(x * 1, inplace=True), "aten.elu_.default", "aten.elu_backward.default"),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.2), "aten.leaky_relu.default", "aten.leaky_relu_backward.default"),
    "hardtanh": (lambda x: F.hardtanh(x * 2, -1.5, 0.5), "aten.hardtanh.default", "aten.hardtanh_backward.default"),
    "relu6": (lambda x: F.relu6(x * 4), "aten.hardtanh.default", "aten.hardtanh_backward.default"),
    "hardsigmoid": (lambda x: F.hardsigmoid(x * 4), "aten.hardsigmoid.default", "aten.hardsigmoid_backward.default"),
    "hardswish": (lambda x: F.hardswish(x * 4), "aten.hardswish.default", "aten.hardswish_backward.default"),
    "threshold": (lambda x: F.threshold(x, 0.1, -3.0), "aten.threshold.default", "aten.threshold_backward.default"),
    "logsigmoid": (lambda x: F.logsigmoid(x * 8), "aten.log_sigmoid_forward.default",
                   "aten.log_sigmoid_backward.default"),
    "logit_eps": (lambda x: torch.logit(torch.sigmoid(x * 8), eps=1e-3), "aten.logit.default",
                  "aten.logit_backward.default"),
    "logit": (lambda x: torch.logit(torch.sigmoid(x)), "aten.logit.default", "aten.logit_backward.default"),
}


#: bfloat16 runs for the activations with float32 opmath or dtype-dependent branch edges
BF16_ACTIVATIONS = {"gelu", "gelu_tanh", "silu", "softplus", "elu", "hardswish", "logsigmoid", "logit_eps"}


@pytest.mark.parametrize(("name", "dtype"), [
    (name, dtype) for name in sorted(ACTIVATIONS)
    for dtype in [torch.float32] + ([torch.bfloat16] if name in BF16_ACTIVATIONS else [])
], ids=str)
def test_activation_forward_and_backward(dev, name, dtype):
    fn, forward, backward = ACTIVATIONS[name]
    x = transposed((6, 5), dtype) * 3
    grad = sample((6, 5), dtype, seed=7)
    x_cpu = x.detach().requires_grad_()
    expected = fn(x_cpu)
    expected.backward(grad)
    x_dev = on_device(x, dev).detach().requires_grad_()
    with accelkit.fallback_policy("deny"):
        actual = fn(x_dev)
        actual.backward(grad.to(dev))
    tol = tolerance(x)
    assert_same(actual.detach(), expected.detach(), **tol)
    assert_same(x_dev.grad, x_cpu.grad, **tol)
    assert_native(forward, *([backward] if backward else []))


def test_logit_of_integers_clamps_them_as_floats(dev):
    # eps=0.2 makes 0 into 0.2 and 1 into 0.8 (clamped in the integer dtype, both would stay).
    for dtype in (torch.int64, torch.uint8, torch.bool):
        x = torch.tensor([0, 1, 1, 0], dtype=dtype)
        compare(dev, lambda a: torch.logit(a, 0.2), x)
        compare(dev, torch.logit, x)
    assert_native("aten.logit.default")


def test_activation_backward_ops_called_directly(dev):
    """The backward ops on their own, at the branch edges (exactly on thresholds)."""
    x = torch.tensor([-4.0, -3.0, -1.0, 0.0, 0.1, 1.0, 3.0, 4.0, 25.0])
    g = torch.linspace(-1, 1, 9)
    compare(dev, lambda a, b: aten.threshold_backward(a, b, 0.1), g, x)
    compare(dev, lambda a, b: aten.hardtanh_backward(a, b, -1.0, 1.0), g, x)
    compare(dev, lambda a, b: aten.hardsigmoid_backward(a, b), g, x)
    compare(dev, lambda a, b: aten.hardswish_backward(a, b), g, x)
    compare(dev, lambda a, b: aten.leaky_relu_backward(a, b, 0.3, False), g, x)
    compare(dev, lambda a, b: aten.softplus_backward(a, b, 1.0, 20.0), g, x)
    compare(dev, lambda a, b: aten.elu_backward(a, 1.0, 1.0507, 1.0, True, F.elu(b)), g, x)
    compare(dev, lambda a, b: aten.elu_backward(a, 1.0, 1.0, 2.0, False, b), g, x)
    p = torch.tensor([-0.5, 0.0, 1e-4, 0.3, 0.5, 0.9999, 1.0, 1.5, 0.7])
    compare(dev, lambda a, b: aten.logit_backward(a, b), g, p)
    compare(dev, lambda a, b: aten.logit_backward(a, b, 1e-3), g, p)
    compare(dev, lambda a, b: aten.log_sigmoid_backward(a, b, torch.exp(-b.abs())), g, x)
    assert_native("aten.hardswish_backward.default", "aten.elu_backward.default",
                  "aten.logit_backward.default", "aten.log_sigmoid_backward.default")
