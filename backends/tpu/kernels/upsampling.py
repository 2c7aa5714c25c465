"""Upsampling lowerings PyTorch's decompositions leave to the device: bicubic
(``upsample_bicubic2d``) and antialiased bilinear (``_upsample_bilinear2d_aa``) resizing.

Both are separable: the output is ``W_h @ x @ W_w^T`` over the last two dimensions, with
``W`` (output size x input size) built on the host from the static sizes and scales — in float32
arithmetic, as PyTorch's CPU kernels compute their source indices and weights, so the taps
agree. Low-precision inputs are resized in float32.

- bicubic: each output reads the 4 inputs around its source position (clamped at the border)
  with PyTorch's cubic-convolution weights (A = -0.75); ``align_corners`` maps corner centres
  to corner centres;
- antialiased bilinear: a triangle filter widened by the downscaling factor (PIL's method, as
  PyTorch implements it), its weights normalised to sum to 1 per output.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from accelkit_backends.tpu.lowering import lowering

aten = torch.ops.aten
f32 = np.float32


def _scale(size: int, out: int, align_corners: bool, scale) -> np.float32:
    """PyTorch's ``area_pixel_compute_scale``: input pixels per output pixel."""
    if align_corners:
        return f32((size - 1) / (out - 1)) if out > 1 else f32(0)
    if scale is not None and scale > 0:
        return f32(1) / f32(scale)
    return f32(size) / f32(out)


def _cubic(t: np.float32) -> list[np.float32]:
    a = f32(-0.75)

    def near(x):
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _bicubic_matrix(size: int, out: int, align_corners: bool, scale) -> np.ndarray:
    ratio = _scale(size, out, align_corners, scale)
    matrix = np.zeros((out, size), np.float32)
    for i in range(out):
        source = ratio * f32(i) if align_corners else ratio * (f32(i) + f32(0.5)) - f32(0.5)
        base = int(np.floor(source))
        for k, weight in enumerate(_cubic(f32(source - base))):
            matrix[i, min(max(base - 1 + k, 0), size - 1)] += weight
    return matrix


def _antialiased_linear_matrix(size: int, out: int, align_corners: bool, scale) -> np.ndarray:
    ratio = _scale(size, out, align_corners, scale)
    support = f32(ratio) if ratio >= 1 else f32(1)  # interp_size / 2 = 1, widened when shrinking
    inverse = f32(1) / ratio if ratio >= 1 else f32(1)
    matrix = np.zeros((out, size), np.float32)
    for i in range(out):
        centre = ratio * (f32(i) + f32(0.5))
        low = max(int(centre - support + f32(0.5)), 0)  # int() truncates, as a C++ cast
        high = min(int(centre + support + f32(0.5)), size)
        weights = [max(f32(0), f32(1) - abs((f32(j) - centre + f32(0.5)) * inverse)) for j in range(low, high)]
        total = f32(sum(weights, f32(0)))
        if total != 0:
            matrix[i, low:high] = np.asarray(weights, np.float32) / total
    return matrix


def _resize(x, output_size, matrices):
    compute = jnp.float32 if x.dtype in (jnp.bfloat16, jnp.float16) else x.dtype
    rows, columns = (jnp.asarray(m, compute) for m in matrices)
    return jnp.einsum("oh,...hw,pw->...op", rows, x.astype(compute), columns, precision=jax.lax.Precision.HIGHEST)


@lowering(aten.upsample_bicubic2d.default, static=("scales_h", "scales_w"))
def upsample_bicubic2d(x, output_size, align_corners, scales_h=None, scales_w=None):
    (h, w), (oh, ow) = x.shape[-2:], tuple(output_size)
    return _resize(x, output_size, (_bicubic_matrix(h, oh, align_corners, scales_h),
                                    _bicubic_matrix(w, ow, align_corners, scales_w)))


@lowering(aten._upsample_bilinear2d_aa.default, static=("scales_h", "scales_w"))
def upsample_bilinear2d_aa(x, output_size, align_corners, scales_h=None, scales_w=None):
    (h, w), (oh, ow) = x.shape[-2:], tuple(output_size)
    return _resize(x, output_size, (_antialiased_linear_matrix(h, oh, align_corners, scales_h),
                                    _antialiased_linear_matrix(w, ow, align_corners, scales_w)))
