"""Reduction lowerings."""

from __future__ import annotations

import jax.numpy as jnp
import torch

from accelkit_backends.tpu.buffers import jax_dtype
from accelkit_backends.tpu.lowering import lowering

aten = torch.ops.aten


@lowering(aten.sum.default)
def sum_all(x, dtype=None):
    return jnp.sum(x, dtype=jax_dtype(dtype) if dtype is not None else None)


@lowering(aten.sum.dim_IntList)
def sum_dims(x, dim=None, keepdim=False, dtype=None):
    axis = tuple(dim) if dim else None
    return jnp.sum(x, axis=axis, keepdims=keepdim, dtype=jax_dtype(dtype) if dtype is not None else None)
