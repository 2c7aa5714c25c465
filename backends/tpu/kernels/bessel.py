"""Bessel-function lowerings JAX has no implementation of: ``J0``, ``J1``, ``Y0``, ``Y1``, ``K0``,
``K1`` (plain and exponentially scaled) and the Airy function ``Ai``.

Contract: float32 results (float64 for float64 input; other dtypes are widened to float32) that
agree with PyTorch's CPU kernels to about 1e-5 relative (absolute near the zeros of the
oscillating functions), with PyTorch's values at the edges of each domain: ``Y0``, ``Y1``,
``K0``, ``K1`` are ``-inf``/``+inf`` at zero (either sign) and NaN for negative arguments; ``J0``
is even and ``J1`` odd; infinities give what CPU gives (NaN for the oscillating functions at
``+-inf`` and for ``Ai`` at both, 0 for ``K`` at ``+inf``).

How, without tables of fitted coefficients (every coefficient below follows from a formula):

- ``J``/``Y`` for ``|x| <= 8``: their power series (Abramowitz & Stegun 9.1.10-11) in ``x**2``,
  evaluated by Horner's rule; the largest term there is a few hundred, so float32 keeps ~1e-5
  absolute accuracy;
- ``J``/``Y`` for ``|x| > 8``: Hankel's asymptotic expansion (A&S 9.2.5-10), whose error at
  ``x = 8`` after 12 terms is below float32's resolution;
- ``K_nu``: ``exp(x) K_nu(x) = int_0^inf exp(-2 x sinh(t/2)**2) cosh(nu t) dt`` by the
  trapezoidal rule (A&S 9.6.24), which converges geometrically for this analytic, rapidly
  decaying integrand; the step shrinks like ``1/sqrt(x)`` for large ``x``, where the integrand
  narrows. It costs a fixed 450 terms per element;
- ``Ai``: its Maclaurin series for ``-4 <= x <= 1.5`` (largest term ~20 at ``x = -4``);
  ``Ai(x) = sqrt(x/3) K_{1/3}(zeta) / pi`` with ``zeta = 2/3 x**1.5`` for ``x > 1.5``; and its
  asymptotic expansion (A&S 10.4.60) for ``x < -4``.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import torch

from accelkit_backends.tpu.lowering import lowering

aten = torch.ops.aten

_EULER_GAMMA = 0.5772156649015329
_SERIES_TERMS = 28  # (x**2/4)**k / (k!)**2 < 1e-15 at x = 8 beyond this
_ASYMPTOTIC_TERMS = 12
_SWITCH = 8.0


def _float(x: jax.Array) -> jax.Array:
    return x if x.dtype in (jnp.float32, jnp.float64) else x.astype(jnp.float32)


def _horner(coefficients: list[float], z: jax.Array) -> jax.Array:
    """``sum_k coefficients[k] * z**k``."""
    total = jnp.full_like(z, coefficients[-1])
    for c in reversed(coefficients[:-1]):
        total = total * z + c
    return total


def _harmonic(k: int) -> float:
    return math.fsum(1.0 / j for j in range(1, k + 1))


# Series coefficients in z = x**2 / 4 (A&S 9.1.10 and 9.1.11 with n = 0, 1).
_J0 = [(-1) ** k / math.factorial(k) ** 2 for k in range(_SERIES_TERMS)]
_J1 = [(-1) ** k / (math.factorial(k) * math.factorial(k + 1)) for k in range(_SERIES_TERMS)]
_Y0_TAIL = [(-1) ** (k + 1) * _harmonic(k) / math.factorial(k) ** 2 for k in range(_SERIES_TERMS)]
_Y1_TAIL = [(-1) ** k * (_harmonic(k) + _harmonic(k + 1) - 2 * _EULER_GAMMA)
            / (math.factorial(k) * math.factorial(k + 1)) for k in range(_SERIES_TERMS)]


def _hankel_coefficients(nu: float, count: int) -> list[float]:
    """``a_k(nu) = prod_{j=1..k} (4 nu**2 - (2j - 1)**2) / (k! 8**k)`` (A&S 9.2.9)."""
    out, term = [1.0], 1.0
    for k in range(1, count):
        term *= (4 * nu * nu - (2 * k - 1) ** 2) / (k * 8)
        out.append(term)
    return out


def _hankel(nu: float, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(J_nu(x), Y_nu(x))`` for large positive ``x`` by Hankel's expansion."""
    a = _hankel_coefficients(nu, 2 * _ASYMPTOTIC_TERMS)
    w = 1 / (x * x)
    p = _horner([(-1) ** k * a[2 * k] for k in range(_ASYMPTOTIC_TERMS)], w)
    q = _horner([(-1) ** k * a[2 * k + 1] for k in range(_ASYMPTOTIC_TERMS)], w) / x
    chi = x - (nu / 2 + 0.25) * math.pi
    scale = jnp.sqrt(2 / (math.pi * x))
    return scale * (p * jnp.cos(chi) - q * jnp.sin(chi)), scale * (p * jnp.sin(chi) + q * jnp.cos(chi))


def _split(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(``|x|``, ``|x|`` clamped into the series range, ``|x|`` clamped into the asymptotic
    range): each branch only ever sees arguments it is valid for (no NaN in the discarded one)."""
    ax = jnp.abs(x)
    return ax, jnp.minimum(ax, _SWITCH), jnp.maximum(ax, _SWITCH)


def _j0(x):
    ax, small, large = _split(x)
    series = _horner(_J0, small * small / 4)
    return jnp.where(ax <= _SWITCH, series, _hankel(0, large)[0])


def _j1(x):
    ax, small, large = _split(x)
    series = small / 2 * _horner(_J1, small * small / 4)
    value = jnp.where(ax <= _SWITCH, series, _hankel(1, large)[0])
    return jnp.where(x < 0, -value, value)


def _undefined_below_zero(x, value, at_zero):
    """``value`` for ``x > 0``; ``at_zero`` at +-0; NaN for negative ``x`` (and NaN)."""
    value = jnp.where(x > 0, value, jnp.nan)
    return jnp.where(x == 0, at_zero, value).astype(x.dtype)


def _y0(x):
    ax, small, large = _split(x)
    small = jnp.where(small > 0, small, 1)
    z = small * small / 4
    series = 2 / math.pi * ((jnp.log(small / 2) + _EULER_GAMMA) * _horner(_J0, z) + _horner(_Y0_TAIL, z))
    value = jnp.where(ax <= _SWITCH, series, _hankel(0, large)[1])
    return _undefined_below_zero(x, value, -jnp.inf)


def _y1(x):
    ax, small, large = _split(x)
    small = jnp.where(small > 0, small, 1)
    z = small * small / 4
    j1 = small / 2 * _horner(_J1, z)
    series = (-2 / (math.pi * small) + 2 / math.pi * jnp.log(small / 2) * j1
              - small / (2 * math.pi) * _horner(_Y1_TAIL, z))
    value = jnp.where(ax <= _SWITCH, series, _hankel(1, large)[1])
    return _undefined_below_zero(x, value, -jnp.inf)


# -- K by quadrature -----------------------------------------------------------------------------

_QUADRATURE_TERMS = 450
_STEP = 0.2  # with 450 terms, reaches t = 90, past where exp(-2 x sinh(t/2)**2) underflows


def _scaled_k(nu: float, x: jax.Array) -> jax.Array:
    """``exp(x) K_nu(x)`` for ``x > 0`` (other elements give garbage; callers mask them)."""
    x = jnp.where(x > 0, x, 1)
    step = jnp.minimum(_STEP, 0.9 / jnp.sqrt(x))  # the integrand's width is ~1/sqrt(x)

    def body(k, total):
        t = k.astype(x.dtype) * step
        decay = -2 * x * jnp.square(jnp.sinh(t / 2))
        # cosh(nu t) exp(decay) as one exponential per sign: no inf * 0 where cosh overflows
        term = (jnp.exp(decay + nu * t) + jnp.exp(decay - nu * t)) / 2
        return total + term

    total = jax.lax.fori_loop(1, _QUADRATURE_TERMS, body, jnp.full_like(x, 0.5))  # t = 0 weighs 1/2
    return total * step


def _k(nu: float, scaled: bool):
    def k(x):
        value = _scaled_k(nu, x)
        if not scaled:
            value = jnp.exp(-x) * value
        value = jnp.where(jnp.isposinf(x), 0, value)
        return _undefined_below_zero(x, value, jnp.inf)

    return k


# -- Airy Ai -----------------------------------------------------------------------------------

_AI0 = 1 / (3 ** (2 / 3) * math.gamma(2 / 3))  # Ai(0)
_AIP0 = -1 / (3 ** (1 / 3) * math.gamma(1 / 3))  # Ai'(0)
_AIRY_SERIES_TERMS = 30


def _airy_series(x):
    """``Ai(x) = Ai(0) f(x) + Ai'(0) g(x)`` (A&S 10.4.2-3), for moderate ``|x|``."""
    f, g = [1.0], [1.0]
    for k in range(1, _AIRY_SERIES_TERMS):
        f.append(f[-1] / ((3 * k - 1) * (3 * k)))
        g.append(g[-1] / ((3 * k) * (3 * k + 1)))
    cube = x * x * x
    return _AI0 * _horner(f, cube) + _AIP0 * x * _horner(g, cube)


def _airy_u(count: int) -> list[float]:
    """``u_k = (6k-5)(6k-3)(6k-1) / ((2k-1) 216 k) u_{k-1}``, ``u_0 = 1`` (A&S 10.4.58)."""
    u = [1.0]
    for k in range(1, count):
        u.append(u[-1] * (6 * k - 5) * (6 * k - 3) * (6 * k - 1) / ((2 * k - 1) * 216 * k))
    return u


def _airy_negative(x):
    """``Ai(-x)`` for large positive ``x`` (A&S 10.4.60)."""
    u = _airy_u(2 * _AIRY_ASYMPTOTIC_TERMS)
    zeta = 2 / 3 * x * jnp.sqrt(x)
    w = 1 / (zeta * zeta)
    p = _horner([(-1) ** k * u[2 * k] for k in range(_AIRY_ASYMPTOTIC_TERMS)], w)
    q = _horner([(-1) ** k * u[2 * k + 1] for k in range(_AIRY_ASYMPTOTIC_TERMS)], w) / zeta
    phase = zeta + math.pi / 4
    return (p * jnp.sin(phase) - q * jnp.cos(phase)) / (math.sqrt(math.pi) * jnp.sqrt(jnp.sqrt(x)))


_AIRY_POSITIVE, _AIRY_NEGATIVE = 1.5, -4.0
# The expansion diverges: at zeta(4) = 5.33 its smallest term, u_11 / zeta**11 ~ 3e-6, is where
# to stop; larger |x| converge faster.
_AIRY_ASYMPTOTIC_TERMS = 6


def _airy_ai(x):
    middle = jnp.clip(x, _AIRY_NEGATIVE, _AIRY_POSITIVE)
    positive = jnp.maximum(x, _AIRY_POSITIVE)
    zeta = 2 / 3 * positive * jnp.sqrt(positive)
    decaying = jnp.sqrt(positive / 3) / math.pi * jnp.exp(-zeta) * _scaled_k(1 / 3, zeta)
    decaying = jnp.where(jnp.isinf(zeta), 0, decaying)  # Ai underflowed long before
    oscillating = _airy_negative(jnp.maximum(-x, -_AIRY_NEGATIVE))
    value = jnp.where(x > _AIRY_POSITIVE, decaying,
                      jnp.where(x < _AIRY_NEGATIVE, oscillating, _airy_series(middle)))
    return jnp.where(jnp.isinf(x) | jnp.isnan(x), jnp.nan, value).astype(x.dtype)  # as CPU, NaN at +inf


def _register(op: Any, fn: Any) -> None:
    def lowered(x):
        return fn(_float(x))

    lowered.__name__ = lowered.__qualname__ = str(op).split(".")[1]
    lowering(op)(lowered)


for _op, _fn in [
    (aten.special_bessel_j0.default, _j0),
    (aten.special_bessel_j1.default, _j1),
    (aten.special_bessel_y0.default, _y0),
    (aten.special_bessel_y1.default, _y1),
    (aten.special_modified_bessel_k0.default, _k(0.0, scaled=False)),
    (aten.special_modified_bessel_k1.default, _k(1.0, scaled=False)),
    (aten.special_scaled_modified_bessel_k0.default, _k(0.0, scaled=True)),
    (aten.special_scaled_modified_bessel_k1.default, _k(1.0, scaled=True)),
    (aten.special_airy_ai.default, _airy_ai),
]:
    _register(_op, _fn)
del _op, _fn
