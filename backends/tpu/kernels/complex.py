"""Complex-number lowerings: ``conj_physical``, ``angle``, ``complex`` and ``polar``.

(``conj`` itself is a view that only sets the conjugate bit; ``conj_physical`` is the op that
writes conjugated values, which ``torch.fft.ihfft*`` and ``resolve_conj`` reach.)
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from accelkit_backends.tpu.lowering import lowering

aten = torch.ops.aten


@lowering(aten._conj_physical.default)
def conj_physical(x):
    """The conjugate of complex ``x``; real ``x`` unchanged."""
    return jnp.conj(x) if jnp.iscomplexobj(x) else x


@lowering(aten.angle.default)
def angle(x):
    """The argument of complex ``x``; for real ``x`` PyTorch's rule: pi below 0, else 0, NaN kept."""
    if jnp.iscomplexobj(x):
        return jnp.angle(x)
    x = x.astype(jnp.float32) if not jnp.issubdtype(x.dtype, jnp.floating) else x
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.asarray(math.pi, x.dtype), jnp.zeros_like(x)))


@lowering(aten.complex.default)
def complex_(real, imag):
    """``real + 1j * imag`` built from its (broadcast) parts; keeps signed zeros, unlike arithmetic."""
    real, imag = jnp.broadcast_arrays(real, imag)
    return jax.lax.complex(real, imag)


@lowering(aten.polar.default)
def polar(magnitude, phase):
    """``magnitude * exp(1j * phase)``."""
    magnitude, phase = jnp.broadcast_arrays(magnitude, phase)
    return jax.lax.complex(magnitude * jnp.cos(phase), magnitude * jnp.sin(phase))
