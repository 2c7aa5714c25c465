"""Softmax and log-softmax lowerings, forward and backward.

``softmax``/``log_softmax`` are CompositeImplicitAutograd: they reach the device as ``_softmax``
and ``_log_softmax`` (with ``half_to_float`` from a ``dtype=`` request), and autograd calls the
``*_backward_data`` ops. bfloat16/float16 are computed in float32, as PyTorch's CPU kernels do;
the machinery casts results to the dtype PyTorch's Meta kernel names. A slice whose elements are
all ``-inf`` gives NaN, as on CPU.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from accelkit_backends.tpu.kernels.reductions import along, upcast
from accelkit_backends.tpu.lowering import lowering

aten = torch.ops.aten


def _shifted(x, axis):
    """``x`` minus its maximum along ``axis`` (an empty slice shifts by nothing)."""
    return x - jnp.max(x, axis=axis, keepdims=True, initial=-jnp.inf)


@lowering(aten._softmax.default)
def softmax(x, dim, half_to_float):
    def compute(v, axis):
        exps = jnp.exp(_shifted(upcast(v), axis))
        return exps / jnp.sum(exps, axis=axis, keepdims=True)

    return along(x, dim, compute)


@lowering(aten._log_softmax.default)
def log_softmax(x, dim, half_to_float):
    def compute(v, axis):
        shifted = _shifted(upcast(v), axis)
        return shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis=axis, keepdims=True))

    return along(x, dim, compute)


@lowering(aten._softmax_backward_data.default)
def softmax_backward(grad_output, output, dim, input_dtype):
    """grad_input = y * (g - sum(g * y)) along ``dim``, with y the softmax's output."""

    def compute(g, axis):
        y = upcast(output.reshape(g.shape))
        g = upcast(g)
        return y * (g - jnp.sum(g * y, axis=axis, keepdims=True))

    return along(grad_output, dim, compute)


@lowering(aten._log_softmax_backward_data.default)
def log_softmax_backward(grad_output, output, dim, input_dtype):
    """grad_input = g - exp(y) * sum(g) along ``dim``, with y the log-softmax's output."""

    def compute(g, axis):
        y = upcast(output.reshape(g.shape))
        g = upcast(g)
        return g - jnp.exp(y) * jnp.sum(g, axis=axis, keepdims=True)

    return along(grad_output, dim, compute)
