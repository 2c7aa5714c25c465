"""Elementwise tile programs: arithmetic and comparisons on the Vector engine (exact integer
work on GpSimd), transcendental functions on the Scalar engine's activation tables.

Every program streams its operands through SBUF in [128, F] chunks (``map_flat``); inputs
broadcast by their DMA access pattern, a size-1 input rides along as a per-partition scalar.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from accelkit.sdk import KernelDeclined
from accelkit_backends.neuron.launch import OutSpec, chip_dtype, hbm_empty, meta_twin, tile_kernel
from accelkit_backends.neuron.tiling import map_flat
from accelkit_backends.neuron.sim import numerics as nx
from accelkit_backends.neuron.sim.isa import Kernel
from accelkit_backends.neuron.sim.memory import Tile

aten = torch.ops.aten


def _is_array(value: Any) -> bool:
    return isinstance(value, np.ndarray)


def binary(k: Kernel, out: OutSpec, x: Any, y: Any, op: str) -> np.ndarray:
    """``out = x <op> y`` with broadcasting; either side may be a Python number."""
    result = hbm_empty(out)
    arrays = [v for v in (x, y) if _is_array(v)]

    def compute(dst: Tile, srcs: list[Tile]) -> None:
        it = iter(srcs)
        a = next(it) if _is_array(x) else x
        b = next(it) if _is_array(y) else y
        _apply_binary(k, dst, a, b, op)

    return map_flat(k, result, arrays, compute)


def _apply_binary(k: Kernel, dst: Tile, a: Any, b: Any, op: str) -> None:
    a_full = isinstance(a, Tile) and a.shape == dst.shape
    b_full = isinstance(b, Tile) and b.shape == dst.shape
    if a_full and b_full:
        k.tensor_tensor(dst, a, b, op)
    elif a_full:
        k.tensor_scalar(dst, a, op, b)
    elif b_full:
        k.tensor_scalar(dst, b, op, a, reverse=True)
    else:  # both per-partition scalars (a one-element result) or numbers
        if not isinstance(a, Tile):
            a, b = b, a
            k.tensor_scalar(dst, a, op, b, reverse=True)
        else:
            k.tensor_scalar(dst, a, op, b)


def _scaled(k: Kernel, y: Any, alpha: Any, like: Tile | None) -> Any:
    """``alpha * y``: a new tile (of ``y``'s dtype) for a tile, never ``y`` itself: in a fused
    program ``y`` may be a value other ops read too, or a matmul's result block about to be
    stored."""
    if alpha == 1 or alpha is None:
        return y
    if isinstance(y, Tile):
        scaled = k.sbuf(y.shape, np.int64 if y.checked else y.dtype, "scaled")
        k.tensor_scalar(scaled, y, "multiply", alpha)
        return scaled
    return y * alpha


def _add_like(sign: int):
    def body(k: Kernel, out: list[OutSpec], x: Any, y: Any, *, alpha: Any = 1) -> np.ndarray:
        result = hbm_empty(out[0])
        arrays = [v for v in (x, y) if _is_array(v)]
        op = "add" if sign > 0 else "subtract"

        def compute(dst: Tile, srcs: list[Tile]) -> None:
            it = iter(srcs)
            a = next(it) if _is_array(x) else x
            b = next(it) if _is_array(y) else y
            _apply_binary(k, dst, a, _scaled(k, b, alpha, dst), op)

        return map_flat(k, result, arrays, compute)

    return body


tile_kernel(aten.add.Tensor, aten.add.Scalar, static=True)(_add_like(+1))
tile_kernel(aten.sub.Tensor, aten.sub.Scalar, static=True)(_add_like(-1))


_BINARY = {
    "multiply": (aten.mul.Tensor, aten.mul.Scalar),
    "maximum": (aten.maximum.default,),
    "minimum": (aten.minimum.default,),
    "equal": (aten.eq.Tensor, aten.eq.Scalar),
    "not_equal": (aten.ne.Tensor, aten.ne.Scalar),
    "less": (aten.lt.Tensor, aten.lt.Scalar),
    "less_equal": (aten.le.Tensor, aten.le.Scalar),
    "greater": (aten.gt.Tensor, aten.gt.Scalar),
    "greater_equal": (aten.ge.Tensor, aten.ge.Scalar),
    "logical_and": (aten.logical_and.default,),
    "logical_or": (aten.logical_or.default,),
    "logical_xor": (aten.logical_xor.default,),
    "bitwise_and": (aten.bitwise_and.Tensor, aten.bitwise_and.Scalar),
    "bitwise_or": (aten.bitwise_or.Tensor, aten.bitwise_or.Scalar),
    "bitwise_xor": (aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar),
    "atan2": (aten.atan2.default,),
    "pow": (aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar),
    "copysign": (aten.copysign.Tensor, aten.copysign.Scalar),
    "hypot": (aten.hypot.default,),
    "logaddexp": (aten.logaddexp.default,),
}


def _register_binary(op_name: str, ops: tuple) -> None:
    def body(k: Kernel, out: list[OutSpec], x: Any, y: Any) -> np.ndarray:
        return binary(k, out[0], x, y, op_name)

    body.__name__ = op_name
    tile_kernel(*ops, static=True)(body)


for _name, _ops in _BINARY.items():
    _register_binary(_name, _ops)


@tile_kernel(aten.pow.Scalar, static=True)
def pow_scalar_base(k: Kernel, out: list[OutSpec], base: Any, exponent: np.ndarray) -> np.ndarray:
    return binary(k, out[0], base, exponent, "pow")


@tile_kernel(aten.div.Tensor, aten.div.Scalar, static=True)
def div(k: Kernel, out: list[OutSpec], x: Any, y: Any) -> np.ndarray:
    return binary(k, out[0], x, y, "divide")


def check_divisor(k: Kernel, out: OutSpec, divisor: Any) -> None:
    """PyTorch's error for an integer division or remainder by zero, raised before the program
    runs, so an in-place or ``out=`` form leaves its tensor unchanged (the CPU checks each
    element as it goes). Float results divide by zero as IEEE says (inf, nan)."""
    if out.dtype.is_floating_point or out.dtype.is_complex or 0 in out.shape:
        return

    def check(values: Any) -> None:
        if np.any(np.asarray(values) == 0):
            raise RuntimeError("ZeroDivisionError")

    if _is_array(divisor):
        k.check(check, divisor)
    else:
        check(divisor)


@tile_kernel(aten.div.Tensor_mode, aten.div.Scalar_mode, static=True)
def div_mode(k: Kernel, out: list[OutSpec], x: Any, y: Any, *, rounding_mode: str | None) -> np.ndarray:
    if rounding_mode is None:
        return binary(k, out[0], x, y, "divide")
    if not out[0].dtype.is_floating_point:
        check_divisor(k, out[0], y)
        return binary(k, out[0], x, y, "floor_divide" if rounding_mode == "floor" else "trunc_divide")
    result = hbm_empty(out[0])
    arrays = [v for v in (x, y) if _is_array(v)]
    # CPU rounds a bfloat16/float16 quotient to its dtype before truncating it (17.99 is 18 in
    # bfloat16, so 18, where truncating in fp32 gives 17); a single-element divisor is a scalar
    # to CPU's kernel, which divides by it in float32.
    narrow = (rounding_mode == "trunc" and out[0].dtype in (torch.bfloat16, torch.float16)
              and _is_array(y) and y.size != 1)

    def compute(dst: Tile, srcs: list[Tile]) -> None:
        it = iter(srcs)
        a = next(it) if _is_array(x) else x
        b = next(it) if _is_array(y) else y
        quotient = k.sbuf(dst.shape, np.float32, "q")
        _apply_binary(k, quotient, a, b, "divide")
        if narrow:
            rounded = k.sbuf(dst.shape, chip_dtype(result.dtype), "q_rounded")
            k.tensor_copy(rounded, quotient)
            quotient = rounded
        k.activation(dst, quotient, "floor" if rounding_mode == "floor" else "trunc")

    return map_flat(k, result, arrays, compute)


@tile_kernel(aten.floor_divide.default, aten.floor_divide_.Tensor, static=True)
def floor_divide(k: Kernel, out: list[OutSpec], x: Any, y: Any) -> np.ndarray:
    """``x // y``: ``div(rounding_mode="floor")``. Registered for the in-place overload too
    (``floor_divide_.Tensor`` has no functional twin of its name), so ``a // b`` and
    ``a //= b`` run the same program."""
    return div_mode(k, out, x, y, rounding_mode="floor")


def _remainder_like(op: str):
    def body(k: Kernel, out: list[OutSpec], x: Any, y: Any) -> np.ndarray:
        check_divisor(k, out[0], y)
        return binary(k, out[0], x, y, op)

    body.__name__ = op
    return body


tile_kernel(aten.fmod.Tensor, aten.fmod.Scalar, static=True)(_remainder_like("fmod"))
tile_kernel(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor, static=True)(
    _remainder_like("remainder"))


# ---------------------------------------------------------------------------------------------
# Unary: activation tables on the Scalar engine; exact integer forms on GpSimd
# ---------------------------------------------------------------------------------------------

_UNARY = {
    "exp": aten.exp.default, "exp2": aten.exp2.default, "expm1": aten.expm1.default,
    "log": aten.log.default, "log2": aten.log2.default, "log10": aten.log10.default,
    "log1p": aten.log1p.default, "tanh": aten.tanh.default, "sigmoid": aten.sigmoid.default,
    "sqrt": aten.sqrt.default, "rsqrt": aten.rsqrt.default, "reciprocal": aten.reciprocal.default,
    "sin": aten.sin.default, "cos": aten.cos.default, "tan": aten.tan.default,
    "asin": aten.asin.default, "acos": aten.acos.default, "atan": aten.atan.default,
    "sinh": aten.sinh.default, "cosh": aten.cosh.default, "asinh": aten.asinh.default,
    "acosh": aten.acosh.default, "atanh": aten.atanh.default, "erf": aten.erf.default,
    "erfc": aten.erfc.default, "erfinv": aten.erfinv.default, "floor": aten.floor.default,
    "ceil": aten.ceil.default, "round": aten.round.default, "trunc": aten.trunc.default,
    "frac": aten.frac.default, "sign": aten.sign.default, "silu": aten.silu.default,
    "mish": aten.mish.default, "isnan": aten.isnan.default, "logical_not": aten.logical_not.default,
    "signbit": aten.signbit.default, "lgamma": aten.lgamma.default, "digamma": aten.digamma.default,
    "i0": aten.i0.default, "sinc": aten.sinc.default, "deg2rad": aten.deg2rad.default,
    "rad2deg": aten.rad2deg.default, "hardsigmoid": aten.hardsigmoid.default,
    "hardswish": aten.hardswish.default, "log_sigmoid": None,
}
#: On integer inputs these stay exact integers (GpSimd), not a float activation.
_INTEGER_FORMS = {"neg": ("multiply", -1), "relu": ("maximum", 0)}


def unary(k: Kernel, out: OutSpec, x: np.ndarray, func: str, **kwargs: Any) -> np.ndarray:
    result = hbm_empty(out)

    def compute(dst: Tile, srcs: list[Tile]) -> None:
        src = srcs[0]
        if src.shape != dst.shape:  # a one-element input
            src = src[:, : dst.shape[1]]
        k.activation(dst, src, func, **kwargs)

    return map_flat(k, result, [x], compute)


def _register_unary(func: str, op: Any) -> None:
    def body(k: Kernel, out: list[OutSpec], x: np.ndarray) -> np.ndarray:
        return unary(k, out[0], x, func)

    body.__name__ = func
    tile_kernel(op, static=True)(body)


for _func, _op in _UNARY.items():
    if _op is not None:
        _register_unary(_func, _op)


def _integer_or_activation(func: str):
    def body(k: Kernel, out: list[OutSpec], x: np.ndarray) -> np.ndarray:
        if x.dtype.kind in "iub":
            op, operand = _INTEGER_FORMS[func]
            return binary(k, out[0], x, operand, op)
        return unary(k, out[0], x, func)

    body.__name__ = func
    return body


tile_kernel(aten.neg.default, static=True)(_integer_or_activation("neg"))
tile_kernel(aten.relu.default, static=True)(_integer_or_activation("relu"))


@tile_kernel(aten.abs.default, static=True)
def abs_(k: Kernel, out: list[OutSpec], x: np.ndarray) -> np.ndarray:
    if x.dtype.kind == "u":  # max(x, -x) would compare with the wrapped negation
        result = hbm_empty(out[0])

        def compute(dst: Tile, srcs: list[Tile]) -> None:
            k.tensor_copy(dst, srcs[0])

        return map_flat(k, result, [x], compute)
    if x.dtype.kind == "i":
        result = hbm_empty(out[0])

        def compute(dst: Tile, srcs: list[Tile]) -> None:
            k.tensor_scalar(dst, srcs[0], "multiply", -1)
            k.tensor_tensor(dst, dst, srcs[0], "maximum")

        return map_flat(k, result, [x], compute)
    if x.dtype == np.bool_:
        return binary(k, out[0], x, 0, "not_equal")
    return unary(k, out[0], x, "abs")


@tile_kernel(aten.bitwise_not.default, static=True)
def bitwise_not(k: Kernel, out: list[OutSpec], x: np.ndarray) -> np.ndarray:
    """``~x``: logical not of a bool, an exclusive or with all ones (-1) of an integer on
    GpSimd's integer lanes (-1 converted to the dtype as PyTorch converts it: uint8's 255)."""
    if x.dtype == np.bool_:
        return binary(k, out[0], x, False, "equal")
    if x.dtype.kind != "i" and x.dtype != np.uint8:
        # CPU's kernel has no floating or wider unsigned form: its error, through the fallback.
        raise KernelDeclined(f"neuron bitwise_not: no {x.dtype} form")
    return binary(k, out[0], x, -1, "bitwise_xor")


@tile_kernel(aten.gelu.default, static=True)
def gelu(k: Kernel, out: list[OutSpec], x: np.ndarray, *, approximate: str = "none") -> np.ndarray:
    return unary(k, out[0], x, "gelu_tanh" if approximate == "tanh" else "gelu")


# ---------------------------------------------------------------------------------------------
# Selection and clamping
# ---------------------------------------------------------------------------------------------


@tile_kernel(aten.where.self, static=True)
def where(k: Kernel, out: list[OutSpec], cond: np.ndarray, x: Any, y: Any) -> np.ndarray:
    result = hbm_empty(out[0])
    arrays = [cond] + [v for v in (x, y) if _is_array(v)]

    def compute(dst: Tile, srcs: list[Tile]) -> None:
        it = iter(srcs)
        mask = next(it)
        a = next(it) if _is_array(x) else x
        b = next(it) if _is_array(y) else y
        mask = _full(k, mask, dst)
        a = _full(k, a, dst) if isinstance(a, Tile) else a
        b = _full(k, b, dst) if isinstance(b, Tile) else b
        k.select(dst, mask, a, b)

    return map_flat(k, result, arrays, compute)


@tile_kernel(aten.masked_fill.Scalar, aten.masked_fill.Tensor, static=True)
def masked_fill(k: Kernel, out: list[OutSpec], x: np.ndarray, mask: np.ndarray, value: Any) -> np.ndarray:
    """``where(mask, value, x)`` (VectorE select); the in-place form is derived from it."""
    return where(k, out, mask, value, x)


def _full(k: Kernel, tile: Tile, like: Tile) -> Tile:
    """A per-partition scalar tile widened to ``like``'s free size (a Vector-engine copy)."""
    if tile.shape == like.shape:
        return tile
    wide = k.sbuf(like.shape, tile.dtype, tile.name + "_wide")
    k.tensor_scalar(wide, _zeros_like(k, wide), "add", tile)
    return wide


def _zeros_like(k: Kernel, tile: Tile) -> Tile:
    zeros = k.sbuf(tile.shape, tile.dtype, "zeros")
    k.memset(zeros, 0)
    return zeros


@tile_kernel(aten.clamp.default, static=True)
def clamp(k: Kernel, out: list[OutSpec], x: np.ndarray, min: Any = None, max: Any = None) -> np.ndarray:
    """The bounds are converted to the result's type first, as PyTorch does (a uint8 tensor's
    bound -1 is 255)."""
    result = hbm_empty(out[0])
    min, max = (None if v is None else nx.element(v, result.dtype) for v in (min, max))

    def compute(dst: Tile, srcs: list[Tile]) -> None:
        src = srcs[0] if srcs[0].shape == dst.shape else _full(k, srcs[0], dst)
        k.tensor_copy(dst, src)
        if min is not None:
            k.tensor_scalar(dst, dst, "maximum", min)
        if max is not None:
            k.tensor_scalar(dst, dst, "minimum", max)

    return map_flat(k, result, [x], compute)


@tile_kernel(aten.clamp.Tensor, static=True)
def clamp_tensor(k: Kernel, out: list[OutSpec], x: np.ndarray, min: Any = None, max: Any = None) -> np.ndarray:
    result = hbm_empty(out[0])
    arrays = [x] + [v for v in (min, max) if v is not None]

    def compute(dst: Tile, srcs: list[Tile]) -> None:
        it = iter(srcs)
        k.tensor_copy(dst, _full(k, next(it), dst))
        if min is not None:
            _apply_binary(k, dst, dst, next(it), "maximum")
        if max is not None:
            _apply_binary(k, dst, dst, next(it), "minimum")

    return map_flat(k, result, arrays, compute)


# ---------------------------------------------------------------------------------------------
# Fused multiply-add forms
# ---------------------------------------------------------------------------------------------


@tile_kernel(aten.addr.default, static=True)
def addr(k: Kernel, out: list[OutSpec], x: np.ndarray, vec1: np.ndarray, vec2: np.ndarray, *,
         beta: Any = 1, alpha: Any = 1) -> np.ndarray:
    """``beta * x + alpha * outer(vec1, vec2)`` in one Vector-engine pass: the vectors broadcast
    by their DMA access patterns, the products and the sum stay in fp32 and round once into a
    bfloat16/float16 result (op by op, each product and sum rounded to bfloat16 first: 0.03 off
    at 0.13). As on the CPU, ``beta == 0`` ignores ``x`` (NaN included); a bool result is
    ``(beta and x) or (alpha and vec1 and vec2)``."""
    result = hbm_empty(out[0])
    n, m = out[0].shape
    boolean = result.dtype == np.bool_
    work = chip_dtype(result.dtype) if boolean or result.dtype.kind in "iu" else np.dtype(np.float32)
    use_x = bool(beta) if boolean else beta != 0
    arrays = ([x] if use_x else []) + [vec1.reshape(n, 1), vec2.reshape(1, m)]

    def compute(dst: Tile, srcs: list[Tile]) -> None:
        *first, a, b = srcs
        product = k.sbuf(dst.shape, work, "outer")
        if boolean:
            _apply_binary(k, product, _full(k, a, dst), b, "logical_and")
            if not alpha:
                k.memset(product, 0)
            if use_x:
                _apply_binary(k, dst, product, first[0], "logical_or")
            else:
                k.tensor_copy(dst, product)
            return
        # CPU's float32 kernel: x * beta + alpha * vec1 * vec2, in that association.
        k.tensor_scalar(product, _full(k, a, dst), "multiply", alpha)
        _apply_binary(k, product, product, b, "multiply")
        if not use_x:
            k.tensor_copy(dst, product)
            return
        scaled = first[0]
        if beta != 1:
            scaled = k.sbuf(dst.shape if first[0].shape == dst.shape else first[0].shape, work, "scaled")
            k.tensor_scalar(scaled, first[0], "multiply", beta)
        _apply_binary(k, dst, product, scaled, "add")

    return map_flat(k, result, arrays, compute)


# ---------------------------------------------------------------------------------------------
# Bit shifts (GpSimd's integer lanes)
# ---------------------------------------------------------------------------------------------


def _shift(direction: str):
    """``x << y`` or ``x >> y`` in the result's integer type, as PyTorch defines a shift by an
    amount the type cannot shift by (negative, or at least its width): a left shift gives 0, a
    right shift the sign fill (``x >> (width - 1)``; 0 for an unsigned type)."""
    op = "left_shift" if direction == "left" else "right_shift"

    def body(k: Kernel, out: list[OutSpec], x: Any, y: Any) -> np.ndarray:
        dtype = nx.numpy_dtype(out[0].dtype)
        if dtype.kind not in "iu" or any(_is_array(v) and v.dtype.kind not in "iu" for v in (x, y)):
            # CPU's kernel has no floating form (its error) and promotes bool its own way.
            raise KernelDeclined(f"neuron {op}: integer operands only, got {out[0].dtype}")
        width = dtype.itemsize * 8
        limit = width if direction == "left" or dtype.kind == "u" else width - 1
        if not _is_array(y):
            amount = int(y)
            if 0 <= amount < limit:
                return binary(k, out[0], x, amount, op)
            if direction == "left":
                return binary(k, out[0], x, 0, "multiply")
            return binary(k, out[0], x, limit, op)
        result = hbm_empty(out[0])
        arrays = [v for v in (x, y) if _is_array(v)]

        def compute(dst: Tile, srcs: list[Tile]) -> None:
            it = iter(srcs)
            a = next(it) if _is_array(x) else nx.element(x, dtype)
            amount = _full(k, next(it), dst)
            beyond = k.sbuf(dst.shape, np.uint8, "beyond")
            above = k.sbuf(dst.shape, np.uint8, "above")
            k.tensor_scalar(beyond, amount, "less", 0)
            k.tensor_scalar(above, amount, "greater_equal", limit)
            k.tensor_tensor(beyond, beyond, above, "logical_or")
            safe = k.sbuf(dst.shape, amount.dtype, "amount")
            k.select(safe, beyond, 0 if direction == "left" else limit, amount)
            _apply_binary(k, dst, _full(k, a, dst) if isinstance(a, Tile) else a, safe, op)
            if direction == "left":
                k.select(dst, beyond, 0, dst)

        return map_flat(k, result, arrays, compute)

    body.__name__ = f"{direction}_shift"
    return body


tile_kernel(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar,
            aten.bitwise_left_shift.Scalar_Tensor, aten.__lshift__.Tensor, aten.__lshift__.Scalar,
            aten.__ilshift__.Tensor, aten.__ilshift__.Scalar, static=True)(_shift("left"))
tile_kernel(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
            aten.bitwise_right_shift.Scalar_Tensor, aten.__rshift__.Tensor, aten.__rshift__.Scalar,
            aten.__irshift__.Tensor, aten.__irshift__.Scalar, static=True)(_shift("right"))


#: The result types CPU's add_relu kernel computes (it asserts on the others: its error, through
#: the fallback).
_ADD_RELU_TYPES = (torch.float32, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64)
_ADD_RELU_INPUTS = frozenset(str(t).removeprefix("torch.") for t in _ADD_RELU_TYPES)


@tile_kernel(aten._add_relu.Tensor, aten._add_relu.Scalar, static=True)
def add_relu(k: Kernel, out: list[OutSpec], x: Any, y: Any, *, alpha: Any = 1) -> np.ndarray:
    """``relu(x + alpha * y)`` in one pass, as the CPU's vectorized kernel computes it: a clamp
    to ``[0, the type's largest value]`` (an infinite sum gives float32's largest finite value;
    a NaN stays NaN, where the CPU's scalar tail for the last few elements would give 0)."""
    if out[0].dtype not in _ADD_RELU_TYPES:
        raise KernelDeclined(f"neuron _add_relu: the CPU kernel has no {out[0].dtype} form")
    if _is_array(x) and np.dtype(x.dtype).name not in _ADD_RELU_INPUTS:
        # The CPU checks self's type too (bool + 1.5 computes in float32, and still asserts).
        raise KernelDeclined(f"neuron _add_relu: the CPU kernel has no {np.dtype(x.dtype).name} form")
    result = hbm_empty(out[0])
    arrays = [v for v in (x, y) if _is_array(v)]
    largest = float(np.finfo(np.float32).max) if out[0].dtype.is_floating_point else None

    def compute(dst: Tile, srcs: list[Tile]) -> None:
        it = iter(srcs)
        a = next(it) if _is_array(x) else x
        b = next(it) if _is_array(y) else y
        _apply_binary(k, dst, a, _scaled(k, b, alpha, dst), "add")
        k.tensor_scalar(dst, dst, "maximum", 0)
        if largest is not None:
            k.tensor_scalar(dst, dst, "minimum", largest)

    return map_flat(k, result, arrays, compute)


meta_twin(aten._add_relu.Tensor, aten.add.Tensor)
meta_twin(aten._add_relu.Scalar, aten.add.Scalar)
