"""Elementwise arithmetic, math, comparison, logical/bitwise and fill lowerings.

The machinery casts each result to PyTorch's dtype (from the op's Meta kernel), so these
lowerings only choose the precision to *compute* in, the way PyTorch's CPU kernels do:

- bfloat16/float16 math runs in float32 ("opmath") and is rounded once at the end;
- integer and bool inputs of ops with a floating result (``exp``, true division, ``atan2``)
  compute in float32, PyTorch's default dtype — never float64, which a TPU only emulates;
- a Python float beside integer tensors (``int_tensor * 2.5``) likewise makes the op float32.

Python floats arrive as weakly typed traced scalars and Python ints as static weak values, so
they never widen a tensor's dtype (PyTorch's "wrapped number" rule).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from accelkit_backends.tpu import checks
from accelkit_backends.tpu.lowering import lowering

aten = torch.ops.aten


# ---------------------------------------------------------------------------------------------
# Compute-precision helpers (traced)
# ---------------------------------------------------------------------------------------------


def _is_array(value: Any) -> bool:
    """A tensor operand (not a weakly typed Python scalar)."""
    return isinstance(value, jax.Array) and not jax.typeof(value).weak_type


def _is_float_dtype(dtype: Any) -> bool:
    return jnp.issubdtype(dtype, jnp.floating)


def _has_float_scalar(values: tuple) -> bool:
    return any(
        isinstance(v, float) or (isinstance(v, jax.Array) and not _is_array(v) and _is_float_dtype(v.dtype))
        for v in values
    )


def operands(*values: Any, floating: bool = False) -> list[Any]:
    """``values`` in the dtype PyTorch computes them in (see the module docstring).

    With ``floating`` (or when any operand is floating) every tensor operand narrower than
    float32 — bool, integers, bfloat16, float16 — becomes float32; float64 tensors (emulated
    float64 mode) keep float64. 0-d tensors (CPU scalars) follow the dimensioned tensors.
    Otherwise (integer/bool arithmetic) the operands are returned unchanged.
    """
    arrays = [v for v in values if _is_array(v)]
    dimensioned = [a for a in arrays if a.ndim] or arrays
    if any(jnp.iscomplexobj(a) for a in arrays):  # complex stays complex, at the widest width
        wide = jnp.complex128 if any(a.dtype == jnp.complex128 for a in arrays) else jnp.complex64
        return [v.astype(wide) if _is_array(v) and v.dtype != wide else v for v in values]
    if not (floating or _has_float_scalar(values) or any(_is_float_dtype(a.dtype) for a in arrays)):
        return list(values)
    wide = jnp.float64 if any(a.dtype == jnp.float64 for a in dimensioned) else jnp.float32
    return [v.astype(wide) if _is_array(v) and v.dtype != wide else v for v in values]


def compare_operands(*values: Any) -> list[Any]:
    """Operands of a comparison: compared in their common dtype, as PyTorch does (a bfloat16
    tensor against 0.1 compares with 0.1 rounded to bfloat16) — except that integer tensors
    beside a Python float compare in float32, not JAX's float64."""
    arrays = [v for v in values if _is_array(v)]
    if _has_float_scalar(values) and not any(_is_float_dtype(a.dtype) for a in arrays):
        return [v.astype(jnp.float32) if _is_array(v) else v for v in values]
    return list(values)


def _reduced_float_dtype(*values: Any) -> Any:
    """bfloat16 or float16 when the tensor operands promote to it (PyTorch then computes some
    ops' steps in it), else None."""
    arrays = [v for v in values if _is_array(v)]
    if not arrays:
        return None
    common = jnp.result_type(*(a.dtype for a in arrays))
    return common if common in (jnp.bfloat16, jnp.float16) else None


def _float(x: jax.Array) -> jax.Array:
    return operands(x, floating=True)[0]


def _scaled(y: Any, alpha: Any) -> Any:
    """``y * alpha``, skipping the multiply for the (static) default ``alpha=1``."""
    if isinstance(alpha, bool | int) and alpha == 1:
        return y
    return y * alpha


# ---------------------------------------------------------------------------------------------
# Arithmetic
# ---------------------------------------------------------------------------------------------


@lowering(aten.add.Tensor, aten.add.Scalar)
def add(x, y, alpha=1):
    x, y, alpha = operands(x, y, alpha)
    return x + _scaled(y, alpha)


@lowering(aten.sub.Tensor, aten.sub.Scalar)
def sub(x, y, alpha=1):
    x, y, alpha = operands(x, y, alpha)
    return x - _scaled(y, alpha)


@lowering(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(x, y, alpha=1):
    x, y, alpha = operands(x, y, alpha)
    return y - _scaled(x, alpha)


@lowering(aten.mul.Tensor, aten.mul.Scalar)
def mul(x, y):
    x, y = operands(x, y)
    return x * y


def _trunc_divide(x, y):
    """C-style integer division (rounds toward zero)."""
    q = jnp.floor_divide(x, y)
    inexact = (q * y) != x
    return jnp.where(inexact & ((x < 0) != (y < 0)), q + 1, q)


def _ieee_divisor(x, y):
    """The divisor of a real floating division, as XLA will divide by it. XLA rewrites a
    division by a broadcast divisor (a scalar, a size-1 dimension) into a multiplication by
    its reciprocal, an ulp off IEEE division (2.7 / 2.7 is 0.99999994, so a quotient truncated
    or floored is one off); CPU divides. Materialised behind an optimisation barrier, the
    divisor is divided by: one more pass over the result's size."""
    shape = jnp.broadcast_shapes(jnp.shape(x), jnp.shape(y))
    if jnp.shape(y) == shape or jnp.iscomplexobj(y) or jnp.iscomplexobj(x):
        return y
    dtype = jnp.result_type(x, y)
    return jax.lax.optimization_barrier(jnp.broadcast_to(jnp.asarray(y, dtype), shape))


def _floor_divide_float(x, y):
    """PyTorch's ``div_floor_floating``: Python's float floor division, IEEE on division by 0."""
    quotient = x / y
    mod = jnp.fmod(x, y)
    div = (x - mod) / y
    div = jnp.where((mod != 0) & ((y < 0) != (mod < 0)), div - 1, div)
    floored = jnp.floor(div)
    floored = jnp.where(div - floored > 0.5, floored + 1, floored)
    floored = jnp.where(div == 0, jnp.copysign(jnp.zeros_like(div), quotient), floored)
    return jnp.where(y == 0, quotient, floored)


def _integer_division(x, y, result):
    """``result`` of dividing ``x`` by ``y``, refused with CPU's error when the division is an
    integer one and the divisor has a zero (a device-side check: integer division by zero has
    no value); the in-place form then keeps ``x`` as it was."""
    if not jnp.issubdtype(result.dtype, jnp.integer) or result.size == 0:
        return result
    ok = jnp.all(y != 0) if _is_array(y) else y != 0
    checks.require(ok, RuntimeError, "ZeroDivisionError")
    return checks.unchanged_unless(ok, result, x) if _is_array(x) else result


@lowering(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode)
def div(x, y, rounding_mode=None):
    if rounding_mode is None:
        x, y = operands(x, y, floating=True)
        return x / _ieee_divisor(x, y)
    # A single-element divisor is a scalar to CPU's kernel, which divides by it in float32.
    narrow = _reduced_float_dtype(x, y) if jnp.size(y) != 1 else None
    x, y = operands(x, y)
    if _is_float_dtype(x.dtype):
        y = _ieee_divisor(x, y)
    if rounding_mode == "trunc":
        if not _is_float_dtype(x.dtype):
            return _integer_division(x, y, _trunc_divide(x, y))
        # CPU rounds a bfloat16/float16 quotient to its dtype before truncating it (17.99 is
        # 18 in bfloat16, so 18, where truncating in float32 gives 17).
        quotient = x / y
        if narrow is not None:
            quotient = quotient.astype(narrow)
        return jnp.trunc(quotient)
    if rounding_mode == "floor":
        if _is_float_dtype(x.dtype):
            return _floor_divide_float(x, y)
        return _integer_division(x, y, jnp.floor_divide(x, y))
    raise ValueError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '{rounding_mode}'")


@lowering(aten.floor_divide.default, aten.floor_divide_.Tensor, aten.floor_divide.Scalar)
def floor_divide(x, y):
    """``x // y``. Registered for the in-place overload too: ``floor_divide_.Tensor`` has no
    functional overload of its name to be derived from."""
    return div(x, y, rounding_mode="floor")


@lowering(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def remainder(x, y):
    x, y = operands(x, y)
    return _integer_division(x, y, jnp.remainder(x, y))


@lowering(aten.fmod.Tensor, aten.fmod.Scalar)
def fmod(x, y):
    x, y = operands(x, y)
    return _integer_division(x, y, jnp.fmod(x, y))


@lowering(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
def pow_(base, exponent):
    base, exponent = operands(base, exponent)
    result = jnp.power(base, exponent)  # a static int exponent becomes repeated multiplication
    if _is_array(exponent) and jnp.issubdtype(result.dtype, jnp.integer) and jnp.issubdtype(exponent.dtype, jnp.signedinteger):
        # XLA's integer power is undefined below exponent 0. PyTorch's is 1 / base**-e in
        # integers: 0, except 1 for base 1 and +-1 for base -1.
        base = jnp.asarray(base, result.dtype)
        minus_one = jnp.where(exponent % 2 == 0, 1, -1).astype(result.dtype)
        reciprocal = jnp.where(base == 1, 1, jnp.where(base == -1, minus_one, 0)).astype(result.dtype)
        result = jnp.where(exponent < 0, reciprocal, result)
    return result


@lowering(aten.addcmul.default)
def addcmul(x, tensor1, tensor2, value=1):
    x, tensor1, tensor2, value = operands(x, tensor1, tensor2, value)
    return x + _scaled(tensor1, value) * tensor2


@lowering(aten.addcdiv.default)
def addcdiv(x, tensor1, tensor2, value=1):
    x, tensor1, tensor2, value = operands(x, tensor1, tensor2, value, floating=True)
    return x + _scaled(tensor1, value) / tensor2


@lowering(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(x, end, weight):
    """PyTorch's two-sided formula: exact at both ends of the interval."""
    x, end, weight = operands(x, end, weight, floating=True)
    small = jnp.abs(weight) < 0.5
    return jnp.where(small, x + weight * (end - x), end - (end - x) * (1 - weight))


# ---------------------------------------------------------------------------------------------
# Unary math
# ---------------------------------------------------------------------------------------------


@lowering(aten.neg.default)
def neg(x):
    return -x


@lowering(aten.abs.default)
def abs_(x):
    return x if x.dtype == jnp.bool_ else jnp.abs(x)


@lowering(aten.sign.default, aten.sgn.default)
def sign(x):
    if x.dtype == jnp.bool_:
        return x
    if jnp.iscomplexobj(x):
        # sgn(z) = z / |z|, and 0 at 0 (comparisons would order complex values by real part).
        magnitude = jnp.abs(x)
        return jnp.where(magnitude == 0, jnp.zeros_like(x), x / magnitude.astype(x.dtype))
    # PyTorch's sign of NaN is 0 (jnp.sign keeps NaN).
    return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)


@lowering(aten.reciprocal.default)
def reciprocal(x):
    x = _float(x)
    return 1 / x


def _unary_float(op: Any, fn: Any) -> None:
    """Register ``fn`` (a jnp function) as the float-math lowering of ``op``."""

    def lowered(x):
        return fn(_float(x))

    lowered.__name__ = lowered.__qualname__ = f"{str(op).split('.')[1]}_float"
    lowering(op)(lowered)


for _op, _fn in [
    (aten.sqrt.default, jnp.sqrt),
    (aten.rsqrt.default, jax.lax.rsqrt),
    (aten.exp.default, jnp.exp),
    (aten.exp2.default, jnp.exp2),
    (aten.expm1.default, jnp.expm1),
    (aten.log.default, jnp.log),
    (aten.log2.default, jnp.log2),
    (aten.log10.default, jnp.log10),
    (aten.log1p.default, jnp.log1p),
    (aten.sin.default, jnp.sin),
    (aten.cos.default, jnp.cos),
    (aten.tan.default, jnp.tan),
    (aten.asin.default, jnp.arcsin),
    (aten.acos.default, jnp.arccos),
    (aten.atan.default, jnp.arctan),
    (aten.sinh.default, jnp.sinh),
    (aten.cosh.default, jnp.cosh),
    (aten.tanh.default, jnp.tanh),
    (aten.asinh.default, jnp.arcsinh),
    (aten.acosh.default, jnp.arccosh),
    (aten.atanh.default, jnp.arctanh),
    (aten.erf.default, jax.lax.erf),
    (aten.erfc.default, jax.lax.erfc),
    (aten.erfinv.default, jax.lax.erf_inv),
]:
    _unary_float(_op, _fn)
del _op, _fn


@lowering(aten.atan2.default)
def atan2(y, x):
    y, x = operands(y, x, floating=True)
    return jnp.arctan2(y, x)


@lowering(aten.hypot.default)
def hypot(x, y):
    x, y = operands(x, y, floating=True)
    return jnp.hypot(x, y)


@lowering(aten.copysign.Tensor, aten.copysign.Scalar)
def copysign(x, y):
    x, y = operands(x, y, floating=True)
    return jnp.copysign(x, y)


@lowering(aten.signbit.default)
def signbit(x):
    if x.dtype == jnp.bool_:
        return jnp.zeros(x.shape, jnp.bool_)
    return jnp.signbit(x) if _is_float_dtype(x.dtype) else x < 0


@lowering(aten.frexp.Tensor)
def frexp(x):
    """(mantissa, exponent) with ``x == mantissa * 2 ** exponent``, ``0.5 <= |mantissa| < 1``;
    zeros, infinities and NaN give themselves and exponent 0. Subnormals are decomposed from
    their bits: XLA's CPU platform flushes them to zero in arithmetic (``jnp.frexp`` alone
    returns exponent -149 for every float32 subnormal)."""
    info = jnp.finfo(x.dtype)
    mantissa, exponent = jnp.frexp(x)
    bits = jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{info.bits}"))
    fraction = bits & ((1 << info.nmant) - 1)
    compute = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    # A subnormal is fraction * 2 ** (minexp - nmant); fraction converts to float exactly.
    sub_mantissa, sub_exponent = jnp.frexp(fraction.astype(compute))
    subnormal = (jnp.abs(x) < info.tiny) & (fraction != 0)
    mantissa = jnp.where(subnormal, jnp.where(jnp.signbit(x), -sub_mantissa, sub_mantissa).astype(x.dtype),
                         mantissa)
    exponent = jnp.where(subnormal, sub_exponent + (info.minexp - info.nmant), exponent)
    return mantissa, exponent.astype(jnp.int32)


@lowering(aten.nextafter.default)
def nextafter(x, y):
    """The next representable value after ``x`` towards ``y`` (subnormals included), stepping
    in the operands' own dtype: a bfloat16 step is a bfloat16 ulp, so no float32 opmath here."""
    dtype = jnp.promote_types(x.dtype, y.dtype)
    return jnp.nextafter(x.astype(dtype), y.astype(dtype))


# Rounding is exact in any float dtype, and the identity on integers.


@lowering(aten.floor.default)
def floor(x):
    return jnp.floor(x) if _is_float_dtype(x.dtype) else x


@lowering(aten.ceil.default)
def ceil(x):
    return jnp.ceil(x) if _is_float_dtype(x.dtype) else x


@lowering(aten.trunc.default)
def trunc(x):
    return jnp.trunc(x) if _is_float_dtype(x.dtype) else x


@lowering(aten.frac.default)
def frac(x):
    return x - jnp.trunc(x)


@lowering(aten.round.default, aten.round.decimals)
def round_(x, decimals=0):
    """Half to even; with ``decimals``, PyTorch's scale-round-unscale in the tensor's dtype."""
    if not _is_float_dtype(x.dtype):
        return x
    if decimals > 0:
        scale = np.asarray(10.0**decimals, x.dtype)
        return jnp.round(x * scale) / scale
    if decimals < 0:
        scale = np.asarray(10.0**-decimals, x.dtype)
        return jnp.round(x / scale) * scale
    return jnp.round(x)


# ---------------------------------------------------------------------------------------------
# Clamping, extrema, selection
# ---------------------------------------------------------------------------------------------


def larger(x, y):
    """PyTorch's maximum on arrays of one dtype: NaN propagates, and of two equal values
    (-0.0 and +0.0) the first is kept, where XLA's max gives +0.0."""
    return jnp.where((y != y) | (x < y), y, x)


def smaller(x, y):
    """PyTorch's minimum: NaN propagates, of two equal values the first (XLA's min: -0.0)."""
    return jnp.where((y != y) | (y < x), y, x)


def _clamp(x, lo, hi):
    x, lo, hi = operands(x, lo, hi)
    if lo is not None:
        x = larger(x, lo)
    if hi is not None:
        x = smaller(x, hi)
    return x


@lowering(aten.clamp.default, aten.clamp.Tensor)
def clamp(x, min=None, max=None):
    return _clamp(x, min, max)


@lowering(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(x, min):
    return _clamp(x, min, None)


@lowering(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(x, max):
    return _clamp(x, None, max)


@lowering(aten.minimum.default)
def minimum(x, y):
    return smaller(*operands(x, y))


@lowering(aten.maximum.default)
def maximum(x, y):
    return larger(*operands(x, y))


# fmin and fmax ignore NaN; of two equal values they too keep the first, as the CPU's float32
# kernels do.


@lowering(aten.fmin.default)
def fmin(x, y):
    x, y = operands(x, y)
    return jnp.where((x != x) | (y < x), y, x)


@lowering(aten.fmax.default)
def fmax(x, y):
    x, y = operands(x, y)
    return jnp.where((x != x) | (x < y), y, x)


@lowering(aten.where.self)
def where(condition, x, y):
    return jnp.where(condition.astype(jnp.bool_), x, y)


@lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(x, mask, value):
    value = jnp.asarray(value).astype(x.dtype)
    return jnp.where(mask.astype(jnp.bool_), value, x)


@lowering(aten.nan_to_num.default)
def nan_to_num(x, nan=None, posinf=None, neginf=None):
    if not _is_float_dtype(x.dtype):
        return x
    info = jnp.finfo(x.dtype)
    x = jnp.where(jnp.isnan(x), jnp.asarray(0.0 if nan is None else nan).astype(x.dtype), x)
    x = jnp.where(x == jnp.inf, jnp.asarray(info.max if posinf is None else posinf).astype(x.dtype), x)
    return jnp.where(x == -jnp.inf, jnp.asarray(info.min if neginf is None else neginf).astype(x.dtype), x)


# ---------------------------------------------------------------------------------------------
# Comparisons and classification
# ---------------------------------------------------------------------------------------------


def _comparison(ops: tuple, compare: Any, name: str) -> None:
    def lowered(x, y):
        x, y = compare_operands(x, y)
        return compare(x, y)

    lowered.__name__ = lowered.__qualname__ = name
    lowering(*ops)(lowered)


for _name, _compare in [("eq", jnp.equal), ("ne", jnp.not_equal), ("lt", jnp.less),
                        ("le", jnp.less_equal), ("gt", jnp.greater), ("ge", jnp.greater_equal)]:
    _packet = getattr(aten, _name)
    _comparison((_packet.Tensor, _packet.Scalar), _compare, _name)
del _name, _compare, _packet


@lowering(aten.isnan.default)
def isnan(x):
    return jnp.isnan(x) if _is_float_dtype(x.dtype) else jnp.zeros(x.shape, jnp.bool_)


@lowering(aten.isinf.default)
def isinf(x):
    return jnp.isinf(x) if _is_float_dtype(x.dtype) else jnp.zeros(x.shape, jnp.bool_)


@lowering(aten.isposinf.default)
def isposinf(x):
    return x == jnp.inf if _is_float_dtype(x.dtype) else jnp.zeros(x.shape, jnp.bool_)


@lowering(aten.isneginf.default)
def isneginf(x):
    return x == -jnp.inf if _is_float_dtype(x.dtype) else jnp.zeros(x.shape, jnp.bool_)


# ---------------------------------------------------------------------------------------------
# Logical and bitwise
# ---------------------------------------------------------------------------------------------


def _truth(x: Any) -> Any:
    return jnp.asarray(x).astype(jnp.bool_)


@lowering(aten.logical_and.default)
def logical_and(x, y):
    return _truth(x) & _truth(y)


@lowering(aten.logical_or.default)
def logical_or(x, y):
    return _truth(x) | _truth(y)


@lowering(aten.logical_xor.default)
def logical_xor(x, y):
    return _truth(x) ^ _truth(y)


@lowering(aten.logical_not.default)
def logical_not(x):
    return ~_truth(x)


@lowering(aten.bitwise_and.Tensor, aten.bitwise_and.Scalar, aten.bitwise_and.Scalar_Tensor)
def bitwise_and(x, y):
    return jnp.bitwise_and(x, y)


@lowering(aten.bitwise_or.Tensor, aten.bitwise_or.Scalar, aten.bitwise_or.Scalar_Tensor)
def bitwise_or(x, y):
    return jnp.bitwise_or(x, y)


@lowering(aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar, aten.bitwise_xor.Scalar_Tensor)
def bitwise_xor(x, y):
    return jnp.bitwise_xor(x, y)


@lowering(aten.bitwise_not.default)
def bitwise_not(x):
    return ~x


# XLA's shifts give PyTorch's results for out-of-range amounts too: 0 for left shifts,
# sign fill for (arithmetic) right shifts of signed values.


@lowering(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar,
          aten.bitwise_left_shift.Scalar_Tensor, aten.__lshift__.Tensor, aten.__lshift__.Scalar)
def left_shift(x, y):
    return jnp.left_shift(x, y)


@lowering(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
          aten.bitwise_right_shift.Scalar_Tensor, aten.__rshift__.Tensor, aten.__rshift__.Scalar)
def right_shift(x, y):
    return jnp.right_shift(x, y)


# ---------------------------------------------------------------------------------------------
# Filling
# ---------------------------------------------------------------------------------------------


@lowering(aten.fill.Tensor)
@lowering(aten.fill.Scalar, ignores_contents=True)
def fill(x, value):
    return jnp.broadcast_to(jnp.asarray(value).astype(x.dtype), x.shape)


@lowering(aten.zero.default, ignores_contents=True)
def zero(x):
    return jnp.zeros_like(x)
