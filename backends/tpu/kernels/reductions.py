"""Reduction and scan lowerings: sums, means, extrema, moments, norms, boolean reductions, scans.

Accumulation follows PyTorch's CPU kernels: bfloat16/float16 inputs are reduced in float32 and
the result is rounded once (the machinery casts it to PyTorch's result dtype); integral and bool
sums/products run in int64 (never in a narrower type that could overflow first). Reductions
without an identity (``amax``, ``max``, ``argmax``...) over a size-0 dimension raise PyTorch's
errors — mostly through the Meta kernel, and here where the Meta kernel is more lenient than CPU.

The small helpers at the top (``reduction_axes``, ``wrap_dim``, ``accumulation_dtype``,
``along``) are shared with the softmax and sorting lowerings.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import torch

from accelkit_backends.tpu.buffers import jax_dtype
from accelkit_backends.tpu.lowering import lowering

aten = torch.ops.aten


# ---------------------------------------------------------------------------------------------
# Shared helpers (traced; shapes and dims are static)
# ---------------------------------------------------------------------------------------------


def wrap_dim(dim: int, ndim: int) -> int:
    """A possibly negative dim as an axis, with PyTorch's IndexError when out of range (not all
    Meta kernels check); a 0-d tensor accepts dims 0 and -1, as in PyTorch."""
    size = max(ndim, 1)
    if not -size <= dim < size:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-size}, {size - 1}], but got {dim})")
    return dim % size


def reduction_axes(x: jax.Array, dim: int | Sequence[int] | None, empty_means_all: bool = True) -> tuple[int, ...]:
    """The axes an ``int[1]? dim`` argument reduces: ``None`` (and, by default, ``[]``) is all."""
    if x.ndim == 0:
        return ()
    if dim is None:
        return tuple(range(x.ndim))
    dims = [dim] if isinstance(dim, int) else list(dim)
    if not dims:
        return tuple(range(x.ndim)) if empty_means_all else ()
    return tuple(sorted({d % x.ndim for d in dims}))


def is_low_precision(dtype) -> bool:
    return dtype in (jnp.bfloat16, jnp.float16)


def accumulation_dtype(x: jax.Array, dtype: torch.dtype | None = None, integral_to_int64: bool = True):
    """The dtype a sum-like reduction runs in: ``dtype=`` if given, int64 for integral and bool
    inputs, float32 for bfloat16/float16, else the input's own dtype."""
    if dtype is not None:
        target = jax_dtype(dtype)
        return jnp.float32 if is_low_precision(target) else target
    if integral_to_int64 and (x.dtype == jnp.bool_ or jnp.issubdtype(x.dtype, jnp.integer)):
        return jnp.int64
    if is_low_precision(x.dtype):
        return jnp.float32
    return x.dtype


def upcast(x: jax.Array) -> jax.Array:
    """bfloat16/float16 as float32 (PyTorch's accumulation type); other dtypes unchanged."""
    return x.astype(jnp.float32) if is_low_precision(x.dtype) else x


def along(x: jax.Array, dim: int, fn: Callable[[jax.Array, int], object]) -> object:
    """Apply ``fn(array, axis)`` along ``dim``, treating a 0-d tensor as one element of a 1-d one."""
    if x.ndim == 0:
        out = fn(x.reshape(1), 0)
        if isinstance(out, tuple | list):
            return type(out)(o.reshape(()) for o in out)
        return out.reshape(())
    return fn(x, wrap_dim(dim, x.ndim))


def reduced_shape(x: jax.Array, axes: tuple[int, ...], keepdim: bool) -> tuple[int, ...]:
    if keepdim:
        return tuple(1 if a in axes else s for a, s in enumerate(x.shape))
    return tuple(s for a, s in enumerate(x.shape) if a not in axes)


def _require_nonempty(name: str, x: jax.Array, axis: int | None) -> None:
    """CPU's error for a reduction without identity over an empty dim (the Meta kernel lacks it)."""
    if axis is None:
        if x.size == 0:
            raise RuntimeError(
                f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                "Specify the reduction dim with the 'dim' argument."
            )
    elif x.ndim and x.shape[axis] == 0:
        raise IndexError(f"{name}(): Expected reduction dim {axis} to have non-zero size.")


# ---------------------------------------------------------------------------------------------
# Sums, means, products
# ---------------------------------------------------------------------------------------------


@lowering(aten.sum.default)
def sum_all(x, dtype=None):
    return jnp.sum(x.astype(accumulation_dtype(x, dtype)))


@lowering(aten.sum.dim_IntList)
def sum_dims(x, dim=None, keepdim=False, dtype=None):
    return jnp.sum(x.astype(accumulation_dtype(x, dtype)), axis=reduction_axes(x, dim), keepdims=keepdim)


@lowering(aten.nansum.default)
def nansum(x, dim=None, keepdim=False, dtype=None):
    a = x.astype(accumulation_dtype(x, dtype))
    if jnp.issubdtype(a.dtype, jnp.floating):
        a = jnp.where(jnp.isnan(a), jnp.zeros((), a.dtype), a)
    return jnp.sum(a, axis=reduction_axes(x, dim), keepdims=keepdim)


@lowering(aten.mean.default)
def mean_all(x, dtype=None):
    return jnp.mean(x.astype(accumulation_dtype(x, dtype, integral_to_int64=False)))


@lowering(aten.mean.dim)
def mean_dims(x, dim=None, keepdim=False, dtype=None):
    a = x.astype(accumulation_dtype(x, dtype, integral_to_int64=False))
    return jnp.mean(a, axis=reduction_axes(x, dim), keepdims=keepdim)


@lowering(aten.prod.default)
def prod_all(x, dtype=None):
    return jnp.prod(x.astype(accumulation_dtype(x, dtype)))


@lowering(aten.prod.dim_int)
def prod_dim(x, dim, keepdim=False, dtype=None):
    return jnp.prod(x.astype(accumulation_dtype(x, dtype)), axis=reduction_axes(x, dim), keepdims=keepdim)


# ---------------------------------------------------------------------------------------------
# Extrema and their indices
# ---------------------------------------------------------------------------------------------


def _extreme(fn, x, axes, keepdim):
    if x.size == 0:  # only reachable when the result is empty too (the Meta kernel refuses the rest)
        return jnp.zeros(reduced_shape(x, axes, keepdim), x.dtype)
    return fn(x, axis=axes, keepdims=keepdim)


@lowering(aten.amax.default)
def amax(x, dim=(), keepdim=False):
    return _extreme(jnp.max, x, reduction_axes(x, dim), keepdim)


@lowering(aten.amin.default)
def amin(x, dim=(), keepdim=False):
    return _extreme(jnp.min, x, reduction_axes(x, dim), keepdim)


@lowering(aten.max.default)
def max_all(x):
    _require_nonempty("max", x, None)
    return jnp.max(x)


@lowering(aten.min.default)
def min_all(x):
    _require_nonempty("min", x, None)
    return jnp.min(x)


def _extreme_with_index(name, values_fn, index_fn, x, dim, keepdim):
    """(values, int64 indices) along ``dim``; NaN wins and the first extreme's index is taken."""
    axis = wrap_dim(dim, x.ndim)
    _require_nonempty(name, x, axis)
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    shape = reduced_shape(x, (axis,), keepdim)
    if x.size == 0:
        return jnp.zeros(shape, x.dtype), jnp.zeros(shape, jnp.int64)
    values = values_fn(x, axis=axis, keepdims=keepdim)
    indices = index_fn(x, axis=axis, keepdims=keepdim).astype(jnp.int64)
    return values, indices


@lowering(aten.max.dim)
def max_dim(x, dim, keepdim=False):
    return _extreme_with_index("max", jnp.max, jnp.argmax, x, dim, keepdim)


@lowering(aten.min.dim)
def min_dim(x, dim, keepdim=False):
    return _extreme_with_index("min", jnp.min, jnp.argmin, x, dim, keepdim)


def _arg_extreme(name, index_fn, x, dim, keepdim):
    if dim is None:
        _require_nonempty(name, x, None)
        index = index_fn(x.reshape(-1)).astype(jnp.int64)
        return index.reshape((1,) * x.ndim) if keepdim else index
    return _extreme_with_index(name, index_fn, index_fn, x, dim, keepdim)[1]


@lowering(aten.argmax.default)
def argmax(x, dim=None, keepdim=False):
    return _arg_extreme("argmax", jnp.argmax, x, dim, keepdim)


@lowering(aten.argmin.default)
def argmin(x, dim=None, keepdim=False):
    return _arg_extreme("argmin", jnp.argmin, x, dim, keepdim)


@lowering(aten.aminmax.default)
def aminmax(x, dim=None, keepdim=False):
    axes = reduction_axes(x, dim)
    return _extreme(jnp.min, x, axes, keepdim), _extreme(jnp.max, x, axes, keepdim)


# ---------------------------------------------------------------------------------------------
# Moments
# ---------------------------------------------------------------------------------------------


def _moments(x, dim, correction, keepdim):
    """(variance, mean) over ``dim`` with Bessel-style ``correction`` (default 1), two-pass."""
    if not jnp.issubdtype(x.dtype, jnp.inexact):  # the Meta kernel lets integers through
        raise RuntimeError("std and var only support floating point and complex dtypes")
    axes = reduction_axes(x, dim)
    a = upcast(x)
    count = math.prod(x.shape[i] for i in axes)
    mean = jnp.mean(a, axis=axes, keepdims=True)
    squares = jnp.sum(jnp.square(jnp.abs(a - mean)), axis=axes, keepdims=keepdim)
    correction = 1 if correction is None else correction
    divisor = jnp.maximum(jnp.asarray(count - correction, a.dtype), jnp.zeros((), a.dtype))
    variance = squares / divisor
    return variance, mean if keepdim else mean.reshape(reduced_shape(x, axes, False))


@lowering(aten.var.correction)
def var(x, dim=None, *, correction=None, keepdim=False):
    return _moments(x, dim, correction, keepdim)[0]


@lowering(aten.std.correction)
def std(x, dim=None, *, correction=None, keepdim=False):
    return jnp.sqrt(_moments(x, dim, correction, keepdim)[0])


@lowering(aten.var_mean.correction)
def var_mean(x, dim=None, *, correction=None, keepdim=False):
    return _moments(x, dim, correction, keepdim)


@lowering(aten.std_mean.correction)
def std_mean(x, dim=None, *, correction=None, keepdim=False):
    variance, mean = _moments(x, dim, correction, keepdim)
    return jnp.sqrt(variance), mean


# ---------------------------------------------------------------------------------------------
# logsumexp and norms
# ---------------------------------------------------------------------------------------------


def _float_compute(x):
    """Float input for transcendental reductions: integral inputs become float32 (as PyTorch)."""
    if x.dtype == jnp.bool_ or jnp.issubdtype(x.dtype, jnp.integer):
        return x.astype(jnp.float32)
    return upcast(x)


@lowering(aten.logsumexp.default)
def logsumexp(x, dim, keepdim=False):
    axes = reduction_axes(x, dim)
    a = _float_compute(x)
    shift = jnp.max(a, axis=axes, keepdims=True, initial=-jnp.inf)
    shift = jnp.where(jnp.isinf(shift), jnp.zeros((), a.dtype), shift)
    out = jnp.log(jnp.sum(jnp.exp(a - shift), axis=axes, keepdims=True)) + shift
    return out if keepdim else out.reshape(reduced_shape(x, axes, False))


def _norm_for_order(magnitude, order, axes, keepdim):
    """The vector norm of ``|x|`` for a Python-number order (branches chosen while tracing)."""
    if order == math.inf:
        return _extreme(jnp.max, magnitude, axes, keepdim)
    if order == -math.inf:
        return _extreme(jnp.min, magnitude, axes, keepdim)
    if order == 0:
        return jnp.sum((magnitude != 0).astype(magnitude.dtype), axis=axes, keepdims=keepdim)
    if order == 1:
        return jnp.sum(magnitude, axis=axes, keepdims=keepdim)
    if order == 2:
        return jnp.sqrt(jnp.sum(magnitude * magnitude, axis=axes, keepdims=keepdim))
    powered = jnp.sum(magnitude ** jnp.asarray(order, magnitude.dtype), axis=axes, keepdims=keepdim)
    return powered ** jnp.asarray(1.0 / order, magnitude.dtype)


@lowering(aten.linalg_vector_norm.default, static=("ord",))
def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    a = x.astype(jax_dtype(dtype)) if dtype is not None else x
    return _norm_for_order(upcast(jnp.abs(a)), ord, reduction_axes(x, dim), keepdim)


# ---------------------------------------------------------------------------------------------
# Boolean reductions and counting
# ---------------------------------------------------------------------------------------------


def _truth(x):
    return x if x.dtype == jnp.bool_ else x != 0


@lowering(aten.any.default)
def any_all(x):
    return jnp.any(_truth(x))


@lowering(aten.all.default)
def all_all(x):
    return jnp.all(_truth(x))


@lowering(aten.any.dim)
def any_dim(x, dim, keepdim=False):
    return jnp.any(_truth(x), axis=reduction_axes(x, dim), keepdims=keepdim)


@lowering(aten.all.dim)
def all_dim(x, dim, keepdim=False):
    return jnp.all(_truth(x), axis=reduction_axes(x, dim), keepdims=keepdim)


@lowering(aten.any.dims)
def any_dims(x, dim=None, keepdim=False):
    # An empty dim list reduces nothing here (unlike sum's): PyTorch returns x != 0.
    return jnp.any(_truth(x), axis=reduction_axes(x, dim, empty_means_all=False), keepdims=keepdim)


@lowering(aten.all.dims)
def all_dims(x, dim=None, keepdim=False):
    return jnp.all(_truth(x), axis=reduction_axes(x, dim, empty_means_all=False), keepdims=keepdim)


@lowering(aten.count_nonzero.dim_IntList)
def count_nonzero_dims(x, dim):
    return jnp.sum(_truth(x).astype(jnp.int64), axis=reduction_axes(x, dim))


@lowering(aten.count_nonzero.default)
def count_nonzero(x, dim=None):
    return jnp.sum(_truth(x).astype(jnp.int64), axis=reduction_axes(x, dim))


# ---------------------------------------------------------------------------------------------
# Scans
# ---------------------------------------------------------------------------------------------


@lowering(aten.cumsum.default)
def cumsum(x, dim, *, dtype=None):
    a = x.astype(accumulation_dtype(x, dtype))
    return along(a, dim, lambda v, axis: jnp.cumsum(v, axis=axis))


@lowering(aten.cumprod.default)
def cumprod(x, dim, *, dtype=None):
    a = x.astype(accumulation_dtype(x, dtype))
    return along(a, dim, lambda v, axis: jnp.cumprod(v, axis=axis))


@lowering(aten.logcumsumexp.default)
def logcumsumexp(x, dim):
    return along(upcast(x), dim, lambda v, axis: jax.lax.cumlogsumexp(v, axis=axis))


def _running_extreme(x, dim, later_wins):
    """Running extreme with int64 indices, as CPU's cummax/cummin: NaN propagates (each later NaN
    takes over), and among equal values the later index wins."""

    def scan(v, axis):
        if v.shape[axis] == 0:
            return v, jnp.zeros(v.shape, jnp.int64)
        index = jax.lax.broadcasted_iota(jnp.int64, v.shape, axis)

        def combine(earlier, later):
            (a, ia), (b, ib) = earlier, later
            take_later = jnp.isnan(b) | (~jnp.isnan(a) & later_wins(b, a)) if jnp.issubdtype(
                v.dtype, jnp.floating) else later_wins(b, a)
            return jnp.where(take_later, b, a), jnp.where(take_later, ib, ia)

        return jax.lax.associative_scan(combine, (v, index), axis=axis)

    return along(x, dim, scan)


@lowering(aten.cummax.default)
def cummax(x, dim):
    return _running_extreme(x, dim, lambda b, a: b >= a)


@lowering(aten.cummin.default)
def cummin(x, dim):
    return _running_extreme(x, dim, lambda b, a: b <= a)

