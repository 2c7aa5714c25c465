"""Grid sampling lowerings: ``grid_sampler_2d`` and ``grid_sampler_3d`` (``F.grid_sample``).

Contract, as PyTorch's CPU kernels: ``grid[..., 0]`` is the x (width) coordinate, ``[..., 1]`` y
and ``[..., 2]`` z (depth), each in ``[-1, 1]`` across the input (corner pixels' centres with
``align_corners``, their outer edges without). ``interpolation_mode`` 0 is (tri)linear, 1
nearest (ties to even, as ``nearbyint``), 2 bicubic (2-d only; PyTorch's A = -0.75 kernel);
``padding_mode`` 0 reads zeros outside the input, 1 clamps coordinates to the border, 2 reflects
them about the edges. For bicubic, padding is applied to each of the 16 taps, as on CPU.

Every tap is a gather from the flattened input plane with a validity mask; low-precision
inputs are interpolated in float32.
"""

from __future__ import annotations

import itertools

import jax.numpy as jnp
import torch

from accelkit_backends.tpu.lowering import lowering

aten = torch.ops.aten

_LINEAR, _NEAREST, _BICUBIC = 0, 1, 2
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2
_CUBIC_A = -0.75


def _unnormalize(coord, size: int, align_corners: bool):
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _reflect(coord, twice_low: int, twice_high: int):
    """``coord`` reflected into ``[twice_low / 2, twice_high / 2]`` (PyTorch's reflect_coordinates)."""
    if twice_low == twice_high:
        return jnp.zeros_like(coord)
    low = twice_low / 2
    span = (twice_high - twice_low) / 2
    coord = jnp.abs(coord - low)
    extra = jnp.fmod(coord, span)
    flips = jnp.floor(coord / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + low, span - extra + low)


def _pad(coord, size: int, padding_mode: int, align_corners: bool):
    """The source coordinate after the padding rule (zeros: unchanged; masked when read)."""
    if padding_mode == _BORDER:
        return jnp.clip(coord, 0, size - 1)
    if padding_mode == _REFLECTION:
        if align_corners:
            coord = _reflect(coord, 0, 2 * (size - 1))
        else:
            coord = _reflect(coord, -1, 2 * size - 1)
        return jnp.clip(coord, 0, size - 1)
    return coord


def _read(plane, indices, sizes):
    """``plane`` (N, C, prod(sizes)) at integer ``indices`` (one (N, *out) array per spatial
    dim, outermost first); 0 where any index is outside its dim."""
    n, c = plane.shape[:2]
    out_shape = indices[0].shape
    flat = jnp.zeros(out_shape, jnp.int64)
    valid = jnp.ones(out_shape, bool)
    for index, size in zip(indices, sizes):
        valid = valid & (index >= 0) & (index < size)
        flat = flat * size + jnp.clip(index, 0, size - 1)
    values = jnp.take_along_axis(plane, flat.reshape(n, 1, -1), axis=2).reshape((n, c) + out_shape[1:])
    return jnp.where(valid[:, None], values, 0)


def _cubic_weights(t):
    """PyTorch's cubic convolution weights for the taps at offsets -1, 0, 1, 2 of fraction ``t``."""
    a = _CUBIC_A

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _grid_sample(x, grid, interpolation_mode, padding_mode, align_corners):
    spatial = x.ndim - 2
    compute = jnp.float32 if x.dtype in (jnp.bfloat16, jnp.float16) else x.dtype
    x, grid = x.astype(compute), grid.astype(compute)
    sizes = x.shape[2:]  # outermost first: (H, W) or (D, H, W)
    plane = x.reshape(x.shape[:2] + (-1,))
    # grid's last axis lists x (innermost dim) first: reverse it to outermost first.
    coords = [_unnormalize(grid[..., spatial - 1 - d], sizes[d], align_corners) for d in range(spatial)]
    if interpolation_mode == _BICUBIC:
        starts = [jnp.floor(c) for c in coords]
        weights = [_cubic_weights(c - s) for c, s in zip(coords, starts)]
        total = 0
        for taps in itertools.product(range(4), repeat=spatial):
            indices = [_pad(s - 1 + k, size, padding_mode, align_corners).astype(jnp.int64)
                       for s, k, size in zip(starts, taps, sizes)]
            weight = 1
            for w, k in zip(weights, taps):
                weight = weight * w[k]
            total = total + _read(plane, indices, sizes) * weight[:, None]
        return total
    coords = [_pad(c, size, padding_mode, align_corners) for c, size in zip(coords, sizes)]
    if interpolation_mode == _NEAREST:
        return _read(plane, [jnp.round(c).astype(jnp.int64) for c in coords], sizes)
    lows = [jnp.floor(c) for c in coords]
    total = 0
    for corner in itertools.product((0, 1), repeat=spatial):
        weight = 1
        for c, low, high in zip(coords, lows, corner):
            weight = weight * (c - low if high else low + 1 - c)
        indices = [(low + high).astype(jnp.int64) for low, high in zip(lows, corner)]
        total = total + _read(plane, indices, sizes) * weight[:, None]
    return total


@lowering(aten.grid_sampler_2d.default)
def grid_sampler_2d(x, grid, interpolation_mode, padding_mode, align_corners):
    """Samples of ``x`` (N, C, H, W) at ``grid`` (N, Ho, Wo, 2): (N, C, Ho, Wo)."""
    return _grid_sample(x, grid, interpolation_mode, padding_mode, align_corners)


@lowering(aten.grid_sampler_3d.default)
def grid_sampler_3d(x, grid, interpolation_mode, padding_mode, align_corners):
    """Samples of ``x`` (N, C, D, H, W) at ``grid`` (N, Do, Ho, Wo, 3): (N, C, Do, Ho, Wo)."""
    if interpolation_mode == _BICUBIC:
        raise RuntimeError("grid_sampler_3d: bicubic interpolation is only supported for 4-D input")
    return _grid_sample(x, grid, interpolation_mode, padding_mode, align_corners)
