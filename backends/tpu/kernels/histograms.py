"""Histogram lowerings: ``histc``."""

from __future__ import annotations

import jax.numpy as jnp
import torch

from accelkit_backends.tpu.lowering import lowering

aten = torch.ops.aten


@lowering(aten.histc.default)
def histc(x, bins=100, min=0, max=0):
    """Counts of ``x`` in ``bins`` equal bins over ``[min, max]``; elements outside are ignored,
    ``max`` falls in the last bin. ``min == max`` means the data's range (widened by 1 each way
    if that is a single value too), as PyTorch does."""
    x = x.reshape(-1)
    compute = x.dtype if x.dtype in (jnp.float32, jnp.float64) else jnp.float32
    x = x.astype(compute)
    lo, hi = jnp.asarray(min, compute), jnp.asarray(max, compute)
    use_data = lo == hi
    if x.size:
        lo, hi = jnp.where(use_data, x.min(), lo), jnp.where(use_data, x.max(), hi)
    widen = lo == hi
    lo, hi = jnp.where(widen, lo - 1, lo), jnp.where(widen, hi + 1, hi)
    position = ((x - lo) * bins / (hi - lo)).astype(jnp.int32)
    position = jnp.where(position == bins, bins - 1, position)
    inside = (x >= lo) & (x <= hi)
    return jnp.zeros(bins, compute).at[jnp.where(inside, position, 0)].add(inside.astype(compute))
