"""Convolution lowerings: PyTorch's device hooks for every ``conv*d``/``conv_transpose*d``.

``torch.nn.functional.conv{1,2,3}d`` and ``conv_transpose{1,2,3}d`` reach a PrivateUse1 device as
``convolution_overrideable`` (and ``convolution_backward_overrideable`` under autograd), with
stride, padding, dilation, groups, ``transposed`` and ``output_padding`` spelled out. Both run
as one XLA convolution (``lax.conv_general_dilated``); the backward is the forward's ``jax.vjp``,
so it is exact for every configuration the forward supports.

These hook ops have no Meta kernel, so the machinery cannot cast results to PyTorch's dtypes:
the lowerings return the input's dtype themselves. Low-precision inputs accumulate in float32,
as PyTorch's CPU kernels do; float32 uses XLA's HIGHEST precision (full float32 on a TPU's MXU,
which otherwise rounds operands to bfloat16).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from accelkit_backends.tpu.lowering import lowering

aten = torch.ops.aten

_SPATIAL = "DHW"


def _dimension_numbers(spatial: int) -> tuple[str, str, str]:
    names = _SPATIAL[-spatial:] if spatial <= 3 else None
    if names is None:
        raise NotImplementedError(f"tpu convolution supports 1 to 3 spatial dimensions, not {spatial}")
    return "NC" + names, "OI" + names, "NC" + names


def _accumulator(dtype) -> object:
    return jnp.float32 if jnp.dtype(dtype).itemsize < 4 and jnp.issubdtype(dtype, jnp.floating) else None


def _transposed_weight(weight: jax.Array, groups: int) -> jax.Array:
    """A transposed convolution's weight ``(in, out/groups, *k)`` as the equivalent direct
    convolution's ``(out, in/groups, *k)``, spatially flipped."""
    c_in, c_out_per_group, *kernel = weight.shape
    w = weight.reshape(groups, c_in // groups, c_out_per_group, *kernel)
    w = jnp.swapaxes(w, 1, 2).reshape(groups * c_out_per_group, c_in // groups, *kernel)
    return jnp.flip(w, axis=tuple(range(2, 2 + len(kernel))))


def convolve(x, weight, stride, padding, dilation, transposed, output_padding, groups, rounded=True):
    """The convolution without bias (traced): in the input's dtype, or with ``rounded=False`` in
    the accumulator's (float32 for bfloat16/float16 inputs), for a bias to be added before the
    one rounding."""
    spatial = x.ndim - 2
    numbers = _dimension_numbers(spatial)
    accumulate = _accumulator(x.dtype)
    precision = jax.lax.Precision.HIGHEST
    if not transposed:
        out = jax.lax.conv_general_dilated(
            x, weight, window_strides=tuple(stride), padding=[(p, p) for p in padding],
            rhs_dilation=tuple(dilation), dimension_numbers=numbers, feature_group_count=groups,
            precision=precision, preferred_element_type=accumulate,
        )
    else:
        # The gradient of a direct convolution with respect to its input: dilate the input by
        # the stride, pad by the dilated kernel's reach minus the padding (plus output_padding
        # on the high side), convolve with the flipped, in/out-swapped kernel.
        kernel = weight.shape[2:]
        pads = [
            (d * (k - 1) - p, d * (k - 1) - p + op)
            for k, p, d, op in zip(kernel, padding, dilation, output_padding)
        ]
        out = jax.lax.conv_general_dilated(
            x, _transposed_weight(weight, groups), window_strides=(1,) * spatial, padding=pads,
            lhs_dilation=tuple(stride), rhs_dilation=tuple(dilation), dimension_numbers=numbers,
            feature_group_count=groups, precision=precision, preferred_element_type=accumulate,
        )
    return out.astype(x.dtype) if rounded else out


@lowering(aten.convolution_overrideable.default)
def convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """The convolution plus ``bias``, added in the accumulator's dtype and rounded once, as CPU's
    kernels do (rounding the sum of products to bfloat16 first loses its low bits where the
    bias then cancels them: 3 bfloat16 ulps on a conv2d sample)."""
    out = convolve(x, weight, stride, padding, dilation, transposed, output_padding, groups, rounded=False)
    if bias is not None:
        out = out + bias.reshape((1, -1) + (1,) * (out.ndim - 2)).astype(out.dtype)
    return out.astype(x.dtype)


@lowering(aten.convolution_backward_overrideable.default)
def convolution_backward(grad, x, weight, stride, padding, dilation, transposed, output_padding,
                         groups, output_mask):
    """(grad_input, grad_weight, grad_bias); None where ``output_mask`` does not ask for one."""

    def forward(x, weight):
        return convolve(x, weight, stride, padding, dilation, transposed, output_padding, groups)

    _, pullback = jax.vjp(forward, x, weight)
    grad_input, grad_weight = pullback(grad.astype(x.dtype))
    grad_bias = None
    if output_mask[2]:
        axes = (0,) + tuple(range(2, grad.ndim))
        grad_bias = jnp.sum(grad, axis=axes, dtype=_accumulator(grad.dtype)).astype(grad.dtype)
    return (
        grad_input if output_mask[0] else None,
        grad_weight if output_mask[1] else None,
        grad_bias,
    )
