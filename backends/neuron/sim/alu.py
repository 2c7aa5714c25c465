"""Engine arithmetic: what the ALUs and the activation tables compute, and the int32 rule.

The Vector and GpSimd engines apply :data:`BINARY_OPS` and :data:`REDUCE_OPS` elementwise; the
Scalar engine evaluates :data:`ACTIVATIONS` in fp32 (CPU torch stands in for the hardware's
activation tables, so results are IEEE fp32, not bit-exact to them).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from accelkit_backends.neuron.sim.errors import NeuronDtypeError

_INT32 = np.iinfo(np.int32)


def _maximum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """NaN propagates; of two equal values (-0.0 and +0.0) the first, as PyTorch's maximum,
    clamp and relu give it (numpy's maximum gives the second)."""
    return np.where(a == b, a, np.maximum(a, b))


def _minimum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(a == b, a, np.minimum(a, b))


def _power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """numpy's power, except that an integer raised to a negative integer is PyTorch's
    ``1 / a**-b`` in integers (0 unless ``a`` is 1 or -1), where numpy refuses; and that a
    negative float base's power is its magnitude's with the sign of an odd integer exponent
    (NaN for a non-integer one), so that ``(-a)**n == -(a**n)`` for an odd ``n`` to the bit on
    every host: numpy's AVX-512 float32 power does not keep that symmetry, glibc's does."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "f" and np.any(np.signbit(a)):
        return _signed_power(a, b)
    if a.dtype.kind not in "iu" or b.dtype.kind != "i" or not np.any(b < 0):
        return np.power(a, b)
    result = np.power(a, np.where(b < 0, 0, b).astype(b.dtype))
    minus_one = np.where(b % 2 == 0, 1, -1)
    reciprocal = np.where(a == 1, 1, np.where(a == -1, minus_one, 0))
    return np.where(b < 0, reciprocal, result).astype(result.dtype)


def _signed_power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    magnitude = np.power(np.abs(a), b)
    integral = np.floor(b) == b  # infinities count as even integers, as IEEE pow has them
    odd = integral & (np.floor(b * 0.5) * 2 != b)
    signed = np.where(odd, -magnitude, magnitude)
    return np.where(np.signbit(a), np.where(integral, signed, np.nan), magnitude).astype(magnitude.dtype)


BINARY_OPS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.true_divide,
    "maximum": _maximum, "minimum": _minimum, "pow": _power,
    "equal": np.equal, "not_equal": np.not_equal, "less": np.less, "less_equal": np.less_equal,
    "greater": np.greater, "greater_equal": np.greater_equal,
    "logical_and": np.logical_and, "logical_or": np.logical_or, "logical_xor": np.logical_xor,
    "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor,
    "left_shift": np.left_shift, "right_shift": np.right_shift,
    "fmod": np.fmod, "remainder": np.remainder, "atan2": np.arctan2,
    "floor_divide": np.floor_divide, "trunc_divide": lambda a, b: np.trunc(np.true_divide(a, b)),
    "copysign": np.copysign, "hypot": np.hypot,
    "nextafter": np.nextafter, "logaddexp": np.logaddexp,
}
REDUCE_OPS = {"add": np.add, "max": np.maximum, "min": np.minimum, "multiply": np.multiply,
              "logical_and": np.logical_and, "logical_or": np.logical_or}


def _activation_table() -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    F = torch.nn.functional
    table = {name: getattr(torch, name) for name in (
        "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "tanh", "sigmoid", "sqrt", "rsqrt",
        "reciprocal", "abs", "neg", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh",
        "asinh", "acosh", "atanh", "erf", "erfc", "erfinv", "sign", "floor", "ceil", "round",
        "trunc", "frac", "square", "relu", "lgamma", "digamma", "sinc", "deg2rad", "rad2deg",
    )}
    table.update(
        identity=lambda x: x, gelu=F.gelu, gelu_tanh=lambda x: F.gelu(x, approximate="tanh"),
        silu=F.silu, mish=F.mish, softplus=F.softplus, elu=F.elu, selu=F.selu, celu=F.celu,
        hardsigmoid=F.hardsigmoid, hardswish=F.hardswish, hardtanh=F.hardtanh,
        logsigmoid=F.logsigmoid, relu6=F.relu6, isnan=torch.isnan, isinf=torch.isinf,
        isfinite=torch.isfinite, logical_not=torch.logical_not, signbit=torch.signbit,
        i0=torch.i0, erfcx=torch.special.erfcx, ndtri=torch.special.ndtri,
    )
    return table


ACTIVATIONS = _activation_table()

#: Activations are evaluated on a length padded to a multiple of this: CPU torch computes the
#: tail past its last full vector on another path, which can differ in the last bit, so an
#: element's result would depend on where the tile put it.
_LANES = 64


def evaluate_activation(fn: Callable[[torch.Tensor], torch.Tensor], x: np.ndarray) -> np.ndarray:
    """``fn`` on fp32 ``x``, each element's result independent of its position in the tile
    (so a fused program, which tiles differently, gets eager's bits)."""
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    padded = np.zeros(-(-flat.size // _LANES) * _LANES, np.float32)
    padded[: flat.size] = flat
    return fn(torch.from_numpy(padded)).numpy()[: flat.size].reshape(x.shape)


def fp32(array: np.ndarray) -> np.ndarray:
    return array if array.dtype == np.float32 else array.astype(np.float32)


def check_int32(values: np.ndarray, where: str) -> None:
    if values.dtype.kind in "iu" and values.size:
        low, high = values.min(), values.max()
        if low < _INT32.min or high > _INT32.max:
            bad = low if low < _INT32.min else high
            raise NeuronDtypeError(
                f"{where}: integer value {int(bad)} does not fit the NeuronCore's 32-bit integer "
                "datapath (int64 is stored at full width but computed as int32, as neuronx-cc "
                "does by default). Keep integer values within int32, or compute this on the CPU."
            )
