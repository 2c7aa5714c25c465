"""Orthogonal-polynomial lowerings: ``torch.special``'s Chebyshev (T, U, V, W and their shifted
forms), Hermite (H, He), Laguerre and Legendre polynomials ``P_n(x)``.

Contract, per element, as PyTorch's CPU kernels define these functions:

- ``x`` and ``n`` are computed in the result's float dtype (float32 for bool, integer, bfloat16
  and float16 inputs, for which CPU has no kernel; float64 stays float64); the degree is ``n`` truncated toward zero, and a
  negative degree (or a NaN one, which x86 converts to the most negative integer) gives 0;
- the value at degree 0 and 1 is the closed form; higher degrees run the three-term recurrence
  from degree 2 up to ``n``, in the same order of operations as PyTorch, so large values
  (``|x| > 1``) agree to rounding;
- the special cases PyTorch takes before the recurrence are taken here too: exact values at the
  ends of the interval (``x = +-1``, or ``x = 0, 1`` for the shifted forms), and for the
  Chebyshev families the trigonometric closed form inside the interval above a degree threshold.

The recurrence is one loop over degrees up to the largest degree present in the call (a
``while`` loop in the program: its trip count is data, not a compile-time constant); each
element keeps the value at its own degree. Each function also takes a Python scalar for ``x``
or ``n`` (the ``x_scalar`` and ``n_scalar`` overloads).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import torch

from accelkit_backends.tpu.lowering import lowering

aten = torch.ops.aten


def _operands(x: Any, n: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(x, n as float, integer degree), broadcast, in the compute dtype (module docstring)."""
    wide = any(isinstance(v, jax.Array) and v.dtype == jnp.float64 for v in (x, n))
    dtype = jnp.float64 if wide else jnp.float32
    x, n = jnp.broadcast_arrays(jnp.asarray(x).astype(dtype), jnp.asarray(n).astype(dtype))
    n = jnp.trunc(n)
    degree = jnp.where(jnp.isnan(n), -1, n).astype(jnp.int64)
    return x, n, degree


def _recurrence(degree: jax.Array, first: jax.Array, step: Callable, skip: jax.Array) -> jax.Array:
    """``p_degree`` of the recurrence ``p_0 = 1``, ``p_1 = first``,
    ``p_m = step(m, p_{m-1}, p_{m-2})`` (``m`` a float array); elements where ``skip`` holds
    do not extend the loop (their value is replaced by the caller)."""
    one = jnp.ones_like(first)
    value = jnp.where(degree == 0, one, first)
    if not degree.size:
        return value
    top = jnp.max(jnp.where(skip, 1, degree))

    def body(m, carry):
        before, last, value = carry
        new = step(m.astype(first.dtype), last, before)
        return last, new, jnp.where(degree == m, new, value)

    _, _, value = jax.lax.fori_loop(jnp.int64(2), top + 1, body, (one, first, value))
    return value


def _finish(value: jax.Array, degree: jax.Array, cases: list[tuple[jax.Array, Any]]) -> jax.Array:
    """``value`` overridden by ``cases`` (condition, value), the first listed winning, and 0 at
    negative degrees (which win over everything)."""
    for condition, case in reversed(cases):
        value = jnp.where(condition, case, value)
    return jnp.where(degree < 0, jnp.zeros_like(value), value)


def _odd(degree: jax.Array) -> jax.Array:
    return degree % 2 == 1


def _safe(denominator: jax.Array, ok: jax.Array) -> jax.Array:
    """``denominator`` where ``ok``, else 1 (so a discarded branch never divides by 0)."""
    return jnp.where(ok, denominator, jnp.ones_like(denominator))


def _register(name: str, fn: Callable) -> None:
    packet = getattr(aten, name)
    fn.__name__ = fn.__qualname__ = name
    lowering(packet.default, packet.x_scalar, packet.n_scalar)(fn)


# -- Chebyshev polynomials on [-1, 1] and on [0, 1] (shifted: argument 2x - 1) ----------------


def _chebyshev(kind: str, t: jax.Array, n: jax.Array, degree: jax.Array, threshold: int,
               left: jax.Array, right: jax.Array) -> jax.Array:
    """Chebyshev polynomial of ``kind`` (t, u, v, w) at ``t``; ``left``/``right`` say where the
    argument is the interval's end -1/+1, ``threshold`` is the degree above which the
    trigonometric form is used inside the interval."""
    first = {"t": t, "u": t + t, "v": t + t - 1, "w": t + t + 1}[kind]
    ends = left | right
    inside = (degree > threshold) & (jnp.abs(t) < 1) & ~ends
    value = _recurrence(degree, first, lambda m, q, p: (t + t) * q - p, ends | inside)
    theta = jnp.arccos(jnp.where(inside, t, jnp.zeros_like(t)))
    sign = jnp.where(_odd(degree), -1.0, 1.0).astype(t.dtype)
    if kind == "t":
        trig = jnp.cos(n * theta)
        end = jnp.where(right, 1.0, sign)
    elif kind == "u":
        s = jnp.sin(theta)
        trig = jnp.where(s != 0, jnp.sin((n + 1) * theta) / _safe(s, s != 0),
                         (n + 1) * jnp.cos((n + 1) * theta) / _safe(t, s == 0))
        end = jnp.where(right, n + 1, sign * (n + 1))
    elif kind == "v":
        half = theta / 2
        ok = jnp.sin(half) != 1
        trig = jnp.where(ok, jnp.cos((n + 0.5) * theta) / _safe(jnp.cos(half), ok), sign * (n + n + 1))
        end = jnp.where(right, 1.0, sign * (n + n + 1))
    else:
        half = theta / 2
        ok = jnp.cos(half) != 1
        limit = jnp.where(t > 0, n + n + 1, sign)
        trig = jnp.where(ok, jnp.sin((n + 0.5) * theta) / _safe(jnp.sin(half), ok), limit)
        end = jnp.where(right, n + n + 1, sign)
    return _finish(value, degree, [(ends, end), (inside, trig)])


_THRESHOLDS = {"t": 6, "u": 8, "v": 8, "w": 8}
_SHIFTED_THRESHOLDS = {"t": 6, "u": 6, "v": 6, "w": 4}


def _chebyshev_lowering(kind: str) -> Callable:
    def chebyshev(x, n):
        x, nf, degree = _operands(x, n)
        return _chebyshev(kind, x, nf, degree, _THRESHOLDS[kind], x == -1, x == 1)

    return chebyshev


def _shifted_chebyshev_lowering(kind: str) -> Callable:
    def shifted_chebyshev(x, n):
        x, nf, degree = _operands(x, n)
        return _chebyshev(kind, x + x - 1, nf, degree, _SHIFTED_THRESHOLDS[kind], x == 0, x == 1)

    return shifted_chebyshev


for _kind in "tuvw":
    _register(f"special_chebyshev_polynomial_{_kind}", _chebyshev_lowering(_kind))
    _register(f"special_shifted_chebyshev_polynomial_{_kind}", _shifted_chebyshev_lowering(_kind))


# -- Hermite, Laguerre, Legendre ----------------------------------------------------------------


def hermite_h(x, n):
    """Physicists' Hermite polynomial: ``H_m = 2x H_{m-1} - 2(m-1) H_{m-2}``."""
    x, _, degree = _operands(x, n)
    value = _recurrence(degree, x + x, lambda m, q, p: (x + x) * q - (m + m - 2) * p, degree < 0)
    return _finish(value, degree, [])


def hermite_he(x, n):
    """Probabilists' Hermite polynomial: ``He_m = x He_{m-1} - (m-1) He_{m-2}``."""
    x, _, degree = _operands(x, n)
    value = _recurrence(degree, x, lambda m, q, p: x * q - (m - 1) * p, degree < 0)
    return _finish(value, degree, [])


def laguerre_l(x, n):
    """Laguerre polynomial: ``m L_m = (2m - 1 - x) L_{m-1} - (m-1) L_{m-2}``; 1 at ``x = 0``."""
    x, _, degree = _operands(x, n)
    zero = x == 0
    value = _recurrence(degree, 1 - x, lambda m, q, p: (((m + m - 2) + (1 - x)) * q - (m - 1) * p) / m,
                        zero | (degree < 0))
    return _finish(value, degree, [(zero, jnp.ones_like(x))])


def legendre_p(x, n):
    """Legendre polynomial: ``m P_m = (2m - 1) x P_{m-1} - (m-1) P_{m-2}``; ``(+-1)**n`` at
    ``x = +-1``."""
    x, _, degree = _operands(x, n)
    ends = jnp.abs(x) == 1
    value = _recurrence(degree, x, lambda m, q, p: ((m + m - 1) * x * q - (m - 1) * p) / m, ends | (degree < 0))
    end = jnp.where((x > 0) | ~_odd(degree), 1.0, -1.0).astype(x.dtype)
    return _finish(value, degree, [(ends, end)])


for _name, _fn in [
    ("special_hermite_polynomial_h", hermite_h),
    ("special_hermite_polynomial_he", hermite_he),
    ("special_laguerre_polynomial_l", laguerre_l),
    ("special_legendre_polynomial_p", legendre_p),
]:
    _register(_name, _fn)
del _kind, _name, _fn
