"""Pooling lowerings: max (with indices), average, adaptive average and adaptive max, 2-d and 3-d.

Windows are read as strided slices of the (padded) input, one slice per kernel offset, so a
window reduction is an elementwise max/sum over ``prod(kernel_size)`` arrays: no gather, and the
output-size, ``ceil_mode`` and divisor rules are PyTorch's, computed statically from the shapes.
Max pooling returns PyTorch's indices (flat positions within each input plane, first maximum
wins, NaN propagates); its backward scatters the gradient to them. Average pooling's backward is
the ``jax.vjp`` of its window sum. Adaptive average pooling is a pair of 0/1 matrices (which
inputs each output window covers), so forward and backward are matmuls. Adaptive max pooling
reads its unequal windows as the longest one, masked, and shares max pooling's backward.

Low-precision inputs are summed in float32, as on CPU; results are cast back by the machinery.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from accelkit_backends.tpu import checks
from accelkit_backends.tpu.lowering import lowering

aten = torch.ops.aten


def _tuple(value, spatial: int, default=None) -> tuple[int, ...]:
    if value is None or (isinstance(value, list | tuple) and len(value) == 0):
        value = default
    if isinstance(value, int):
        return (value,) * spatial
    return tuple(value) * spatial if len(value) == 1 else tuple(value)


def _out_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """PyTorch's pooling output size (``pooling_output_shape``)."""
    span = size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    out = span // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1  # the last window must start inside the input or the left padding
    return out


class _Windows:
    """Static geometry of one pooling call over the trailing ``spatial`` dimensions."""

    def __init__(self, shape, spatial, kernel_size, stride, padding, dilation, ceil_mode):
        self.spatial = spatial
        self.size = tuple(shape[-spatial:])
        self.kernel = _tuple(kernel_size, spatial)
        self.stride = _tuple(stride, spatial, default=self.kernel)
        self.padding = _tuple(padding, spatial)
        self.dilation = _tuple(dilation, spatial, default=1)
        self.out = tuple(
            _out_size(n, k, s, p, d, ceil_mode)
            for n, k, s, p, d in zip(self.size, self.kernel, self.stride, self.padding, self.dilation)
        )

    def pad(self, x: jax.Array, value) -> jax.Array:
        """``x`` padded so that every window's slice is in bounds (extra high-side padding for
        ``ceil_mode``)."""
        widths = [(0, 0)] * (x.ndim - self.spatial)
        for n, o, k, s, p, d in zip(self.size, self.out, self.kernel, self.stride, self.padding, self.dilation):
            needed = s * (o - 1) + d * (k - 1) + 1
            widths.append((p, max(needed - n - p, 0)))
        return jnp.pad(x, widths, constant_values=value)

    def offsets(self):
        return itertools.product(*(range(k) for k in self.kernel))

    def window_slice(self, padded: jax.Array, offset) -> jax.Array:
        """The elements at kernel position ``offset`` of every window: shape ``(..., *out)``."""
        lead = padded.ndim - self.spatial
        start = (0,) * lead + tuple(o * d for o, d in zip(offset, self.dilation))
        limit = tuple(padded.shape[:lead]) + tuple(
            st + s * (n - 1) + 1 for st, s, n in zip(start[lead:], self.stride, self.out)
        )
        return jax.lax.slice(padded, start, limit, (1,) * lead + self.stride)

    def flat_positions(self, offset) -> tuple[np.ndarray, np.ndarray]:
        """For kernel position ``offset``: each window's element as a flat index into the
        unpadded input plane, and whether it lies inside the input (static)."""
        index = np.zeros(self.out, dtype=np.int64)
        inside = np.ones(self.out, dtype=bool)
        for dim, (o, s, p, d, n) in enumerate(zip(offset, self.stride, self.padding, self.dilation, self.size)):
            pos = (np.arange(self.out[dim]) * s - p + o * d).reshape(self._along(dim))
            index = index * n + pos
            inside = inside & (pos >= 0) & (pos < n)
        return index, inside

    def first_inside(self) -> np.ndarray:
        """Each window's first element inside the input, as a flat index (static): PyTorch's
        index for a window whose elements are all the lowest value."""
        index = np.zeros(self.out, dtype=np.int64)
        for dim, (s, p, d, n) in enumerate(zip(self.stride, self.padding, self.dilation, self.size)):
            start = np.arange(self.out[dim]) * s - p
            skip = -(-np.maximum(-start, 0) // d)  # dilated steps needed to enter the input
            index = index * n + (start + skip * d).reshape(self._along(dim))
        return index

    def _along(self, dim: int) -> list[int]:
        shape = [1] * self.spatial
        shape[dim] = self.out[dim]
        return shape


def _lowest(dtype):
    return -jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min


def _compute_dtype(dtype):
    return jnp.float32 if jnp.issubdtype(dtype, jnp.floating) and jnp.dtype(dtype).itemsize < 4 else dtype


# -- max pooling ------------------------------------------------------------------------------


def _max_pool(x, spatial, kernel_size, stride, padding, dilation, ceil_mode):
    w = _Windows(x.shape, spatial, kernel_size, stride, padding, dilation, ceil_mode)
    padded = w.pad(x, _lowest(x.dtype))
    shape = x.shape[:-spatial] + w.out
    best = jnp.full(shape, _lowest(x.dtype), x.dtype)
    index = jnp.broadcast_to(jnp.asarray(w.first_inside()), shape)
    floating = jnp.issubdtype(x.dtype, jnp.floating)
    for offset in w.offsets():
        value = w.window_slice(padded, offset)
        position, inside = w.flat_positions(offset)
        # Strictly greater (first maximum wins) or NaN (NaN propagates), as on CPU.
        take = (value > best) | jnp.isnan(value) if floating else value > best
        if not inside.all():
            take = take & jnp.asarray(inside)
        best = jnp.where(take, value, best)
        index = jnp.where(take, jnp.asarray(position), index)
    return best, index


def _max_pool_backward(grad, x, spatial, indices):
    plane = math.prod(x.shape[-spatial:])
    lead = x.shape[:-spatial]
    rows = math.prod(lead)
    grad_rows = grad.reshape(rows, -1).astype(_compute_dtype(grad.dtype))
    index_rows = indices.reshape(rows, -1)
    out = jnp.zeros((rows, plane), grad_rows.dtype)
    out = out.at[jnp.arange(rows)[:, None], index_rows].add(grad_rows)
    return out.reshape(x.shape)


@lowering(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(x, 2, kernel_size, stride, padding, dilation, ceil_mode)


@lowering(aten.max_pool3d_with_indices.default)
def max_pool3d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(x, 3, kernel_size, stride, padding, dilation, ceil_mode)


@lowering(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _max_pool_backward(grad, x, 2, indices)


@lowering(aten.max_pool3d_with_indices_backward.default)
def max_pool3d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _max_pool_backward(grad, x, 3, indices)


# -- average pooling --------------------------------------------------------------------------


def _divisor(w: _Windows, count_include_pad: bool, divisor_override) -> np.ndarray:
    """Each window's divisor, as PyTorch's CPU kernel computes it (static)."""
    if divisor_override:
        return np.full(w.out, float(divisor_override))
    per_dim = []
    for o, k, s, p, n in zip(w.out, w.kernel, w.stride, w.padding, w.size):
        start = np.arange(o) * s - p
        end = np.minimum(start + k, n + p)
        with_pad = end - start
        inside = np.minimum(end, n) - np.maximum(start, 0)
        per_dim.append(with_pad if count_include_pad else inside)
    divisor = np.ones(w.out)
    for dim, counts in enumerate(per_dim):
        shape = [1] * w.spatial
        shape[dim] = w.out[dim]
        divisor = divisor * counts.reshape(shape)
    return divisor


def _window_sum(x, w: _Windows):
    padded = w.pad(x.astype(_compute_dtype(x.dtype)), 0)
    return sum(w.window_slice(padded, offset) for offset in w.offsets())


def _avg_pool(x, spatial, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    w = _Windows(x.shape, spatial, kernel_size, stride, padding, 1, ceil_mode)
    divisor = _divisor(w, count_include_pad, divisor_override)
    return _window_sum(x, w) / jnp.asarray(divisor, _compute_dtype(x.dtype))


def _avg_pool_backward(grad, x, spatial, kernel_size, stride, padding, ceil_mode, count_include_pad,
                       divisor_override):
    w = _Windows(x.shape, spatial, kernel_size, stride, padding, 1, ceil_mode)
    dtype = _compute_dtype(x.dtype)
    divisor = jnp.asarray(_divisor(w, count_include_pad, divisor_override), dtype)
    _, pullback = jax.vjp(lambda v: _window_sum(v, w), x.astype(dtype))
    return pullback(grad.astype(dtype) / divisor)[0]


@lowering(aten.avg_pool2d.default)
def avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool(x, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@lowering(aten.avg_pool3d.default)
def avg_pool3d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool(x, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@lowering(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return _avg_pool_backward(grad, x, 2, kernel_size, stride, padding, ceil_mode, count_include_pad,
                              divisor_override)


@lowering(aten.avg_pool3d_backward.default)
def avg_pool3d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return _avg_pool_backward(grad, x, 3, kernel_size, stride, padding, ceil_mode, count_include_pad,
                              divisor_override)


# -- adaptive average pooling -----------------------------------------------------------------


def _adaptive_matrix(size: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """0/1 matrix (out, size) of which inputs each adaptive window covers, and the window lengths."""
    start = (np.arange(out) * size) // out
    end = -((-(np.arange(out) + 1) * size) // out)  # ceil((i + 1) * size / out)
    columns = np.arange(size)
    cover = (columns[None, :] >= start[:, None]) & (columns[None, :] < end[:, None])
    return cover.astype(np.float32), (end - start).astype(np.float32)


@lowering(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool(x, output_size):
    """Average over PyTorch's adaptive windows, as one matrix product per pooled dimension
    (2-d or 3-d: ``output_size`` says how many)."""
    output_size = tuple(output_size)
    spatial = len(output_size)
    dtype = _compute_dtype(x.dtype)
    out = x.astype(dtype)
    count = np.ones(())
    for dim, o in enumerate(output_size):
        axis = x.ndim - spatial + dim
        cover, length = _adaptive_matrix(x.shape[axis], o)
        out = jnp.moveaxis(
            jnp.tensordot(jnp.moveaxis(out, axis, -1), jnp.asarray(cover, dtype).T, axes=1,
                          precision=jax.lax.Precision.HIGHEST),
            -1, axis,
        )
        count = np.multiply.outer(count, length)
    return out / jnp.asarray(count, dtype)


def _adaptive_avg_pool_backward(grad, x, spatial):
    dtype = _compute_dtype(x.dtype)
    output_size = grad.shape[-spatial:]
    _, pullback = jax.vjp(lambda v: adaptive_avg_pool(v, output_size), x.astype(dtype))
    return pullback(grad.astype(dtype))[0]


@lowering(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(grad, x):
    return _adaptive_avg_pool_backward(grad, x, 2)


@lowering(aten._adaptive_avg_pool3d_backward.default)
def adaptive_avg_pool3d_backward(grad, x):
    return _adaptive_avg_pool_backward(grad, x, 3)


# -- adaptive max pooling ---------------------------------------------------------------------


@lowering(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def adaptive_max_pool(x, output_size):
    """(max, flat index within the input plane) over PyTorch's adaptive windows
    ``[floor(i * size / out), ceil((i + 1) * size / out))``: windows of unequal length are
    read as the longest one, masked; first maximum wins and NaN propagates, as on CPU."""
    output_size = tuple(output_size)
    spatial = len(output_size)
    axes = range(x.ndim - spatial, x.ndim)
    starts, lengths = [], []
    for axis, o in zip(axes, output_size):
        size = x.shape[axis]
        start = (np.arange(o) * size) // o
        end = -((-(np.arange(o) + 1) * size) // o)
        starts.append(start)
        lengths.append(end - start)
    strides = [math.prod(x.shape[axis + 1:]) for axis in axes]  # within one input plane
    shape = x.shape[:-spatial] + tuple(output_size)
    best = jnp.full(shape, _lowest(x.dtype), x.dtype)
    first = np.zeros(tuple(output_size), np.int64)  # a window of -inf reports its first element
    for dim in range(spatial):
        view = [1] * spatial
        view[dim] = -1
        first = first + (starts[dim] * strides[dim]).reshape(view)
    index = jnp.broadcast_to(jnp.asarray(first), shape)
    floating = jnp.issubdtype(x.dtype, jnp.floating)
    longest = [int(length.max(initial=1)) for length in lengths]
    for offset in itertools.product(*(range(n) for n in longest)):
        value, position, inside = x, np.zeros(tuple(output_size), np.int64), np.ones(tuple(output_size), bool)
        for dim, (axis, j) in enumerate(zip(axes, offset)):
            along = np.minimum(starts[dim] + j, max(x.shape[axis] - 1, 0))
            value = jnp.take(value, jnp.asarray(along), axis=axis)
            view = [1] * spatial
            view[dim] = -1
            position = position + (along * strides[dim]).reshape(view)
            inside = inside & (j < lengths[dim]).reshape(view)
        take = (value > best) | jnp.isnan(value) if floating else value > best
        take = take & jnp.asarray(inside)
        best = jnp.where(take, value, best)
        index = jnp.where(take, jnp.asarray(position), index)
    return best, index


@lowering(aten.adaptive_max_pool2d_backward.default)
def adaptive_max_pool2d_backward(grad, x, indices):
    return _max_pool_backward(grad, x, 2, indices)


@lowering(aten.adaptive_max_pool3d_backward.default)
def adaptive_max_pool3d_backward(grad, x, indices):
    return _max_pool_backward(grad, x, 3, indices)


# -- max unpooling ----------------------------------------------------------------------------


def _max_unpool(x, indices, output_size):
    """Each value of ``x`` placed at its flat position (``indices``) in a zero output of
    ``output_size`` per channel; a position outside it fails with CPU's error and places
    nothing (a device-side check)."""
    lead = x.shape[:-len(output_size)]
    volume = math.prod(output_size)
    flat_x = x.reshape(lead + (-1,))
    flat_index = indices.reshape(lead + (-1,))
    ok = checks.require_in_range(
        flat_index, volume, RuntimeError,
        "Found an invalid max index: {} (output volumes are of size " + "x".join(map(str, output_size)) + ")")
    flat_index = checks.drop_unless(ok, flat_index, volume)
    coords = tuple(jax.lax.broadcasted_iota(jnp.int64, flat_index.shape, d) for d in range(len(lead)))
    out = jnp.zeros(lead + (volume,), x.dtype).at[coords + (flat_index,)].set(flat_x, mode="drop")
    return out.reshape(lead + tuple(output_size))


@lowering(aten.max_unpool2d.default)
def max_unpool2d(x, indices, output_size):
    return _max_unpool(x, indices, tuple(output_size))


@lowering(aten.max_unpool3d.default)
def max_unpool3d(x, indices, output_size, stride, padding):
    return _max_unpool(x, indices, tuple(output_size))
