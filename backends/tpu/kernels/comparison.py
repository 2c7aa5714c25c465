"""Whole-tensor comparison: ``equal`` (one Python bool for two tensors)."""

from __future__ import annotations

import jax.numpy as jnp
import torch

from accelkit_backends.tpu.lowering import Lowering, kernels

aten = torch.ops.aten


def equal(x, y):
    """True when ``x`` and ``y`` have the same shape and equal elements (NaN is unequal)."""
    if x.shape != y.shape:
        return jnp.asarray(False)
    return jnp.array_equal(x, y)


class _BoolLowering(Lowering):
    """A lowering whose schema returns a Python ``bool``: the program's 0-d result is read back."""

    def __call__(self, *args, **kwargs):
        return bool(super().__call__(*args, **kwargs))


kernels.add(aten.equal.default, _BoolLowering(aten.equal.default, equal), derive_variants=False)
