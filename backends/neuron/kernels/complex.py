"""complex64 tile programs: a complex tensor is float32 (real, imaginary) pairs, computed as real
arithmetic on the engines.

A NeuronCore has no complex datapath; the Neuron compiler keeps a complex64 tensor as
interleaved float32 pairs and lowers every complex op to real instructions. So do these
programs: each streams its operands through SBUF as ``[rows, cols, 2]`` pair tiles
(:func:`~accelkit_backends.neuron.tiling.map_pairs`), and the Vector engine reaches the real and
imaginary parts with a stride-2 access pattern. A complex multiply is four multiplies and two
adds in fp32, each rounded to fp32 as the engines round (PyTorch's CPU kernel computes the same
``(ac - bd, ad + bc)``); ``polar`` takes its cosine and sine from the Scalar engine.

Native here: ``mul``, ``add``, ``sub`` (Tensor and Scalar forms, with a real or complex second
operand or number), ``neg``, ``_conj_physical``, ``polar``, ``complex``, ``fill``/``zero``.
Views (``view_as_real``, ``view_as_complex``, ``view(dtype)``) and copies between complex64
tensors are the runtime's storage emulation. Every other op with a complex operand or result is
declined by its kernel (:func:`~accelkit_backends.neuron.launch.tile_kernel`) and takes the CPU
fallback. A result that would be complex128 is refused as float64 is.
"""

from __future__ import annotations

from typing import Any, Union

import numpy as np
import torch

from accelkit.sdk import KernelDeclined
from accelkit_backends.neuron import runtime
from accelkit_backends.neuron.conversion import copy_into
from accelkit_backends.neuron.launch import OutSpec, complex_form, hbm_empty, tile_kernel
from accelkit_backends.neuron.sim.isa import Kernel
from accelkit_backends.neuron.sim.memory import Tile
from accelkit_backends.neuron.tiling import flat_chunks, map_flat, map_pairs

aten = torch.ops.aten

#: One part (real or imaginary) of an operand: a [rows, cols, 1] tile or an fp32 number.
Part = Union[Tile, np.float32]


def _check_result(out: OutSpec) -> None:
    """complex128 is pairs of float64, which the engines do not have: the neuron dtype error.
    A real result from complex operands (a real tensor filled with a complex number) is the
    CPU's to compute or refuse: declined."""
    if not out.dtype.is_complex:
        raise KernelDeclined(f"neuron complex programs make complex64 results, not {out.dtype}")
    if out.dtype != torch.complex64:
        runtime.accelkit_dtype_rules().check(out.dtype, "neuron:0")


def _is_array(value: Any) -> bool:
    return isinstance(value, np.ndarray)


def _number_parts(value: Any) -> tuple[np.float32, np.float32]:
    """A Python number as a complex64 element, as PyTorch converts it (each part to fp32)."""
    value = complex(value)
    return np.float32(value.real), np.float32(value.imag)


class _Operands:
    """The operands of one chunk, each as its (real, imaginary) parts: a complex tile's two
    stride-2 halves, a real tile and 0, or a number's two fp32 parts."""

    def __init__(self, values: tuple, srcs: list[Tile]):
        tiles = iter(srcs)
        self.parts: list[tuple[Part, Part]] = []
        for value in values:
            if not _is_array(value):
                self.parts.append(_number_parts(value))
                continue
            tile = next(tiles)
            if value.dtype == np.complex64:
                self.parts.append((tile[:, :, 0:1], tile[:, :, 1:2]))
            else:
                self.parts.append((tile, np.float32(0)))


def _real(dst: Tile) -> Tile:
    return dst[:, :, 0:1]


def _imag(dst: Tile) -> Tile:
    return dst[:, :, 1:2]


def _binary(k: Kernel, dst: Tile, a: Part, b: Part, op: str) -> None:
    """``dst = a <op> b`` on the Vector engine; a number operand is an immediate."""
    if isinstance(a, Tile) and isinstance(b, Tile):
        k.tensor_tensor(dst, a, b, op)
    elif isinstance(a, Tile):
        k.tensor_scalar(dst, a, op, b)
    elif isinstance(b, Tile):
        k.tensor_scalar(dst, b, op, a, reverse=True)
    else:  # two numbers: their fp32 result, set on the Vector engine
        with np.errstate(all="ignore"):
            k.memset(dst, float(_NUMBER_OPS[op](np.float32(a), np.float32(b))))


_NUMBER_OPS = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply}


def _product(k: Kernel, dst: Tile, x: tuple[Part, Part], y: tuple[Part, Part]) -> None:
    """``dst = x * y``: ``(xr*yr - xi*yi, xr*yi + xi*yr)``, four multiplies and two adds, each
    rounded to fp32."""
    (xr, xi), (yr, yi) = x, y
    shape = _real(dst).shape
    cross = k.sbuf(shape, np.float32, "cross")
    _binary(k, cross, xr, yi, "multiply")
    _binary(k, _imag(dst), xi, yr, "multiply")
    k.tensor_tensor(_imag(dst), cross, _imag(dst), "add")
    _binary(k, cross, xi, yi, "multiply")
    _binary(k, _real(dst), xr, yr, "multiply")
    k.tensor_tensor(_real(dst), _real(dst), cross, "subtract")


def _program(k: Kernel, out: OutSpec, values: tuple, compute) -> np.ndarray:
    """Run ``compute(dst, operands)`` over a fresh complex64 result of ``out``'s geometry."""
    _check_result(out)
    result = hbm_empty(out)
    arrays = [v for v in values if _is_array(v)]
    return map_pairs(k, result, arrays, lambda dst, srcs: compute(dst, _Operands(values, srcs)))


# ---------------------------------------------------------------------------------------------
# Arithmetic
# ---------------------------------------------------------------------------------------------


@complex_form(aten.mul.Tensor, aten.mul.Scalar)
def mul(k: Kernel, out: list[OutSpec], x: Any, y: Any) -> np.ndarray:
    """``x * y``; a real operand is a complex one with imaginary part 0, as PyTorch promotes it
    (so an infinite part multiplies 0 into NaN, as on the CPU)."""

    def compute(dst: Tile, ops: _Operands) -> None:
        _product(k, dst, *ops.parts)

    return _program(k, out[0], (x, y), compute)


def _add_like(op: str):
    def body(k: Kernel, out: list[OutSpec], x: Any, y: Any, *, alpha: Any = 1) -> np.ndarray:
        """``x + alpha * y`` (``-`` for sub); ``alpha`` other than 1 is a complex multiply."""
        scaled = alpha != 1 and alpha is not None

        def compute(dst: Tile, ops: _Operands) -> None:
            a, b = ops.parts
            if scaled:
                product = k.sbuf(dst.shape, np.float32, "scaled")
                _product(k, product, b, _number_parts(alpha))
                b = (_real(product), _imag(product))
            _binary(k, _real(dst), a[0], b[0], op)
            _binary(k, _imag(dst), a[1], b[1], op)

        return _program(k, out[0], (x, y), compute)

    body.__name__ = op
    return body


complex_form(aten.add.Tensor, aten.add.Scalar)(_add_like("add"))
complex_form(aten.sub.Tensor, aten.sub.Scalar)(_add_like("subtract"))


@complex_form(aten.neg.default)
def neg(k: Kernel, out: list[OutSpec], x: np.ndarray) -> np.ndarray:
    def compute(dst: Tile, ops: _Operands) -> None:
        real, imag = ops.parts[0]
        _binary(k, _real(dst), real, np.float32(-1), "multiply")
        _binary(k, _imag(dst), imag, np.float32(-1), "multiply")

    return _program(k, out[0], (x,), compute)


@tile_kernel(aten._conj_physical.default, static=True, complex_aware=True)
def conj_physical(k: Kernel, out: list[OutSpec], x: np.ndarray) -> np.ndarray:
    """The conjugate: the real parts copied, the imaginary parts negated (a real ``x`` is
    copied, as PyTorch's ``_conj_physical`` of a real tensor is a clone)."""
    if x.dtype != np.complex64:
        result = hbm_empty(out[0])
        return map_flat(k, result, [x], lambda dst, srcs: copy_into(k, dst, srcs[0]))

    def compute(dst: Tile, ops: _Operands) -> None:
        real, imag = ops.parts[0]
        k.tensor_copy(_real(dst), real)
        k.tensor_scalar(_imag(dst), imag, "multiply", -1.0)

    return _program(k, out[0], (x,), compute)


# ---------------------------------------------------------------------------------------------
# Making complex tensors
# ---------------------------------------------------------------------------------------------


@tile_kernel(aten.polar.default, static=True, complex_aware=True)
def polar(k: Kernel, out: list[OutSpec], abs: np.ndarray, angle: np.ndarray) -> np.ndarray:
    """``abs * (cos(angle), sin(angle))``: cosine and sine on the Scalar engine's activation
    tables, the products on the Vector engine."""

    def compute(dst: Tile, ops: _Operands) -> None:
        (magnitude, _), (phase, _) = ops.parts
        k.activation(_real(dst), phase, "cos")
        k.activation(_imag(dst), phase, "sin")
        _binary(k, _real(dst), _real(dst), magnitude, "multiply")
        _binary(k, _imag(dst), _imag(dst), magnitude, "multiply")

    return _program(k, out[0], (abs, angle), compute)


@tile_kernel(aten.complex.default, static=True, complex_aware=True)
def complex_(k: Kernel, out: list[OutSpec], real: np.ndarray, imag: np.ndarray) -> np.ndarray:
    """The pairs ``(real, imag)``: two Vector-engine copies into the halves (signed zeros kept)."""

    def compute(dst: Tile, ops: _Operands) -> None:
        (re, _), (im, _) = ops.parts
        k.tensor_copy(_real(dst), re)
        k.tensor_copy(_imag(dst), im)

    return _program(k, out[0], (real, imag), compute)


def _fill(k: Kernel, out: OutSpec, value: Any) -> np.ndarray:
    _check_result(out)
    result = hbm_empty(out)
    flat = result.reshape(-1).view(np.float32).reshape(-1, 2)
    real, imag = _number_parts(value)
    tile = None
    for start, rows, cols in flat_chunks(result.size, k.spec.partitions):
        if tile is None or tile.shape != (rows, cols, 2):
            tile = k.sbuf((rows, cols, 2), np.float32, "value")
            k.memset(_real(tile), float(real))
            k.memset(_imag(tile), float(imag))
        k.dma(flat[start : start + rows * cols].reshape(rows, cols, 2), tile)
    return result


@complex_form(aten.fill.Scalar)
def fill_scalar(k: Kernel, out: list[OutSpec], x: np.ndarray, value: Any) -> np.ndarray:
    return _fill(k, out[0], value)


@complex_form(aten.zero.default)
def zero(k: Kernel, out: list[OutSpec], x: np.ndarray) -> np.ndarray:
    return _fill(k, out[0], 0)
