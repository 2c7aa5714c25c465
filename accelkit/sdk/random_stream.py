"""Counter-based random numbers: the one stream every accelkit device draws from.

A device generator's state is a Philox pair, laid out as CUDA's: a 64-bit ``seed`` and a 64-bit
``offset`` (``get_rng_state()`` is 16 bytes, the seed then the offset, little-endian). A random
op reserves one *counter* per element it produces (:func:`counters_drawn` says how many for
each op); element ``i`` of its result, in row-major order, takes its 128 random bits from

    Philox4x32-10(key = seed, counter = (offset + i, 0))

(the 64-bit counter value in the low two of Philox's four 32-bit counter words), and the
generator's offset then advances by the count rounded up to a multiple of 4, CUDA's and DTensor's
rule. Because an element's bits depend on its index and on nothing drawn before it, a shard of a
tensor drawn at the counters its elements have in the whole tensor (a :class:`ShardWindow`) holds
exactly the values the whole tensor would: that is how a model built on the meta device, sharded
and then initialised equals the model initialised whole.

What each distribution makes of an element's four 32-bit words is defined here too, written
against an array namespace ``xp`` (``numpy`` on the host, ``jax.numpy`` inside an XLA program,
or any namespace with ``uint32``/``uint64`` arithmetic), so every backend computes the same
values on its own substrate. Floating values are computed in float32 (float64 for float64
results) and rounded once into the result's dtype by the caller. The stream equals neither the
CPU's (Mersenne Twister) nor CUDA's (which hands each thread its own Philox subsequence): like
every accelerator's, it agrees with them in distribution, not element by element.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

#: ``get_rng_state()`` of a device generator: seed (8 bytes), offset (8 bytes), little-endian.
STATE_BYTES = 16
#: A generator's seed before any seeding: CPU's and CUDA's default.
DEFAULT_SEED = 67280421310721
#: Offsets advance in multiples of this (CUDA refuses others; DTensor rounds to it).
OFFSET_ALIGNMENT = 4

_MASK32 = 0xFFFFFFFF
_PHILOX_M = (0xD2511F53, 0xCD9E8D57)  # Philox4x32 round multipliers
_PHILOX_W = (0x9E3779B9, 0xBB67AE85)  # key schedule increments (golden ratio, sqrt(3) - 1)
_ROUNDS = 10


def aligned(count: int) -> int:
    """``count`` counters rounded up to the offset alignment: what a draw advances the offset by."""
    return -(-int(count) // OFFSET_ALIGNMENT) * OFFSET_ALIGNMENT


@dataclass(frozen=True, slots=True)
class ShardWindow:
    """Where a local shard lies in the whole tensor a random op draws for (a DTensor's shard):
    its elements take the counters they have in the whole tensor."""

    #: The whole tensor's shape.
    whole_shape: tuple[int, ...]
    #: The shard's first index in each dimension of the whole tensor.
    start: tuple[int, ...]
    #: The shard's shape.
    shape: tuple[int, ...]

    def fits(self, shape: tuple[int, ...]) -> bool:
        """Whether a result of ``shape`` is this window's shard."""
        return tuple(shape) == self.shape


@dataclass(frozen=True, slots=True)
class RandomDraw:
    """The counters one random op was given: it draws from ``seed`` starting at ``offset``.

    ``seed`` and ``offset`` are Python ints, or, inside a traced program, 0-d ``uint64``
    arrays of its namespace. ``window`` places the result in a whole tensor (None: the result is
    the whole tensor).
    """

    seed: Any
    offset: Any
    window: ShardWindow | None = None


# ---------------------------------------------------------------------------------------------
# The stream
# ---------------------------------------------------------------------------------------------


def philox4x32_10(counter: tuple[Any, Any, Any, Any], key: tuple[Any, Any], xp: Any) -> tuple[Any, Any, Any, Any]:
    """The Philox4x32-10 block function (Salmon et al., SC'11): four ``uint32`` counter words
    (arrays that broadcast together) under two ``uint32``-valued key words (held in ``uint64``
    arrays or ints), to four ``uint32`` words."""
    u32, u64 = xp.uint32, xp.uint64
    c0, c1, c2, c3 = counter
    k0, k1 = (xp.asarray(k, dtype=u64) for k in key)
    for r in range(_ROUNDS):
        # The key of round r is key + r * W (mod 2**32), computed wide so nothing overflows.
        key0 = ((k0 + u64(r * _PHILOX_W[0])) & u64(_MASK32)).astype(u32)
        key1 = ((k1 + u64(r * _PHILOX_W[1])) & u64(_MASK32)).astype(u32)
        p0 = c0.astype(u64) * u64(_PHILOX_M[0])
        p1 = c2.astype(u64) * u64(_PHILOX_M[1])
        hi0, lo0 = (p0 >> u64(32)).astype(u32), (p0 & u64(_MASK32)).astype(u32)
        hi1, lo1 = (p1 >> u64(32)).astype(u32), (p1 & u64(_MASK32)).astype(u32)
        c0, c1, c2, c3 = hi1 ^ c1 ^ key0, lo1, hi0 ^ c3 ^ key1, lo0
    return c0, c1, c2, c3


def philox4x32(counter: Any, seed: Any, xp: Any) -> tuple[Any, Any, Any, Any]:
    """The stream's block function: Philox4x32-10 of the 64-bit counters ``counter`` (a
    ``uint64`` array, in the low two counter words; the high two are 0) under the 64-bit key
    ``seed``: four ``uint32`` arrays of ``counter``'s shape."""
    u32, u64 = xp.uint32, xp.uint64
    seed = xp.asarray(seed, dtype=u64)
    low = (counter & u64(_MASK32)).astype(u32)
    zeros = xp.zeros_like(low)
    return philox4x32_10((low, (counter >> u64(32)).astype(u32), zeros, zeros),
                         (seed & u64(_MASK32), seed >> u64(32)), xp)


def counters_at(draw: RandomDraw, shape: tuple[int, ...], index: Any, xp: Any) -> Any:
    """The ``uint64`` counters of the elements at row-major positions ``index`` (a ``uint64``
    array of any shape) of a result of ``shape``: ``offset + index``, or, under a shard window,
    ``offset +`` the element's row-major position in the whole tensor."""
    u64 = xp.uint64
    window = draw.window
    if window is not None and window.fits(tuple(shape)):
        rest, whole, stride = index, xp.zeros_like(index), 1
        for dim in reversed(range(len(shape))):
            coordinate = rest % u64(shape[dim]) + u64(window.start[dim])
            rest = rest // u64(shape[dim])
            whole = whole + coordinate * u64(stride)
            stride *= window.whole_shape[dim]
        index = whole
    return index + xp.asarray(draw.offset, dtype=u64)


def element_counters(draw: RandomDraw, shape: tuple[int, ...], xp: Any) -> Any:
    """The ``uint64`` counter of each element of a result of ``shape`` (see the module docstring)."""
    index = xp.arange(math.prod(shape), dtype=xp.uint64).reshape(tuple(shape))
    return counters_at(draw, tuple(shape), index, xp)


def words(draw: RandomDraw, shape: tuple[int, ...], xp: Any) -> tuple[Any, Any, Any, Any]:
    """The four 32-bit random words of each element of a result of ``shape``."""
    return philox4x32(element_counters(draw, tuple(shape), xp), draw.seed, xp)


# ---------------------------------------------------------------------------------------------
# Units: uniform numbers from an element's words
# ---------------------------------------------------------------------------------------------


def _unit(w: tuple, double: bool, xp: Any, pair: int = 0) -> Any:
    """Uniform in [0, 1): the top 24 bits of word ``pair`` (float32), or 53 bits of words
    ``2 * pair`` and ``2 * pair + 1`` (float64); every value exact."""
    u32 = xp.uint32
    if not double:
        return (w[pair] >> u32(8)).astype(xp.float32) * xp.float32(2.0**-24)
    high = (w[2 * pair] >> u32(5)).astype(xp.float64)
    low = (w[2 * pair + 1] >> u32(6)).astype(xp.float64)
    return (high * xp.float64(2.0**26) + low) * xp.float64(2.0**-53)


def _open_unit(w: tuple, double: bool, xp: Any, pair: int = 0) -> Any:
    """Uniform in (0, 1), never 0 nor 1 (for logarithms): ``(2k + 1) / 2**24`` with ``k`` the top
    23 bits of word ``pair`` (float32), or ``(2k + 1) / 2**53`` with 52 bits (float64); exact."""
    u32 = xp.uint32
    if not double:
        k = (w[pair] >> u32(9)).astype(xp.float32)
        return (k * xp.float32(2.0) + xp.float32(1.0)) * xp.float32(2.0**-24)
    high = (w[2 * pair] >> u32(6)).astype(xp.float64)
    low = (w[2 * pair + 1] >> u32(6)).astype(xp.float64)
    k = high * xp.float64(2.0**26) + low
    return (k * xp.float64(2.0) + xp.float64(1.0)) * xp.float64(2.0**-53)


def _float(double: bool, xp: Any) -> Any:
    return xp.float64 if double else xp.float32


# ---------------------------------------------------------------------------------------------
# Distributions (each value in float32, float64 when ``double``; the caller rounds it once)
# ---------------------------------------------------------------------------------------------


def uniform(draw: RandomDraw, shape: tuple, low: float, high: float, double: bool, xp: Any) -> Any:
    """``u * (high - low) + low`` with ``u`` uniform in [0, 1) (``uniform_``, ``rand``)."""
    f = _float(double, xp)
    return _unit(words(draw, shape, xp), double, xp) * f(high - low) + f(low)


def standard_normal(draw: RandomDraw, shape: tuple, double: bool, xp: Any) -> Any:
    """Box–Muller on each element's own bits: ``sqrt(-2 ln u1) * cos(2 pi u2)``, ``u1`` in (0, 1)
    and ``u2`` in [0, 1) from words 0 and 1 (float64: words 0-1 and 2-3)."""
    f = _float(double, xp)
    w = words(draw, shape, xp)
    radius = xp.sqrt(f(-2.0) * xp.log(_open_unit(w, double, xp, 0)))
    return radius * xp.cos(f(2 * math.pi) * _unit(w, double, xp, 1))


def normal(draw: RandomDraw, shape: tuple, mean: Any, std: Any, double: bool, xp: Any) -> Any:
    """``z * std + mean`` (``normal_``, ``randn``; ``mean``/``std`` numbers or arrays that
    broadcast to ``shape``)."""
    return standard_normal(draw, shape, double, xp) * std + mean


def log_normal(draw: RandomDraw, shape: tuple, mean: float, std: float, double: bool, xp: Any) -> Any:
    """``exp(z * std + mean)``."""
    f = _float(double, xp)
    return xp.exp(standard_normal(draw, shape, double, xp) * f(std) + f(mean))


def exponential(draw: RandomDraw, shape: tuple, rate: float, double: bool, xp: Any) -> Any:
    """``-ln(u) / rate`` with ``u`` in (0, 1): always positive and finite."""
    f = _float(double, xp)
    return -xp.log(_open_unit(words(draw, shape, xp), double, xp)) / f(rate)


def cauchy(draw: RandomDraw, shape: tuple, median: float, sigma: float, double: bool, xp: Any) -> Any:
    """``median + sigma * tan(pi (u - 1/2))`` with ``u`` in (0, 1)."""
    f = _float(double, xp)
    u = _open_unit(words(draw, shape, xp), double, xp)
    return f(median) + f(sigma) * xp.tan(f(math.pi) * (u - f(0.5)))


def geometric(draw: RandomDraw, shape: tuple, p: float, double: bool, xp: Any) -> Any:
    """Trials up to the first success of Bernoulli(``p``): ``max(1, ceil(ln u / ln(1 - p)))``."""
    f = _float(double, xp)
    u = _open_unit(words(draw, shape, xp), double, xp)
    return xp.maximum(xp.ceil(xp.log(u) / xp.log1p(f(-p))), f(1.0))


def bernoulli(draw: RandomDraw, shape: tuple, p: Any, double: bool, xp: Any) -> Any:
    """True where ``u < p`` (``p`` a number or an array broadcasting to ``shape``), ``u``
    uniform in [0, 1)."""
    return _unit(words(draw, shape, xp), double, xp) < p


def dropout_mask(draw: RandomDraw, shape: tuple, keep: float, xp: Any) -> Any:
    """True where an element is kept (``u < keep``, ``u`` a float32 uniform in [0, 1))."""
    return bernoulli(draw, shape, xp.float32(keep), False, xp)


def integers(draw: RandomDraw, shape: tuple, low: int, high: int, xp: Any) -> Any:
    """Integers in ``[low, high]`` (inclusive, static): word 0 modulo the span when the span fits
    32 bits, else words 0-1 as 64 bits modulo the span; ``int64``."""
    u32, u64 = xp.uint32, xp.uint64
    span = high - low + 1
    w = words(draw, shape, xp)
    if span <= 2**32:
        drawn = w[0].astype(u64) if span == 2**32 else (w[0] % u32(span)).astype(u64)
    else:
        bits = w[0].astype(u64) | (w[1].astype(u64) << u64(32))
        drawn = bits if span == 2**64 else bits % u64(span)
    return (drawn + u64(low % 2**64)).astype(xp.int64)  # wraps into the signed range


def multinomial(draw: RandomDraw, weights: Any, samples: int, replacement: bool, double: bool, xp: Any) -> Any:
    """``samples`` category indices per row of the 2-d non-negative ``weights`` (``int64``).

    With replacement, sample ``s`` of row ``r`` (counter ``r * samples + s``) is the first
    category whose cumulative weight exceeds ``u * total``. Without, categories are ranked by
    ``weight / E`` with ``E`` exponential from counter ``r * categories + c`` (the exponential
    race, as CUDA ranks them): the first ``samples`` are taken; zero weights rank last.
    """
    rows, categories = weights.shape
    f = _float(double, xp)
    weights = weights.astype(f)
    if replacement:
        cumulative = xp.cumsum(weights, axis=-1)
        target = _unit(words(draw, (rows, samples), xp), double, xp) * cumulative[:, -1:]
        chosen = xp.sum((cumulative[:, None, :] <= target[:, :, None]).astype(xp.int64), axis=-1)
        # Rounding may push the target past the last cumulative weight: take the last positive one.
        positive = weights > f(0)
        last = categories - 1 - xp.argmax(xp.flip(positive, axis=-1), axis=-1)
        return xp.minimum(chosen, last[:, None].astype(xp.int64))
    race = -xp.log(_open_unit(words(draw, (rows, categories), xp), double, xp))
    keys = weights / race
    return xp.argsort(-keys, axis=-1, stable=True)[:, :samples].astype(xp.int64)


def permutation(draw: RandomDraw, n: int, xp: Any) -> Any:
    """A random permutation of ``range(n)``: the order of the elements' 64-bit keys (``int64``)."""
    w = words(draw, (n,), xp)
    keys = w[0].astype(xp.uint64) | (w[1].astype(xp.uint64) << xp.uint64(32))
    return xp.argsort(keys, stable=True).astype(xp.int64)


_FLOAT_DIGITS = {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24, torch.float64: 53}


def random_bounds(dtype: torch.dtype, low: int = 0, to: int | None = None) -> tuple[int, int]:
    """``random_``'s inclusive range for a ``dtype`` tensor: ``[low, to - 1]``, or without ``to``
    up to the largest integer the dtype holds exactly (floats) or its maximum (integers)."""
    if to is not None:
        return low, to - 1
    if dtype == torch.bool:
        return low, 1
    if dtype in _FLOAT_DIGITS:
        return low, 2 ** _FLOAT_DIGITS[dtype]
    return low, torch.iinfo(dtype).max


# ---------------------------------------------------------------------------------------------
# How many counters each op draws
# ---------------------------------------------------------------------------------------------


def _shape(value: Any) -> tuple[int, ...]:
    return tuple(getattr(value, "shape", ()))


def _broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(torch.broadcast_shapes(*shapes))


def _argument(op: torch._ops.OpOverload, args: tuple, kwargs: dict, name: str) -> Any:
    names = [a.name for a in op._schema.arguments]
    position = names.index(name)
    if position < len(args):
        return args[position]
    if name in kwargs:
        return kwargs[name]
    default = op._schema.arguments[position].default_value
    return default


def counters_drawn(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> int:
    """How many counters ``op`` draws when called with ``args``/``kwargs`` (tensors or backend
    arrays; only shapes are read): one per element of its random result, which for most ops
    has the shape of its first argument. The generator's offset advances by this, aligned."""
    name = op._schema.name.removeprefix("aten::")
    if name == "multinomial":
        weights = _shape(args[0])
        rows = math.prod(weights[:-1])
        replacement = _argument(op, args, kwargs, "replacement")
        return rows * (int(_argument(op, args, kwargs, "num_samples")) if replacement else weights[-1])
    if name == "randperm":
        return int(args[0])
    if name == "normal" and op._overloadname != "default":
        mean, std = _argument(op, args, kwargs, "mean"), _argument(op, args, kwargs, "std")
        if op._overloadname.startswith("float_float"):
            return math.prod(_argument(op, args, kwargs, "size"))
        return math.prod(_broadcast(_shape(mean), _shape(std)))
    if name == "binomial":
        return math.prod(_broadcast(_shape(args[0]), _shape(_argument(op, args, kwargs, "prob"))))
    if name in ("rand", "randn", "randint", "randint_like", "rand_like", "randn_like") and "size" in {
            a.name for a in op._schema.arguments}:
        return math.prod(_argument(op, args, kwargs, "size"))
    return math.prod(_shape(args[0]))
