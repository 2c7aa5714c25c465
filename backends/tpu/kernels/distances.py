"""Pairwise-distance lowerings: ``cdist`` (``_cdist_forward``) and ``pdist`` (``_pdist_forward``).

The p-norm of each difference of rows: ``p = 0`` counts the differing coordinates, ``p = inf``
takes the largest absolute difference, other ``p`` give ``sum(|d| ** p) ** (1/p)`` (``p`` is a
compile-time constant). Like PyTorch's CPU kernel, ``cdist`` with ``p = 2`` switches to the
matrix-product form ``sqrt(max(|a|^2 + |b|^2 - 2 a.b, 0))`` when ``compute_mode`` asks for it
(1) or leaves it to size (0 or None: more than 25 rows on either side); its rounding differs
from the direct form (a point's distance to itself is then ~sqrt(eps) |a| rather than 0), so
following the same rule keeps results comparable with CPU.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from accelkit_backends.tpu.lowering import lowering

aten = torch.ops.aten


def _norm_of_differences(d: jax.Array, p: float) -> jax.Array:
    """The p-norm over the last axis of ``d``."""
    if p == 0:
        return jnp.sum(d != 0, axis=-1).astype(d.dtype)
    a = jnp.abs(d)
    if math.isinf(p):
        return jnp.max(a, axis=-1, initial=0)
    if p == 1:
        return jnp.sum(a, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=-1))
    return jnp.sum(a**p, axis=-1) ** (1 / p)


def _compute(x):
    return x.astype(jnp.float32) if x.dtype in (jnp.bfloat16, jnp.float16) else x


@lowering(aten._cdist_forward.default, static=("p",))
def cdist(x1, x2, p, compute_mode=None):
    """Distances between the rows of ``x1`` (..., P, M) and ``x2`` (..., R, M): (..., P, R),
    batch dimensions broadcast."""
    x1, x2 = _compute(x1), _compute(x2)
    batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    x1 = jnp.broadcast_to(x1, batch + x1.shape[-2:])
    x2 = jnp.broadcast_to(x2, batch + x2.shape[-2:])
    rows1, rows2 = x1.shape[-2], x2.shape[-2]
    mode = compute_mode or 0
    if p == 2 and (mode == 1 or (mode == 0 and (rows1 > 25 or rows2 > 25))):
        square1 = jnp.sum(x1 * x1, axis=-1)[..., :, None]
        square2 = jnp.sum(x2 * x2, axis=-1)[..., None, :]
        cross = jnp.einsum("...pm,...rm->...pr", x1, x2, precision=jax.lax.Precision.HIGHEST)
        return jnp.sqrt(jnp.maximum(square1 + square2 - 2 * cross, 0))
    return _norm_of_differences(x1[..., :, None, :] - x2[..., None, :, :], p)


@lowering(aten._pdist_forward.default, static=("p",))
def pdist(x, p=2.0):
    """Distances between the rows ``i < j`` of ``x`` (N, M), in row-major order of the upper
    triangle: N (N - 1) / 2 values."""
    x = _compute(x)
    rows = x.shape[0]
    i, j = jnp.triu_indices(rows, k=1) if rows > 1 else (jnp.zeros(0, int), jnp.zeros(0, int))
    return _norm_of_differences(x[i] - x[j], p)
