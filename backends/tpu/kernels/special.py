"""Special-function lowerings (gamma family, Bessel functions, error-function relatives, zeta).

Every function here computes in float32 (bool, integer, bfloat16 and float16 inputs are widened,
PyTorch's "opmath"; float64 stays float64) and the machinery rounds the result to PyTorch's dtype.
Only functions whose JAX implementation matches PyTorch's CPU kernel (atol = rtol = 1e-3 over
the OpInfo samples, including poles and infinities) are registered; the rest fall back.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import torch

from accelkit_backends.tpu.lowering import lowering

aten = torch.ops.aten


def _float(x: Any) -> Any:
    """``x`` in its compute dtype: float32 unless it is float64; Python scalars unchanged."""
    if not isinstance(x, jax.Array):
        return x
    return x if x.dtype in (jnp.float32, jnp.float64) else x.astype(jnp.float32)


def _floats(*values: Any) -> list[Any]:
    """Two operands in one compute dtype (float64 only if a tensor operand is float64)."""
    wide = any(isinstance(v, jax.Array) and v.dtype == jnp.float64 and v.ndim for v in values)
    dtype = jnp.float64 if wide else jnp.float32
    return [v.astype(dtype) if isinstance(v, jax.Array) else jnp.asarray(v, dtype) for v in values]


def _unary(op: Any, fn: Any) -> None:
    """Register ``fn`` applied to the float-widened input as the lowering of ``op``."""

    def lowered(x):
        return fn(_float(x))

    lowered.__name__ = lowered.__qualname__ = str(op).split(".")[1]
    lowering(op)(lowered)


def _digamma(x):
    """PyTorch's digamma: -inf at +0, +inf at -0 (JAX gives NaN at both), NaN at negative integers."""
    return jnp.where(x == 0, jnp.copysign(jnp.inf, -x).astype(x.dtype), jax.lax.digamma(x))


def _spherical_j0(x):
    """sin(x) / x, 1 at 0 (Taylor series near 0, where the quotient loses precision)."""
    small = jnp.abs(x) < 0.5
    safe = jnp.where(small, jnp.ones_like(x), x)
    x2 = x * x
    series = 1 - x2 / 6 * (1 - x2 / 20 * (1 - x2 / 42))
    return jnp.where(small, series, jnp.sin(safe) / safe)


for _op, _fn in [
    (aten.lgamma.default, jax.lax.lgamma),
    (aten.digamma.default, _digamma),
    (aten.i0.default, jsp.i0),
    (aten.special_i0e.default, jsp.i0e),
    (aten.special_i1.default, jsp.i1),
    (aten.special_i1e.default, jsp.i1e),
    (aten.special_modified_bessel_i0.default, jsp.i0),
    (aten.special_modified_bessel_i1.default, jsp.i1),
    (aten.special_ndtri.default, jsp.ndtri),
    (aten.special_erfcx.default, jsp.erfcx),
    (aten.special_spherical_bessel_j0.default, _spherical_j0),
]:
    _unary(_op, _fn)
del _op, _fn


def _at_poles(q, values):
    """``values``, with +inf where ``q`` is zero or a negative integer: Hurwitz zeta's poles,
    where PyTorch's zeta (and so polygamma) is +inf and ``jsp.zeta`` may be NaN."""
    return jnp.where((q <= 0) & (q == jnp.floor(q)), jnp.inf, values)


def _zeta_any_q(s, q):
    """Hurwitz zeta for integer ``s > 1`` and any ``q``, negative included (``jsp.zeta`` is
    NaN there): ``zeta(s, q) = sum_{k<m} (q + k) ** -s + zeta(s, q + m)`` with ``q + m > 0``."""
    shift = jnp.maximum(jnp.ceil(-q), 0)

    def term(k, total):
        kf = k.astype(q.dtype)
        return total + jnp.where(kf < shift, (q + kf) ** -s, 0)

    steps = jnp.max(shift, initial=0).astype(jnp.int32)
    head = jax.lax.fori_loop(0, steps, term, jnp.zeros_like(q))
    return _at_poles(q, head + jsp.zeta(s, q + shift))


@lowering(aten.polygamma.default)
def polygamma(n, x):
    """The ``n``-th derivative of digamma (``n`` static): ``(-1)**(n+1) n! zeta(n+1, x)`` for
    ``n >= 1``, as PyTorch computes it (finite at negative non-integers); digamma for ``n == 0``."""
    x = _float(x)
    if n == 0:
        return _digamma(x)
    sign_factorial = (-1.0) ** (n + 1) * math.factorial(n)
    return sign_factorial * _zeta_any_q(jnp.asarray(n + 1, x.dtype), x)


@lowering(aten.special_zeta.default)
def zeta(x, q):
    """Hurwitz zeta ``sum_k (k + q) ** -x``."""
    x, q = jnp.broadcast_arrays(*_floats(x, q))
    return jnp.where(x > 1, _at_poles(q, jsp.zeta(x, q)), jsp.zeta(x, q))  # x <= 1 first, as PyTorch


@lowering(aten.igamma.default)
def igamma(a, x):
    """The regularized lower incomplete gamma function."""
    return jax.lax.igamma(*jnp.broadcast_arrays(*_floats(a, x)))


@lowering(aten.igammac.default)
def igammac(a, x):
    """The regularized upper incomplete gamma function."""
    return jax.lax.igammac(*jnp.broadcast_arrays(*_floats(a, x)))
