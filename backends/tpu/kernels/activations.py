"""Activation functions and the backward ops autograd calls for them.

Every formula follows PyTorch's CPU kernel (same branch conditions, same constants) and runs
in float32 for bfloat16/float16 inputs (:func:`~.elementwise.operands`); the machinery rounds
the result to the tensor's dtype. Ops whose schema is CompositeImplicitAutograd never reach the
device and are not here: ``silu_backward`` and ``mish_backward`` (autograd decomposes them into
``sigmoid``/``mul``/... which run here), ``relu6`` (``hardtanh``), ``dropout`` (``native_dropout``,
in random.py).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from accelkit_backends.tpu.kernels.elementwise import larger, operands, smaller
from accelkit_backends.tpu.lowering import lowering

aten = torch.ops.aten

_SQRT1_2 = 1 / math.sqrt(2)
_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)
_GELU_BETA = math.sqrt(2 / math.pi)
_GELU_KAPPA = 0.044715


def _zeros(x):
    return jnp.zeros((), x.dtype)


# ---------------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------------


@lowering(aten.relu.default)
def relu(x):
    return larger(x, _zeros(x)) if x.dtype != jnp.bool_ else x  # relu(-0.0) is -0.0, as on the CPU


@lowering(aten.sigmoid.default)
def sigmoid(x):
    (x,) = operands(x, floating=True)
    return jax.nn.sigmoid(x)


def _logit_bounds(x, eps):
    """``(eps, 1 - eps)`` computed in the input's dtype, as the CPU kernel does (in bfloat16,
    ``1 - 1e-3`` is 1, so the upper clamp does nothing there)."""
    low = jnp.asarray(eps).astype(x.dtype)
    return low, (jnp.ones((), x.dtype) - low)


@lowering(aten.logit.default)
def logit(x, eps=None):
    if not jnp.issubdtype(x.dtype, jnp.floating):
        (x,) = operands(x, floating=True)  # integers clamp as floats: eps=0.2 makes 0 into 0.2
    if eps is not None:
        low, high = _logit_bounds(x, eps)
        x = jnp.minimum(jnp.maximum(x, low), high)
    (x,) = operands(x, floating=True)
    return jnp.log(x / (1 - x))


@lowering(aten.gelu.default)
def gelu(x, approximate="none"):
    (x,) = operands(x, floating=True)
    if approximate == "tanh":
        inner = _GELU_BETA * (x + _GELU_KAPPA * x * x * x)
        return 0.5 * x * (1 + jnp.tanh(inner))
    return x * 0.5 * (1 + jax.lax.erf(x * _SQRT1_2))


@lowering(aten.silu.default)
def silu(x):
    (x,) = operands(x, floating=True)
    return x / (1 + jnp.exp(-x))


@lowering(aten.mish.default)
def mish(x):
    (x,) = operands(x, floating=True)
    return x * jnp.tanh(jax.nn.softplus(x))


@lowering(aten.softplus.default)
def softplus(x, beta=1, threshold=20):
    """``log1p(exp(beta*x))/beta``, and ``x`` itself where ``beta*x > threshold``."""
    x, beta, threshold = operands(x, beta, threshold, floating=True)
    scaled = x * beta
    return jnp.where(scaled > threshold, x, jnp.log1p(jnp.exp(scaled)) / beta)


@lowering(aten.elu.default)
def elu(x, alpha=1, scale=1, input_scale=1):
    x, alpha, scale, input_scale = operands(x, alpha, scale, input_scale, floating=True)
    return jnp.where(x <= 0, (jnp.exp(x * input_scale) - 1) * (alpha * scale), x * scale)


@lowering(aten.leaky_relu.default)
def leaky_relu(x, negative_slope=0.01):
    x, negative_slope = operands(x, negative_slope)
    return jnp.where(x > 0, x, x * negative_slope)


@lowering(aten.hardtanh.default)
def hardtanh(x, min_val=-1, max_val=1):
    x, min_val, max_val = operands(x, min_val, max_val)
    return smaller(larger(x, min_val), max_val)


@lowering(aten.hardsigmoid.default)
def hardsigmoid(x):
    (x,) = operands(x, floating=True)
    return jnp.clip(x + 3, 0, 6) / 6


@lowering(aten.hardswish.default)
def hardswish(x):
    (x,) = operands(x, floating=True)
    return x * jnp.clip(x + 3, 0, 6) / 6


@lowering(aten.threshold.default)
def threshold(x, threshold, value):
    x, threshold, value = operands(x, threshold, value)
    return jnp.where(x <= threshold, value, x)


@lowering(aten.log_sigmoid_forward.default)
def log_sigmoid_forward(x):
    """``(log sigmoid(x), exp(-|x|))``: the buffer is what the CPU kernel saves for backward."""
    (x,) = operands(x, floating=True)
    z = jnp.exp(-jnp.abs(x))
    return jnp.minimum(x, 0) - jnp.log1p(z), z


# ---------------------------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------------------------


@lowering(aten.threshold_backward.default)
def threshold_backward(grad, x, threshold):
    grad, x, threshold = operands(grad, x, threshold)
    return jnp.where(x <= threshold, jnp.zeros((), grad.dtype), grad)


@lowering(aten.gelu_backward.default)
def gelu_backward(grad, x, approximate="none"):
    grad, x = operands(grad, x, floating=True)
    if approximate == "tanh":
        x_sq = x * x
        tanh_inner = jnp.tanh(_GELU_BETA * (x + _GELU_KAPPA * x_sq * x))
        left_derivative = 0.5 * (1 + tanh_inner)
        right_derivative = 0.5 * x * (1 - tanh_inner * tanh_inner) * _GELU_BETA * (1 + 3 * _GELU_KAPPA * x_sq)
        return grad * (left_derivative + right_derivative)
    cdf = 0.5 * (1 + jax.lax.erf(x * _SQRT1_2))
    pdf = jnp.exp(-0.5 * x * x) * _INV_SQRT_2PI
    return grad * (cdf + x * pdf)


@lowering(aten.sigmoid_backward.default)
def sigmoid_backward(grad, output):
    grad, output = operands(grad, output, floating=True)
    return grad * (1 - output) * output


@lowering(aten.tanh_backward.default)
def tanh_backward(grad, output):
    grad, output = operands(grad, output, floating=True)
    return grad * (1 - output * output)


@lowering(aten.logit_backward.default)
def logit_backward(grad, x, eps=None):
    """Outside ``[eps, 1-eps]`` the gradient is 0; without ``eps``, NaN outside ``[0, 1]``."""
    if eps is None:
        low, high = jnp.zeros((), x.dtype), jnp.ones((), x.dtype)
    else:
        low, high = _logit_bounds(x, eps)
    outside = (x < low) | (x > high)
    grad, x = operands(grad, x, floating=True)
    inner = grad / (x * (1 - x))
    return jnp.where(outside, jnp.nan if eps is None else 0, inner)


@lowering(aten.softplus_backward.default)
def softplus_backward(grad, x, beta, threshold):
    grad, x, beta, threshold = operands(grad, x, beta, threshold, floating=True)
    z = jnp.exp(x * beta)
    return jnp.where(x * beta > threshold, grad, grad * z / (z + 1))


@lowering(aten.elu_backward.default)
def elu_backward(grad, alpha, scale, input_scale, is_result, self_or_result):
    grad, alpha, scale, input_scale, y = operands(grad, alpha, scale, input_scale, self_or_result, floating=True)
    negcoef = alpha * scale
    if is_result:
        negative = grad * input_scale * (y + negcoef)
    else:
        negative = grad * input_scale * negcoef * jnp.exp(y * input_scale)
    return jnp.where(y <= 0, negative, grad * scale)


@lowering(aten.leaky_relu_backward.default)
def leaky_relu_backward(grad, x, negative_slope, self_is_result):
    grad, x, negative_slope = operands(grad, x, negative_slope)
    return jnp.where(x > 0, grad, grad * negative_slope)


@lowering(aten.hardtanh_backward.default)
def hardtanh_backward(grad, x, min_val, max_val):
    grad, x, min_val, max_val = operands(grad, x, min_val, max_val)
    return jnp.where((x <= min_val) | (x >= max_val), jnp.zeros((), grad.dtype), grad)


@lowering(aten.hardsigmoid_backward.default)
def hardsigmoid_backward(grad, x):
    grad, x = operands(grad, x, floating=True)
    return jnp.where((x > -3) & (x < 3), grad / 6, 0)


@lowering(aten.hardswish_backward.default)
def hardswish_backward(grad, x):
    """0 up to -3, the identity's gradient from 3 on (both ends included, as on CPU)."""
    grad, x = operands(grad, x, floating=True)
    return jnp.where(x <= -3, 0, jnp.where(x < 3, grad * (x / 3 + 0.5), grad))


@lowering(aten.log_sigmoid_backward.default)
def log_sigmoid_backward(grad, x, buffer):
    """The CPU formula, with ``buffer`` = ``exp(-|x|)`` (recomputed if the buffer is empty)."""
    grad, x, buffer = operands(grad, x, buffer, floating=True)
    z = buffer if buffer.shape == x.shape else jnp.exp(-jnp.abs(x))
    negative = x < 0
    max_deriv = jnp.where(negative, 1, 0)
    sign = jnp.where(negative, 1, -1)
    return (max_deriv - sign * (z / (1 + z))) * grad
