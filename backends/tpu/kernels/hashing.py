"""``torch.hash_tensor``: a reduction of each element's bit pattern to one uint64 per output
element (``mode=0``, the only mode PyTorch defines: XOR of the elements' bits).

As on CPU, an element's bits are those of its value as a float64 (floating dtypes) or as an
int64 (integers and bool). The float32-to-float64 re-encoding is done on the bits (sign,
re-biased exponent, widened fraction; subnormals normalised; NaN quieted as a conversion does),
so no float64 arithmetic is needed, which a TPU only emulates.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from accelkit_backends.tpu.lowering import lowering

aten = torch.ops.aten


def _float64_bits_of_float32(x: jax.Array) -> jax.Array:
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32).astype(jnp.uint64)
    sign = bits >> 31
    exponent = (bits >> 23) & 0xFF
    fraction = bits & 0x7FFFFF
    special = exponent == 0xFF
    subnormal = (exponent == 0) & (fraction != 0)
    # A subnormal's leading one is at bit p < 23: value 1.f * 2**(p - 149).
    leading = 31 - jax.lax.clz(fraction.astype(jnp.uint32)).astype(jnp.int64)
    shift = jnp.where(subnormal, 23 - leading, 0).astype(jnp.uint64)
    fraction = jnp.where(subnormal, (fraction << shift) & 0x7FFFFF, fraction)
    exponent = jnp.where(subnormal, (leading - 149 + 1023).astype(jnp.uint64), exponent + (1023 - 127))
    exponent = jnp.where(special, np.uint64(0x7FF), jnp.where((bits & 0x7FFFFFFF) == 0, np.uint64(0), exponent))
    wide = fraction << 29
    wide = jnp.where(special & (fraction != 0), wide | np.uint64(1 << 51), wide)  # NaN stays NaN, quiet
    return (sign << 63) | (exponent << 52) | wide


def _bits(x: jax.Array) -> jax.Array:
    if x.dtype == jnp.float64:
        return jax.lax.bitcast_convert_type(x, jnp.uint64)
    if jnp.issubdtype(x.dtype, jnp.floating):
        return _float64_bits_of_float32(x)
    return jax.lax.bitcast_convert_type(x.astype(jnp.int64), jnp.uint64)


@lowering(aten.hash_tensor.default)
def hash_tensor(x, dim=(), *, keepdim=False, mode=0):
    """XOR of the elements' bits over ``dim`` (every dimension when empty)."""
    if mode != 0:
        raise RuntimeError(f"hash_tensor: mode {mode} is not supported")
    axes = tuple(sorted(d % max(x.ndim, 1) for d in dim)) if dim else tuple(range(x.ndim))
    axes = tuple(a for a in axes if a < x.ndim)
    out = jax.lax.reduce(_bits(x), np.uint64(0), jax.lax.bitwise_xor, axes)
    if keepdim and x.ndim:
        out = jnp.expand_dims(out, axes)
    return out
