"""Random lowerings, drawn from the device generator.

The machinery turns an op's ``generator`` argument (the device's ``torch.Generator`` unless the
caller passed one) into a JAX PRNG key seeded from it, so ``torch.manual_seed`` and ``fork_rng``
govern every draw and two identically seeded runs produce identical values. The values are
JAX's (threefry) stream, not PyTorch's CPU stream: they agree with CPU in distribution, not
element by element.

Three kinds of registration:

- functional ops (``uniform``, ``exponential``, ``random.from``, ``bernoulli.Tensor``, ...): the
  runtime derives their in-place forms (``uniform_``, ...) that ``torch.rand`` and friends use;
- in-place ops with no functional twin of the same overload (``normal_``, ``bernoulli_.float``):
  registered with ``derive_variants=False``; the lowering returns the new value of ``self`` and
  the runtime stores it;
- ``native_dropout``, whose schema has no generator: :class:`DeviceGeneratorLowering` supplies
  the device generator, as the CPU fallback does (``_on_device_stream``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from accelkit.sdk import device_generator
from accelkit_backends.tpu import checks
from accelkit_backends.tpu.lowering import Lowering, kernels, lowering

aten = torch.ops.aten


def _sample_dtype(x: jax.Array) -> Any:
    """Floats are sampled in float32 (float64 if the tensor is float64) and rounded once."""
    return jnp.float64 if x.dtype == jnp.float64 else jnp.float32


def _key(generator: Any) -> jax.Array:
    if generator is None:
        raise RuntimeError("tpu random lowering called without a PRNG key (generator)")
    return generator


# ---------------------------------------------------------------------------------------------
# Continuous distributions
# ---------------------------------------------------------------------------------------------


@lowering(aten.normal_.default, derive_variants=False)
@lowering(aten.normal_functional.default)
def normal(x, mean=0.0, std=1.0, *, generator=None):
    noise = jax.random.normal(_key(generator), x.shape, _sample_dtype(x))
    return noise * std + mean


@lowering(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor)
def normal_tensor(mean, std=1.0, *, generator=None):
    """Normal samples with elementwise ``mean`` and ``std`` (either may be a tensor; broadcast)."""
    shape = jnp.broadcast_shapes(jnp.shape(mean), jnp.shape(std))
    tensors = [v for v in (mean, std) if isinstance(v, jax.Array) and not jax.typeof(v).weak_type]
    noise = jax.random.normal(_key(generator), shape, _sample_dtype(tensors[0]))
    return noise * std + mean


@lowering(aten.log_normal_.default, derive_variants=False)
def log_normal(x, mean=1.0, std=2.0, *, generator=None):
    """``exp`` of normal samples with ``mean`` and ``std``."""
    return jnp.exp(jax.random.normal(_key(generator), x.shape, _sample_dtype(x)) * std + mean)


@lowering(aten.cauchy_.default, derive_variants=False)
def cauchy(x, median=0.0, sigma=1.0, *, generator=None):
    return jax.random.cauchy(_key(generator), x.shape, _sample_dtype(x)) * sigma + median


@lowering(aten.geometric_.default, derive_variants=False, static=("p",))  # Meta checks p
def geometric(x, p, *, generator=None):
    """The number of Bernoulli(``p``) trials up to the first success (1, 2, ...)."""
    dtype = _sample_dtype(x) if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32
    u = jax.random.uniform(_key(generator), x.shape, dtype, minval=jnp.finfo(dtype).tiny, maxval=1.0)
    return jnp.ceil(jnp.log(u) / jnp.log1p(-jnp.asarray(p, dtype)))


@lowering(aten.uniform.default)
def uniform(x, from_=0.0, to=1.0, *, generator=None, **kwargs):
    low = kwargs.get("from", from_)  # the schema's name is the Python keyword ``from``
    return jax.random.uniform(_key(generator), x.shape, _sample_dtype(x), 0.0, 1.0) * (to - low) + low


@lowering(aten.exponential.default)
def exponential(x, lambd=1.0, *, generator=None):
    return jax.random.exponential(_key(generator), x.shape, _sample_dtype(x)) / lambd


# ---------------------------------------------------------------------------------------------
# Bernoulli
# ---------------------------------------------------------------------------------------------


def _draw(generator: Any, shape: tuple, p: Any) -> jax.Array:
    """True with probability ``p`` (broadcast to ``shape``), as ``uniform < p``."""
    dtype = jnp.float64 if getattr(p, "dtype", None) == jnp.float64 else jnp.float32
    p = p.astype(dtype) if isinstance(p, jax.Array) else p
    return jax.random.uniform(_key(generator), shape, dtype) < p


@lowering(aten.bernoulli.default)
def bernoulli(x, *, generator=None):
    """``x`` holds the probabilities."""
    return _draw(generator, x.shape, x)


@lowering(aten.bernoulli.Tensor)
def bernoulli_tensor(x, p, *, generator=None):
    return _draw(generator, x.shape, p)


@lowering(aten.bernoulli_.float, derive_variants=False)
@lowering(aten.bernoulli.p)
def bernoulli_float(x, p=0.5, *, generator=None):
    return _draw(generator, x.shape, p)


# ---------------------------------------------------------------------------------------------
# Integers: random_ and its functional forms
# ---------------------------------------------------------------------------------------------


def _default_high(dtype: Any) -> int:
    """The inclusive upper bound of ``random_()`` without ``to``: the largest integer a float
    dtype holds exactly (2**mantissa digits), or the integer dtype's maximum."""
    if dtype == jnp.bool_:
        return 1
    if jnp.issubdtype(dtype, jnp.floating):
        return 2 ** (jnp.finfo(dtype).nmant + 1)
    return int(jnp.iinfo(dtype).max)


def _integers(generator: Any, x: jax.Array, low: int, high: int) -> jax.Array:
    """Integers uniform in ``[low, high]`` (static, inclusive) in the tensor's shape.

    Computed on 64 random bits modulo the span, as PyTorch's CPU kernel does, so any span up
    to the whole int64 range works.
    """
    span = high - low + 1
    bits = jax.random.bits(_key(generator), x.shape, jnp.uint64)
    offset = bits if span == 2**64 else bits % np.uint64(span)
    values = jax.lax.bitcast_convert_type(offset + np.uint64(low % 2**64), jnp.int64)
    return values  # cast to the tensor's dtype by the machinery


@lowering(getattr(aten.random, "from"))  # ``from`` is a Python keyword
def random_from(x, from_=0, to=None, *, generator=None, **kwargs):
    low = kwargs.get("from", from_)
    high = _default_high(x.dtype) if to is None else to - 1
    return _integers(generator, x, low, high)


@lowering(aten.random.to)
def random_to(x, to, *, generator=None):
    return _integers(generator, x, 0, to - 1)


@lowering(aten.random.default)
def random_(x, *, generator=None):
    return _integers(generator, x, 0, _default_high(x.dtype))


@lowering(aten.multinomial.default)
def multinomial(weights, num_samples, replacement=False, *, generator=None):
    """``num_samples`` category indices per row of ``weights`` (1-d or 2-d, non-negative, not
    necessarily normalised), drawn with probability proportional to the weights: with
    replacement by ``jax.random.categorical``; without, as the ``num_samples`` largest
    ``log(w) + Gumbel`` keys (the Gumbel-top-k trick), so each row's indices are distinct.

    Weights that are negative, infinite or NaN, and rows that sum to zero, fail with CPU's
    errors (device-side checks). Without replacement, a zero-weight category is drawn only after
    every positive one (CPU refuses more samples than positive weights; that is not checked).
    """
    rows = weights.reshape(-1, weights.shape[-1]).astype(_sample_dtype(weights))
    checks.require(jnp.all(jnp.isfinite(rows) & (rows >= 0)), RuntimeError,
                   "probability tensor contains either `inf`, `nan` or element < 0")
    checks.require(jnp.all(jnp.sum(rows, axis=-1) > 0), RuntimeError,
                   "invalid multinomial distribution (sum of probabilities <= 0)")
    logits = jnp.where(rows > 0, jnp.log(jnp.where(rows > 0, rows, 1)), -jnp.inf)
    key = _key(generator)
    if replacement:
        drawn = jax.random.categorical(key, logits, axis=-1, shape=(num_samples, rows.shape[0])).T
    else:
        gumbel_key, tie_key = jax.random.split(key)
        keys = logits + jax.random.gumbel(gumbel_key, logits.shape, logits.dtype)
        # A zero weight gets a finite, very low key: ranked after every positive one, randomly.
        lowest = jnp.finfo(keys.dtype).min / 2 + jax.random.uniform(tie_key, keys.shape, keys.dtype)
        keys = jnp.where(rows > 0, keys, lowest)
        drawn = jax.lax.top_k(keys, num_samples)[1]
    return drawn.astype(jnp.int64).reshape(weights.shape[:-1] + (num_samples,))


# ---------------------------------------------------------------------------------------------
# Dropout
# ---------------------------------------------------------------------------------------------


class DeviceGeneratorLowering(Lowering):
    """A random op whose schema takes no generator (``native_dropout``): the lowering receives
    a key drawn from the device generator as ``generator``, as if the schema had one."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return super().__call__(*args, generator=device_generator(), **kwargs)


def native_dropout(x, p, train, *, generator=None):
    """``(x * mask / (1-p), mask)`` with ``mask`` kept with probability ``1-p``; identity when
    not training. ``p == 1`` drops everything (scale 0, as on CPU: no division by zero)."""
    if train is False or x.size == 0:
        return x, jnp.ones(x.shape, jnp.bool_)
    keep = 1 - p
    mask = jax.random.uniform(_key(generator), x.shape, _sample_dtype(x)) < keep
    scale = jnp.where(keep == 0, 0.0, 1 / jnp.where(keep == 0, 1.0, keep))
    compute = _sample_dtype(x)
    return x.astype(compute) * mask.astype(compute) * scale.astype(compute), mask


kernels.add(aten.native_dropout.default, DeviceGeneratorLowering(aten.native_dropout.default, native_dropout))


@lowering(aten.native_dropout_backward.default)
def native_dropout_backward(grad, mask, scale):
    compute = _sample_dtype(grad)
    return grad.astype(compute) * mask.astype(compute) * scale
