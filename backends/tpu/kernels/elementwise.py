"""Elementwise and comparison lowerings (results are cast to PyTorch's dtypes by the machinery)."""

from __future__ import annotations

import jax.numpy as jnp
import torch

from accelkit_backends.tpu.lowering import lowering

aten = torch.ops.aten


@lowering(aten.add.Tensor, aten.add.Scalar)
def add(x, y, alpha=1):
    return x + y * alpha if alpha != 1 else x + y


@lowering(aten.sub.Tensor, aten.sub.Scalar)
def sub(x, y, alpha=1):
    return x - y * alpha if alpha != 1 else x - y


@lowering(aten.mul.Tensor, aten.mul.Scalar)
def mul(x, y):
    return x * y


@lowering(aten.neg.default)
def neg(x):
    return -x


@lowering(aten.exp.default)
def exp(x):
    return jnp.exp(x)


@lowering(aten.relu.default)
def relu(x):
    return jnp.maximum(x, jnp.zeros((), x.dtype))


@lowering(aten.fill.Scalar)
def fill(x, value):
    return jnp.full(x.shape, value, x.dtype)


@lowering(aten.zero.default)
def zero(x):
    return jnp.zeros_like(x)
