"""Antialiased 2-d resampling (``_upsample_bilinear2d_aa``, ``_upsample_bicubic2d_aa``,
``_upsample_lanczos2d_aa`` and their backwards) as two matmuls with weight matrices: the
resampling is separable, output row ``o`` of a dim a weighted sum of a window of input rows, so
``out = W_h @ x @ W_wᵀ`` and the backward ``grad_x = W_hᵀ @ grad @ W_w``, on the Tensor engine
(float32 accumulation). Float32 only: the CPU has no reduced-float kernel (other dtypes go to it,
for its error).

The weights are the CPU kernel's (``UpSampleKernel.cpp``'s antialiased path): with ``scale``
input positions per output position, the filter is stretched by ``max(scale, 1)``: output ``o``
centred at ``scale * (o + 0.5)`` reads the inputs ``[int(center - support + 0.5), int(center +
support + 0.5))`` (clipped to the input), ``support = max(scale, 1) * radius``, each weighted by
``filter((j - center + 0.5) / max(scale, 1))`` and the window normalised to sum 1. Filters:
triangle (radius 1), cubic convolution with ``a = -0.5`` (radius 2), Lanczos-3 (radius 3). They
are computed on the host in float32 from the sizes alone (as the CPU computes them, once per
call) and uploaded: ``[out, in]`` numbers, no data. Within float rounding of the CPU's results.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch
from torch._ops import OpOverload

aten = torch.ops.aten


def _triangle(x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    return np.where(x < 1, 1 - x, 0).astype(np.float32)


def _cubic(x: np.ndarray) -> np.ndarray:
    a = np.float32(-0.5)
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1, near, np.where(x < 2, far, 0)).astype(np.float32)


def _lanczos(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return np.where(np.abs(x) < 3, np.sinc(x) * np.sinc(x / 3), 0).astype(np.float32)


#: Each resampling's filter and its radius in input positions (before stretching).
_FILTERS = {"bilinear": (_triangle, 1.0), "bicubic": (_cubic, 2.0), "lanczos": (_lanczos, 3.0)}


def _scale(in_size: int, out_size: int, align_corners: bool, scale: float | None) -> float:
    if align_corners:
        value = (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
    else:
        value = 1.0 / scale if scale is not None and scale > 0 else in_size / out_size
    return float(np.float32(value))


def _weights(in_size: int, out_size: int, align_corners: bool, scale: float | None, kind: str) -> np.ndarray:
    """The ``[out_size, in_size]`` float32 matrix of the CPU's antialiased weights."""
    filter_fn, radius = _FILTERS[kind]
    step = np.float32(_scale(in_size, out_size, align_corners, scale))
    stretch = max(step, np.float32(1.0))
    support = np.float32(radius * stretch) if step >= 1 else np.float32(radius)
    inverse = np.float32(1.0) / step if step >= 1 else np.float32(1.0)
    matrix = np.zeros((out_size, in_size), dtype=np.float32)
    for o in range(out_size):
        center = step * np.float32(o + 0.5)
        low = max(int(center - support + np.float32(0.5)), 0)
        high = min(int(center + support + np.float32(0.5)), in_size)
        taps = np.arange(low, high, dtype=np.float32)
        w = filter_fn((taps - center + np.float32(0.5)) * inverse)
        total = w.sum(dtype=np.float32)
        matrix[o, low:high] = w / total if total != 0 else w
    return matrix


def _matrices(input_size, output_size, align_corners, scales_h, scales_w, kind, device):
    (in_h, in_w), (out_h, out_w) = input_size[-2:], output_size
    rows = torch.from_numpy(_weights(in_h, out_h, align_corners, scales_h, kind)).to(device)
    cols = torch.from_numpy(_weights(in_w, out_w, align_corners, scales_w, kind)).to(device)
    return rows, cols


def _forward(kind: str) -> Callable:
    def resample(self, output_size, align_corners, scales_h=None, scales_w=None):
        if self.dim() != 4 or self.numel() == 0 or self.dtype != torch.float32:
            return NotImplemented  # the CPU's checks, empty shapes, and the dtypes it has no kernel for (its error)
        rows, cols = _matrices(self.shape, output_size, align_corners, scales_h, scales_w, kind, self.device)
        n, c, h, w = self.shape
        x = self.reshape(n * c, h, w)
        out = torch.matmul(torch.matmul(rows, x), cols.t())
        return out.reshape(n, c, *output_size)

    return resample


def _backward(kind: str) -> Callable:
    def resample_backward(grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None):
        if grad_output.numel() == 0 or grad_output.dtype != torch.float32:
            return NotImplemented
        rows, cols = _matrices(input_size, output_size, align_corners, scales_h, scales_w, kind, grad_output.device)
        n, c = input_size[:2]
        g = grad_output.reshape(n * c, *output_size)
        grad = torch.matmul(torch.matmul(rows.t(), g), cols)
        return grad.reshape(input_size)

    return resample_backward


def decompositions() -> Mapping[OpOverload, Callable]:
    """The decompositions above, keyed by aten overload (their ``out=`` forms follow)."""
    table = {}
    for kind in _FILTERS:
        table[getattr(aten, f"_upsample_{kind}2d_aa").default] = _forward(kind)
        table[getattr(aten, f"_upsample_{kind}2d_aa_backward").default] = _backward(kind)
    return table
