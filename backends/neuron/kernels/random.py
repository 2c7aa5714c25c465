"""Random tile programs: the engines' hardware PRNG, seeded from the device generator.

Each program draws one 32-bit seed from the op's ``generator`` (the device's ``torch.Generator``
unless the caller passed one), so ``torch.manual_seed`` governs every draw, identically seeded
runs repeat, and the generator's state advances with each call. The seed goes to the engines'
PRNG (``set_rng_seed``); ``rng`` then writes 32 random bits per element, of which the top 24
become a uniform float ``k * 2^-24`` — exact in fp32 — on the Vector engine. The numbers are not
PyTorch's CPU stream: they agree with it in distribution, not element by element.

- ``uniform``: ``u * (to - from) + from``;
- ``normal_``: Box–Muller, ``sqrt(-2 ln u1) * cos(2π u2)`` on the Scalar engine (``u1`` in
  ``(0, 1]`` so the logarithm is finite);
- ``bernoulli``: ``u < p`` (``p`` a number or a tensor of probabilities);
- ``random_`` (``randint``): 31 random bits modulo the range, within the 32-bit datapath;
- ``native_dropout``: mask ``u < 1 - p``, output ``x * mask / (1 - p)`` (``p == 1`` drops all);
  its schema has no generator, so it draws from the device generator, as the CPU fallback does.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from accelkit.sdk import device_generator
from accelkit_backends.neuron.launch import OutSpec, chip_dtype, hbm_empty, tile_kernel
from accelkit_backends.neuron.tiling import flat_chunks
from accelkit_backends.neuron.sim.isa import Kernel
from accelkit_backends.neuron.sim.errors import NeuronDtypeError
from accelkit_backends.neuron.sim.memory import Tile

aten = torch.ops.aten

#: Uniform floats keep the top 24 of the 32 random bits: every value is exact in fp32.
MANTISSA_BITS = 24


def _seed(k: Kernel, generator: torch.Generator | None) -> None:
    """Seed the engines' PRNG with 31 bits drawn from ``generator`` (advancing its state)."""
    if generator is None:
        generator = device_generator()
    seed = int(torch.randint(0, 2**31 - 1, (), generator=generator))
    k.set_rng_seed(seed)


def _uniform(k: Kernel, shape: tuple[int, int], name: str, open_at_zero: bool = False) -> Tile:
    """An fp32 tile of uniform values in ``[0, 1)`` (or ``(0, 1]``)."""
    bits = k.sbuf(shape, np.uint32, name + "_bits")
    k.rng(bits)
    top = k.sbuf(shape, np.int32, name + "_top")
    k.tensor_scalar(top, bits, "right_shift", 32 - MANTISSA_BITS)
    if open_at_zero:
        k.tensor_scalar(top, top, "add", 1)
    values = k.sbuf(shape, np.float32, name)
    k.tensor_copy(values, top)
    k.tensor_scalar(values, values, "multiply", 2.0**-MANTISSA_BITS)
    return values


def _generate(k: Kernel, out: OutSpec, generator: Any, sample) -> np.ndarray:
    """A fresh array of ``out``'s geometry, chunk by chunk ``sample(k, (rows, cols)) -> fp32
    tile``, rounded once into the result's dtype."""
    result = hbm_empty(out)
    flat = result.reshape(-1)
    _seed(k, generator)
    for start, rows, cols in flat_chunks(result.size, k.spec.partitions):
        with k.scope():
            values = sample(k, (rows, cols))
            stored = k.sbuf((rows, cols), chip_dtype(result.dtype), "stored")
            k.tensor_copy(stored, values)
            k.dma(flat[start : start + rows * cols].reshape(rows, cols), stored)
    return result


@tile_kernel(aten.uniform.default)
def uniform(k: Kernel, out: list[OutSpec], x: np.ndarray, from_: float = 0.0, to: float = 1.0, *,
            generator: Any = None, **kwargs: Any) -> np.ndarray:
    low = kwargs.get("from", from_)  # the schema's name is the Python keyword ``from``

    def sample(k: Kernel, shape: tuple[int, int]) -> Tile:
        values = _uniform(k, shape, "u")
        k.tensor_scalar(values, values, "multiply", to - low)
        k.tensor_scalar(values, values, "add", low)
        return values

    return _generate(k, out[0], generator, sample)


@tile_kernel(aten.normal_.default, derive_variants=False)
def normal_(k: Kernel, out: list[OutSpec], x: np.ndarray, mean: float = 0.0, std: float = 1.0, *,
            generator: Any = None) -> np.ndarray:
    """The new value of ``x``: normal samples (Box–Muller)."""

    def sample(k: Kernel, shape: tuple[int, int]) -> Tile:
        radius = _uniform(k, shape, "u1", open_at_zero=True)
        k.activation(radius, radius, "log")
        k.activation(radius, radius, "sqrt", scale=-2.0)
        angle = _uniform(k, shape, "u2")
        k.activation(angle, angle, "cos", scale=2 * math.pi)
        k.tensor_tensor(radius, radius, angle, "multiply")
        k.activation(radius, radius, "identity", scale=std, bias=mean)
        return radius

    return _generate(k, out[0], generator, sample)


def _bernoulli(k: Kernel, out: OutSpec, probability: Any, generator: Any) -> np.ndarray:
    """``u < p`` with ``p`` a number or an array of ``out``'s shape."""
    result = hbm_empty(out)
    flat = result.reshape(-1)
    p_flat = np.ascontiguousarray(probability).reshape(-1) if isinstance(probability, np.ndarray) else None
    _seed(k, generator)
    for start, rows, cols in flat_chunks(result.size, k.spec.partitions):
        with k.scope():
            u = _uniform(k, (rows, cols), "u")
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


@tile_kernel(aten.bernoulli.p)
def bernoulli_p(k: Kernel, out: list[OutSpec], x: np.ndarray, p: float = 0.5, *,
                generator: Any = None) -> np.ndarray:
    return _bernoulli(k, out[0], p, generator)


@tile_kernel(aten.bernoulli.default)
def bernoulli(k: Kernel, out: list[OutSpec], x: np.ndarray, *, generator: Any = None) -> np.ndarray:
    return _bernoulli(k, out[0], x, generator)


@tile_kernel(aten.native_dropout.default)
def native_dropout(k: Kernel, out: list[OutSpec], x: np.ndarray, p: float, train: bool | None) -> tuple:
    """``(x * mask / (1 - p), mask)``, mask kept with probability ``1 - p``; when not training,
    ``(x, all-true mask)``."""
    result, mask = hbm_empty(out[0]), hbm_empty(out[1])
    flat_x = np.ascontiguousarray(x).reshape(-1)
    flat_out, flat_mask = result.reshape(-1), mask.reshape(-1)
    training = train is None or train
    keep = 1.0 - p
    scale = 1.0 / keep if keep > 0 else 0.0
    if training:
        _seed(k, None)
    for start, rows, cols in flat_chunks(result.size, k.spec.partitions):
        with k.scope():
            part = slice(start, start + rows * cols)
            values = k.sbuf((rows, cols), chip_dtype(x.dtype), "x")
            k.dma(values, flat_x[part].reshape(rows, cols))
            kept = k.sbuf((rows, cols), np.bool_, "mask")
            if training:
                k.tensor_scalar(kept, _uniform(k, (rows, cols), "u"), "less", keep)
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
    """Integers uniform in ``[low, high)``: 31 random bits modulo the range (a bias below
    ``range / 2^31``), shifted by ``low``, in the 32-bit datapath."""
    span = high - low
    if span <= 0:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")
    if span > 2**31 or not (-(2**31) <= low and high <= 2**31):
        raise NeuronDtypeError(f"random_: the range [{low}, {high}) does not fit the NeuronCore's 32-bit "
                               "integer datapath; draw a narrower range or on the CPU")

    def sample(k: Kernel, shape: tuple[int, int]) -> Tile:
        bits = k.sbuf(shape, np.uint32, "bits")
        k.rng(bits)
        value = k.sbuf(shape, np.int32, "value")
        k.tensor_scalar(value, bits, "right_shift", 1)
        k.tensor_scalar(value, value, "remainder", span)
        k.tensor_scalar(value, value, "add", low)
        return value

    return _generate(k, out, generator, sample)


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
