"""Random lowerings: the device's counter-based stream, computed inside the op's XLA program.

Every random op receives in its ``generator`` argument the :class:`~accelkit.sdk.RandomDraw` the
runtime reserved for it (the seed and first counter, program inputs, so a new draw never
recompiles) and computes its values with :mod:`accelkit.sdk.random_stream` on ``jax.numpy``:
Philox4x32-10 of each element's counter, then the distribution's transform. The values are those
of every accelkit device for the same seed and offset (up to the last bit of transcendental
functions), not PyTorch's CPU stream; a DTensor shard draws its elements' counters in the whole
tensor (the draw's window), so a sharded random op equals the op on the whole tensor.

Three kinds of registration:

- functional ops (``uniform``, ``exponential``, ``random.from``, ``bernoulli.Tensor``, ...): the
  runtime derives their in-place forms (``uniform_``, ...) that ``torch.rand`` and friends use;
- in-place ops with no functional twin of the same overload (``normal_``, ``bernoulli_.float``):
  registered with ``derive_variants=False``; the lowering returns the new value of ``self`` and
  the runtime stores it;
- ``native_dropout``, whose schema has no generator: :class:`DeviceGeneratorLowering` reserves
  its draw from the device generator (:func:`accelkit.sdk.device_draw`), as the CPU fallback does.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import torch

from accelkit.sdk import RandomDraw, device_draw
from accelkit.sdk import random_stream as stream
from accelkit_backends.tpu import checks
from accelkit_backends.tpu.buffers import JaxView, torch_dtype
from accelkit_backends.tpu.lowering import Lowering, kernels, lowering

aten = torch.ops.aten


def _double(*values: Any) -> bool:
    """Floats are drawn in float32, in float64 when a tensor among ``values`` is float64."""
    return any(getattr(v, "dtype", None) == jnp.float64 for v in values)


def _draw(generator: Any) -> RandomDraw:
    if not isinstance(generator, RandomDraw):
        raise RuntimeError("tpu random lowering called without its draw (the generator argument)")
    return generator


# ---------------------------------------------------------------------------------------------
# Continuous distributions
# ---------------------------------------------------------------------------------------------


@lowering(aten.normal_.default, derive_variants=False)
@lowering(aten.normal_functional.default)
def normal(x, mean=0.0, std=1.0, *, generator=None):
    return stream.normal(_draw(generator), x.shape, mean, std, _double(x), jnp)


@lowering(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor)
def normal_tensor(mean, std=1.0, *, generator=None):
    """Normal samples with elementwise ``mean`` and ``std`` (either may be a tensor; broadcast)."""
    shape = jnp.broadcast_shapes(jnp.shape(mean), jnp.shape(std))
    return stream.normal(_draw(generator), shape, mean, std, _double(mean, std), jnp)


@lowering(aten.log_normal_.default, derive_variants=False)
def log_normal(x, mean=1.0, std=2.0, *, generator=None):
    return stream.log_normal(_draw(generator), x.shape, mean, std, _double(x), jnp)


@lowering(aten.cauchy_.default, derive_variants=False)
def cauchy(x, median=0.0, sigma=1.0, *, generator=None):
    return stream.cauchy(_draw(generator), x.shape, median, sigma, _double(x), jnp)


@lowering(aten.geometric_.default, derive_variants=False, static=("p",))  # Meta checks p
def geometric(x, p, *, generator=None):
    """The number of Bernoulli(``p``) trials up to the first success (1, 2, ...)."""
    return stream.geometric(_draw(generator), x.shape, p, _double(x), jnp)


@lowering(aten.uniform.default)
def uniform(x, from_=0.0, to=1.0, *, generator=None, **kwargs):
    low = kwargs.get("from", from_)  # the schema's name is the Python keyword ``from``
    return stream.uniform(_draw(generator), x.shape, low, to, _double(x), jnp)


@lowering(aten.exponential.default)
def exponential(x, lambd=1.0, *, generator=None):
    return stream.exponential(_draw(generator), x.shape, lambd, _double(x), jnp)


# ---------------------------------------------------------------------------------------------
# Bernoulli
# ---------------------------------------------------------------------------------------------


def _bernoulli(generator: Any, shape: tuple, p: Any) -> Any:
    """True with probability ``p`` (broadcast to ``shape``)."""
    return stream.bernoulli(_draw(generator), shape, p, _double(p), jnp)


@lowering(aten.bernoulli.default)
def bernoulli(x, *, generator=None):
    """``x`` holds the probabilities."""
    return _bernoulli(generator, x.shape, x)


@lowering(aten.bernoulli.Tensor)
def bernoulli_tensor(x, p, *, generator=None):
    return _bernoulli(generator, x.shape, p)


@lowering(aten.bernoulli_.float, derive_variants=False)
@lowering(aten.bernoulli.p)
def bernoulli_float(x, p=0.5, *, generator=None):
    return _bernoulli(generator, x.shape, p)


# ---------------------------------------------------------------------------------------------
# Integers: random_ and its functional forms
# ---------------------------------------------------------------------------------------------


def _integers(generator: Any, x: Any, low: int = 0, to: int | None = None) -> Any:
    """Integers uniform in ``random_``'s range for ``x``'s dtype (static bounds), in its shape;
    int64, cast to the tensor's dtype by the machinery."""
    low, high = stream.random_bounds(torch_dtype(x.dtype), low, to)
    return stream.integers(_draw(generator), x.shape, low, high, jnp)


@lowering(getattr(aten.random, "from"))  # ``from`` is a Python keyword
def random_from(x, from_=0, to=None, *, generator=None, **kwargs):
    return _integers(generator, x, kwargs.get("from", from_), to)


@lowering(aten.random.to)
def random_to(x, to, *, generator=None):
    return _integers(generator, x, 0, to)


@lowering(aten.random.default)
def random_(x, *, generator=None):
    return _integers(generator, x)


@lowering(aten.multinomial.default)
def multinomial(weights, num_samples, replacement=False, *, generator=None):
    """``num_samples`` category indices per row of ``weights`` (1-d or 2-d, non-negative, not
    necessarily normalised), drawn with probability proportional to the weights
    (:func:`accelkit.sdk.random_stream.multinomial`: by the cumulative weights with replacement;
    by the exponential race without, so each row's indices are distinct).

    Weights that are negative, infinite or NaN, and rows that sum to zero, fail with CPU's
    errors (device-side checks). Without replacement, a zero-weight category is drawn only after
    every positive one (CPU refuses more samples than positive weights; that is not checked).
    """
    double = _double(weights)
    rows = weights.reshape(-1, weights.shape[-1]).astype(jnp.float64 if double else jnp.float32)
    checks.require(jnp.all(jnp.isfinite(rows) & (rows >= 0)), RuntimeError,
                   "probability tensor contains either `inf`, `nan` or element < 0")
    checks.require(jnp.all(jnp.sum(rows, axis=-1) > 0), RuntimeError,
                   "invalid multinomial distribution (sum of probabilities <= 0)")
    drawn = stream.multinomial(_draw(generator), rows, num_samples, replacement, double, jnp)
    return drawn.reshape(weights.shape[:-1] + (num_samples,))


# ---------------------------------------------------------------------------------------------
# Dropout
# ---------------------------------------------------------------------------------------------


class DeviceGeneratorLowering(Lowering):
    """A random op whose schema takes no generator (``native_dropout``): the lowering receives
    the draw it reserves from the device generator as ``generator``, as if the schema had one
    (one counter per element of its first argument)."""

    fusable = True  # it only adds the draw

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        x = args[0]
        count = math.prod(x.spec.size if isinstance(x, JaxView) else x.shape)
        return super().__call__(*args, generator=device_draw(count), **kwargs)


def native_dropout(x, p, train, *, generator=None):
    """``(x * mask / (1-p), mask)`` with ``mask`` kept with probability ``1-p``; identity when
    not training. ``p == 1`` drops everything (scale 0, as on CPU: no division by zero)."""
    if train is False or x.size == 0:
        return x, jnp.ones(x.shape, jnp.bool_)
    keep = 1 - p
    mask = stream.dropout_mask(_draw(generator), x.shape, keep, jnp)
    scale = jnp.where(keep == 0, 0.0, 1 / jnp.where(keep == 0, 1.0, keep))
    compute = jnp.float64 if _double(x) else jnp.float32
    return x.astype(compute) * mask.astype(compute) * scale.astype(compute), mask


kernels.add(aten.native_dropout.default, DeviceGeneratorLowering(aten.native_dropout.default, native_dropout))


@lowering(aten.native_dropout_backward.default)
def native_dropout_backward(grad, mask, scale):
    compute = jnp.float64 if _double(grad) else jnp.float32
    return grad.astype(compute) * mask.astype(compute) * scale
