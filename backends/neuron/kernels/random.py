"""Random tile programs: the device's counter-based stream, computed on the engines.

Every random op gets the :class:`~accelkit.sdk.RandomDraw` the runtime reserved for it (in its
``generator`` argument; ``native_dropout``, whose schema has none, reserves its own with
:func:`accelkit.sdk.device_draw`). GpSimd computes each element's four random words from its
counter (``philox``, :mod:`accelkit.sdk.random_stream`); the Vector and Scalar engines turn
them into values exactly as the stream defines, in fp32, rounded once into the result's tile:

- ``uniform``: ``u * (to - from) + from``, ``u = (w0 >> 8) * 2^-24`` (exact in fp32);
- ``normal_``: Box–Muller, ``sqrt(-2 ln u1) * cos(2π u2)`` on the Scalar engine, ``u1 =
  ((w0 >> 9) * 2 + 1) * 2^-24`` in (0, 1) and ``u2`` from ``w1``;
- ``bernoulli``: ``u < p`` (``p`` a number or a tensor of probabilities);
- ``random_`` (``randint``): ``w0`` modulo the range, within the 32-bit datapath;
- ``exponential_``, ``cauchy_``, ``log_normal_``, ``geometric_``: the stream's inverse transforms of
  ``u`` in (0, 1) (``-ln u / λ``, ``tan(π(u - ½))``, ``exp(z σ + μ)``, ``ceil(ln u / ln(1 - p))``);
- ``native_dropout``: mask ``u < 1 - p``, output ``x * mask / (1 - p)`` (``p == 1`` drops all).

So the values are every accelkit device's for the same seed and offset (up to the last bit of
the Scalar engine's log and cos), and a DTensor shard (the draw's window) equals its part of the
whole tensor.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from accelkit.sdk import RandomDraw, device_draw
from accelkit_backends.neuron.launch import OutSpec, chip_dtype, hbm_empty, tile_kernel
from accelkit_backends.neuron.tiling import flat_chunks
from accelkit_backends.neuron.sim.isa import Kernel
from accelkit_backends.neuron.sim.errors import NeuronDtypeError
from accelkit_backends.neuron.sim.memory import Tile

aten = torch.ops.aten

#: Uniform floats keep the top 24 of the 32 random bits: every value is exact in fp32.
MANTISSA_BITS = 24


class _Chunk:
    """One ``[rows, cols]`` chunk of a random result: elements ``start ...`` of ``shape``."""

    def __init__(self, k: Kernel, draw: RandomDraw, shape: tuple[int, ...], start: int, rows: int, cols: int):
        self.k, self.draw, self.shape, self.start, self.tile = k, draw, shape, start, (rows, cols)
        self._words: list[Tile] | None = None

    def word(self, i: int) -> Tile:
        """Random word ``i`` (0 or 1) of each element (GpSimd computes both at once)."""
        if self._words is None:
            self._words = [self.k.sbuf(self.tile, np.uint32, f"w{j}") for j in range(2)]
            self.k.philox(self._words, self.draw, self.shape, self.start)
        return self._words[i]

    def uniform(self, name: str, word: int = 0) -> Tile:
        """An fp32 tile uniform in [0, 1): ``(w >> 8) * 2^-24``."""
        k = self.k
        top = k.sbuf(self.tile, np.int32, name + "_top")
        k.tensor_scalar(top, self.word(word), "right_shift", 32 - MANTISSA_BITS)
        values = k.sbuf(self.tile, np.float32, name)
        k.tensor_copy(values, top)
        k.tensor_scalar(values, values, "multiply", 2.0**-MANTISSA_BITS)
        return values

    def open_uniform(self, name: str, word: int = 0) -> Tile:
        """An fp32 tile uniform in (0, 1): ``((w >> 9) * 2 + 1) * 2^-24``."""
        k = self.k
        odd = k.sbuf(self.tile, np.int32, name + "_odd")
        k.tensor_scalar(odd, self.word(word), "right_shift", 32 - MANTISSA_BITS + 1)
        k.tensor_scalar(odd, odd, "multiply", 2)
        k.tensor_scalar(odd, odd, "add", 1)
        values = k.sbuf(self.tile, np.float32, name)
        k.tensor_copy(values, odd)
        k.tensor_scalar(values, values, "multiply", 2.0**-MANTISSA_BITS)
        return values


def _draw(generator: Any) -> RandomDraw:
    if not isinstance(generator, RandomDraw):
        raise RuntimeError("neuron random kernel called without its draw (the generator argument)")
    return generator


def _generate(k: Kernel, out: OutSpec, draw: RandomDraw, sample) -> np.ndarray:
    """A fresh array of ``out``'s geometry, chunk by chunk ``sample(chunk) -> fp32 tile``,
    rounded once into the result's dtype."""
    result = hbm_empty(out)
    flat = result.reshape(-1)
    for start, rows, cols in flat_chunks(result.size, k.spec.partitions):
        with k.scope():
            values = sample(_Chunk(k, draw, tuple(out.shape), start, rows, cols))
            stored = k.sbuf((rows, cols), chip_dtype(result.dtype), "stored")
            k.tensor_copy(stored, values)
            k.dma(flat[start : start + rows * cols].reshape(rows, cols), stored)
    return result


@tile_kernel(aten.uniform.default)
def uniform(k: Kernel, out: list[OutSpec], x: np.ndarray, from_: float = 0.0, to: float = 1.0, *,
            generator: Any = None, **kwargs: Any) -> np.ndarray:
    low = kwargs.get("from", from_)  # the schema's name is the Python keyword ``from``

    def sample(chunk: _Chunk) -> Tile:
        values = chunk.uniform("u")
        chunk.k.tensor_scalar(values, values, "multiply", to - low)
        chunk.k.tensor_scalar(values, values, "add", low)
        return values

    return _generate(k, out[0], _draw(generator), sample)


@tile_kernel(aten.normal_.default, derive_variants=False)
def normal_(k: Kernel, out: list[OutSpec], x: np.ndarray, mean: float = 0.0, std: float = 1.0, *,
            generator: Any = None) -> np.ndarray:
    """The new value of ``x``: normal samples (Box–Muller on each element's words 0 and 1)."""

    def sample(chunk: _Chunk) -> Tile:
        values = _standard_normal(chunk)
        chunk.k.tensor_scalar(values, values, "multiply", std)
        chunk.k.tensor_scalar(values, values, "add", mean)
        return values

    return _generate(k, out[0], _draw(generator), sample)


def _standard_normal(chunk: _Chunk) -> Tile:
    """N(0, 1) samples in fp32: Box–Muller on each element's words 0 and 1."""
    k = chunk.k
    radius = chunk.open_uniform("u1", 0)
    k.activation(radius, radius, "log")
    k.activation(radius, radius, "sqrt", scale=-2.0)
    angle = chunk.uniform("u2", 1)
    k.activation(angle, angle, "cos", scale=2 * math.pi)
    k.tensor_tensor(radius, radius, angle, "multiply")
    return radius


@tile_kernel(aten.normal.Tensor_Tensor, aten.normal.Tensor_float, aten.normal.float_Tensor)
def normal_tensor(k: Kernel, out: list[OutSpec], mean: Any, std: Any = 1.0, *, generator: Any = None) -> np.ndarray:
    """``mean + std * N(0, 1)`` with a tensor mean or std (or both, broadcast together), the
    numbers scaled and shifted per element on the Vector engine. A negative std is PyTorch's
    error, checked before anything runs."""
    if isinstance(std, np.ndarray):
        def check(values: np.ndarray) -> None:
            if np.any(np.asarray(values) < 0):
                raise RuntimeError("normal expects all elements of std >= 0.0")

        k.check(check, std)
    shape = tuple(out[0].shape)
    dense = {name: np.ascontiguousarray(np.broadcast_to(v, shape)).reshape(-1)
             for name, v in (("mean", mean), ("std", std)) if isinstance(v, np.ndarray)}

    def operand(chunk: _Chunk, name: str, value: Any) -> Any:
        if name not in dense:
            return value
        rows, cols = chunk.tile
        tile = chunk.k.sbuf(chunk.tile, chip_dtype(dense[name].dtype), name)
        chunk.k.dma(tile, dense[name][chunk.start : chunk.start + rows * cols].reshape(rows, cols))
        return tile

    def sample(chunk: _Chunk) -> Tile:
        values = _standard_normal(chunk)
        for name, value, op in (("std", std, "multiply"), ("mean", mean, "add")):
            given = operand(chunk, name, value)
            if isinstance(given, Tile):
                chunk.k.tensor_tensor(values, values, given, op)
            else:
                chunk.k.tensor_scalar(values, values, op, float(given))
        return values

    return _generate(k, out[0], _draw(generator), sample)


@tile_kernel(aten.log_normal_.default, derive_variants=False)
def log_normal_(k: Kernel, out: list[OutSpec], x: np.ndarray, mean: float = 1.0, std: float = 2.0, *,
                generator: Any = None) -> np.ndarray:
    """The new value of ``x``: ``exp(z * std + mean)``, ``z`` the stream's N(0, 1)."""
    if std <= 0:
        raise RuntimeError(f"log_normal_ expects std > 0.0, but found std={std}")  # the CPU's check

    def sample(chunk: _Chunk) -> Tile:
        values = _standard_normal(chunk)
        chunk.k.tensor_scalar(values, values, "multiply", std)
        chunk.k.tensor_scalar(values, values, "add", mean)
        chunk.k.activation(values, values, "exp")
        return values

    return _generate(k, out[0], _draw(generator), sample)


@tile_kernel(aten.exponential_.default, derive_variants=False)
def exponential_(k: Kernel, out: list[OutSpec], x: np.ndarray, lambd: float = 1.0, *,
                 generator: Any = None) -> np.ndarray:
    """The new value of ``x``: ``-ln(u) / lambd`` with ``u`` in (0, 1) (so finite and positive);
    dividing by ``-lambd`` is that same rounding (negation is exact)."""
    if not lambd > 0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={lambd}")

    def sample(chunk: _Chunk) -> Tile:
        values = chunk.open_uniform("u")
        chunk.k.activation(values, values, "log")
        chunk.k.tensor_scalar(values, values, "divide", -lambd)
        return values

    return _generate(k, out[0], _draw(generator), sample)


@tile_kernel(aten.cauchy_.default, derive_variants=False)
def cauchy_(k: Kernel, out: list[OutSpec], x: np.ndarray, median: float = 0.0, sigma: float = 1.0, *,
            generator: Any = None) -> np.ndarray:
    """The new value of ``x``: ``median + sigma * tan(pi (u - 1/2))``, ``u`` in (0, 1)."""
    if not sigma > 0:
        raise RuntimeError(f"cauchy_ expects sigma > 0.0, but found sigma={sigma}")

    def sample(chunk: _Chunk) -> Tile:
        values = chunk.open_uniform("u")
        chunk.k.tensor_scalar(values, values, "subtract", 0.5)
        chunk.k.activation(values, values, "tan", scale=math.pi)
        chunk.k.tensor_scalar(values, values, "multiply", sigma)
        chunk.k.tensor_scalar(values, values, "add", median)
        return values

    return _generate(k, out[0], _draw(generator), sample)


@tile_kernel(aten.geometric_.default, derive_variants=False)
def geometric_(k: Kernel, out: list[OutSpec], x: np.ndarray, p: float, *, generator: Any = None) -> np.ndarray:
    """The new value of ``x``: trials up to the first success, ``max(1, ceil(ln u / ln(1 - p)))``;
    ``ln(1 - p)`` is one number, computed once in fp32 as the stream defines it."""
    if not 0 < p < 1:
        raise RuntimeError(f"geometric_ expects p to be in (0, 1), but got p={p}")
    log_failure = float(np.log1p(np.float32(-p)))

    def sample(chunk: _Chunk) -> Tile:
        values = chunk.open_uniform("u")
        chunk.k.activation(values, values, "log")
        chunk.k.tensor_scalar(values, values, "divide", log_failure)
        chunk.k.activation(values, values, "ceil")
        chunk.k.tensor_scalar(values, values, "maximum", 1.0)
        return values

    return _generate(k, out[0], _draw(generator), sample)


def _bernoulli(k: Kernel, out: OutSpec, probability: Any, generator: Any) -> np.ndarray:
    """``u < p`` with ``p`` a number or an array of ``out``'s shape."""
    result = hbm_empty(out)
    flat = result.reshape(-1)
    p_flat = np.ascontiguousarray(probability).reshape(-1) if isinstance(probability, np.ndarray) else None
    draw = _draw(generator)
    for start, rows, cols in flat_chunks(result.size, k.spec.partitions):
        with k.scope():
            u = _Chunk(k, draw, tuple(out.shape), start, rows, cols).uniform("u")
            keep = k.sbuf((rows, cols), chip_dtype(result.dtype), "keep")
            if p_flat is None:
                k.tensor_scalar(keep, u, "less", probability)
            else:
                p = k.sbuf((rows, cols), chip_dtype(p_flat.dtype), "p")
                k.dma(p, p_flat[start : start + rows * cols].reshape(rows, cols))
                k.tensor_tensor(keep, u, p, "less")
            k.dma(flat[start : start + rows * cols].reshape(rows, cols), keep)
    return result


@tile_kernel(aten.bernoulli_.float, derive_variants=False)
def bernoulli_float(k: Kernel, out: list[OutSpec], x: np.ndarray, p: float = 0.5, *,
                    generator: Any = None) -> np.ndarray:
    return _bernoulli(k, out[0], p, generator)


@tile_kernel(aten.bernoulli_.Tensor, derive_variants=False)
def bernoulli_tensor(k: Kernel, out: list[OutSpec], x: np.ndarray, p: Any, *, generator: Any = None) -> np.ndarray:
    """The new value of ``x``: ``u < p``, a tensor ``p`` broadcast to ``x``'s shape."""
    if isinstance(p, np.ndarray):
        p = np.broadcast_to(p, tuple(out[0].shape))
    return _bernoulli(k, out[0], p, generator)


@tile_kernel(aten.bernoulli.p)
def bernoulli_p(k: Kernel, out: list[OutSpec], x: np.ndarray, p: float = 0.5, *,
                generator: Any = None) -> np.ndarray:
    return _bernoulli(k, out[0], p, generator)


@tile_kernel(aten.bernoulli.default)
def bernoulli(k: Kernel, out: list[OutSpec], x: np.ndarray, *, generator: Any = None) -> np.ndarray:
    return _bernoulli(k, out[0], x, generator)


@tile_kernel(aten.native_dropout.default)
def native_dropout(k: Kernel, out: list[OutSpec], x: np.ndarray, p: float, train: bool | None, *,
                   generator: Any = None) -> tuple:
    """``(x * mask / (1 - p), mask)``, mask kept with probability ``1 - p``; when not training,
    ``(x, all-true mask)``. Its draw is reserved here from the device generator (the schema has
    no generator), or given as ``generator`` by a compiled program."""
    result, mask = hbm_empty(out[0]), hbm_empty(out[1])
    flat_x = np.ascontiguousarray(x).reshape(-1)
    flat_out, flat_mask = result.reshape(-1), mask.reshape(-1)
    training = train is None or train
    keep = 1.0 - p
    scale = 1.0 / keep if keep > 0 else 0.0
    draw = (generator if generator is not None else device_draw(x.size)) if training and x.size else None
    for start, rows, cols in flat_chunks(result.size, k.spec.partitions):
        with k.scope():
            part = slice(start, start + rows * cols)
            values = k.sbuf((rows, cols), chip_dtype(x.dtype), "x")
            k.dma(values, flat_x[part].reshape(rows, cols))
            kept = k.sbuf((rows, cols), np.bool_, "mask")
            if draw is not None:
                u = _Chunk(k, draw, tuple(x.shape), start, rows, cols).uniform("u")
                k.tensor_scalar(kept, u, "less", keep)
            else:
                k.memset(kept, 1)
            dropped = k.sbuf((rows, cols), chip_dtype(result.dtype), "dropped")
            k.select(dropped, kept, values, 0.0)
            if training:
                k.tensor_scalar(dropped, dropped, "multiply", scale)
            k.dma(flat_out[part].reshape(rows, cols), dropped)
            k.dma(flat_mask[part].reshape(rows, cols), kept)
    return result, mask


@tile_kernel(aten.native_dropout_backward.default)
def native_dropout_backward(k: Kernel, out: list[OutSpec], grad: np.ndarray, mask: np.ndarray,
                            scale: float) -> np.ndarray:
    """``grad * mask * scale``."""
    result = hbm_empty(out[0])
    flat_grad, flat_mask, flat_out = (np.ascontiguousarray(a).reshape(-1) for a in (grad, mask, result))
    flat_out = result.reshape(-1)
    for start, rows, cols in flat_chunks(result.size, k.spec.partitions):
        with k.scope():
            part = slice(start, start + rows * cols)
            g = k.sbuf((rows, cols), chip_dtype(grad.dtype), "grad")
            k.dma(g, flat_grad[part].reshape(rows, cols))
            kept = k.sbuf((rows, cols), np.bool_, "mask")
            k.dma(kept, flat_mask[part].reshape(rows, cols))
            scaled = k.sbuf((rows, cols), chip_dtype(result.dtype), "scaled")
            k.select(scaled, kept, g, 0.0)
            k.tensor_scalar(scaled, scaled, "multiply", scale)
            k.dma(flat_out[part].reshape(rows, cols), scaled)
    return result


def _random_integers(k: Kernel, out: OutSpec, low: int, high: int, generator: Any) -> np.ndarray:
    """Integers uniform in ``[low, high)``: random word 0 modulo the range (a bias below
    ``range / 2^32``), shifted by ``low``, in the 32-bit datapath."""
    span = high - low
    if span <= 0:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")
    if span > 2**31 or not (-(2**31) <= low and high <= 2**31):
        raise NeuronDtypeError(f"random_: the range [{low}, {high}) does not fit the NeuronCore's 32-bit "
                               "integer datapath; draw a narrower range or on the CPU")

    def sample(chunk: _Chunk) -> Tile:
        k = chunk.k
        modulo = k.sbuf(chunk.tile, np.uint32, "modulo")
        k.tensor_scalar(modulo, chunk.word(0), "remainder", span)
        value = k.sbuf(chunk.tile, np.int32, "value")
        k.tensor_scalar(value, modulo, "add", low)
        return value

    return _generate(k, out, _draw(generator), sample)


_MANTISSA_DIGITS = {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24, torch.float64: 53}


def _default_high(dtype: torch.dtype) -> int:
    """``random_``'s exclusive upper bound without ``to``: every integer the dtype holds exactly."""
    if dtype.is_floating_point:
        return 2 ** _MANTISSA_DIGITS.get(dtype, 24) + 1
    if dtype == torch.bool:
        return 2
    return min(torch.iinfo(dtype).max, 2**31 - 1) + 1


@tile_kernel(getattr(aten.random_, "from"), derive_variants=False)  # "from" is a Python keyword
def random_from(k: Kernel, out: list[OutSpec], x: np.ndarray, from_: int, to: int | None = None, *,
                generator: Any = None) -> np.ndarray:
    return _random_integers(k, out[0], from_, _default_high(out[0].dtype) if to is None else to, generator)


@tile_kernel(aten.random_.to, derive_variants=False)
def random_to(k: Kernel, out: list[OutSpec], x: np.ndarray, to: int, *, generator: Any = None) -> np.ndarray:
    return _random_integers(k, out[0], 0, to, generator)


@tile_kernel(aten.random_.default, derive_variants=False)
def random_default(k: Kernel, out: list[OutSpec], x: np.ndarray, *, generator: Any = None) -> np.ndarray:
    return _random_integers(k, out[0], 0, _default_high(out[0].dtype), generator)
