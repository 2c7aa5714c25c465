"""Matmul-family lowerings."""

from __future__ import annotations

import jax.numpy as jnp
import torch

from accelkit_backends.tpu.lowering import lowering

aten = torch.ops.aten


@lowering(aten.mm.default)
def mm(a, b):
    return jnp.matmul(a, b)


@lowering(aten.addmm.default)
def addmm(bias, a, b, beta=1, alpha=1):
    return beta * bias + alpha * jnp.matmul(a, b)
