"""Trainium numerics: dtypes, the fp32 compute rule and rounding (nearest-even or stochastic).

The engines compute in fp32 and round when they write a narrower tile (N-arch2: "arithmetic in
FP32, casts free"; N-ndt). Rounding to bf16/fp8 is round-to-nearest-even unless stochastic
rounding is on — the hardware's switch is ``NEURON_RT_STOCHASTIC_ROUNDING_EN`` (N-round); here it
is ``ACCELKIT_NEURON_STOCHASTIC_ROUNDING=1`` or the :func:`stochastic_rounding` context manager.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import torch

STOCHASTIC_ENV = "ACCELKIT_NEURON_STOCHASTIC_ROUNDING"

TORCH_TO_NUMPY = {
    torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64),
    torch.float16: np.dtype(np.float16), torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
    torch.float8_e4m3fn: np.dtype(ml_dtypes.float8_e4m3fn),
    torch.float8_e5m2: np.dtype(ml_dtypes.float8_e5m2),
    torch.int8: np.dtype(np.int8), torch.uint8: np.dtype(np.uint8),
    torch.int16: np.dtype(np.int16), torch.uint16: np.dtype(np.uint16),
    torch.int32: np.dtype(np.int32), torch.uint32: np.dtype(np.uint32),
    torch.int64: np.dtype(np.int64), torch.uint64: np.dtype(np.uint64),
    torch.bool: np.dtype(np.bool_),
    torch.complex64: np.dtype(np.complex64), torch.complex128: np.dtype(np.complex128),
}
NUMPY_TO_TORCH = {v: k for k, v in TORCH_TO_NUMPY.items()}
#: numpy cannot hand these to torch directly: host copies go through same-width integers.
HOST_CARRIER = {
    np.dtype(ml_dtypes.bfloat16): torch.int16,
    np.dtype(ml_dtypes.float8_e4m3fn): torch.uint8,
    np.dtype(ml_dtypes.float8_e5m2): torch.uint8,
}

_LOW_PRECISION = frozenset({
    np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2),
    np.dtype(np.float16),
})


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    try:
        return TORCH_TO_NUMPY[dtype]
    except KeyError:
        raise TypeError(f"{dtype} has no NeuronCore representation") from None


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    return NUMPY_TO_TORCH[np.dtype(dtype)]


def to_torch(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor with the array's values (a copy)."""
    array = np.ascontiguousarray(array).reshape(np.shape(array))  # ascontiguousarray makes 0-d 1-d
    carrier = HOST_CARRIER.get(array.dtype)
    if carrier is None:
        return torch.from_numpy(array.copy())
    bits = array.view(np.int16 if carrier == torch.int16 else np.uint8)
    return torch.from_numpy(bits.copy()).view(torch_dtype(array.dtype))


def from_torch(tensor: torch.Tensor) -> np.ndarray:
    """A numpy array with a CPU tensor's values (a copy, same dtype)."""
    return view_torch(tensor.detach().contiguous()).copy()


def view_torch(tensor: torch.Tensor) -> np.ndarray:
    """A contiguous CPU tensor's memory as a numpy array of the same dtype (no copy)."""
    target = numpy_dtype(tensor.dtype)
    carrier = HOST_CARRIER.get(target)
    if carrier is None:
        return tensor.detach().numpy()
    return tensor.detach().view(carrier).numpy().view(target)


def is_float(dtype: np.dtype) -> bool:
    return np.dtype(dtype).kind == "f" or np.dtype(dtype) in _LOW_PRECISION


# ---------------------------------------------------------------------------------------------
# Rounding
# ---------------------------------------------------------------------------------------------

_state = threading.local()


def stochastic_rounding_enabled() -> bool:
    override = getattr(_state, "stochastic", None)
    if override is not None:
        return override
    return os.environ.get(STOCHASTIC_ENV, "0").strip() in ("1", "true", "on")


@contextlib.contextmanager
def stochastic_rounding(enabled: bool = True) -> Iterator[None]:
    """Round fp32 results to bf16 stochastically (``True``) or to nearest-even in this block."""
    previous = getattr(_state, "stochastic", None)
    _state.stochastic = enabled
    try:
        yield
    finally:
        _state.stochastic = previous


_rng = np.random.default_rng(0x5EED)


def _stochastic_bf16(values: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 with probability proportional to the distance to each neighbour."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    finite = np.isfinite(values)
    noise = _rng.integers(0, 1 << 16, size=bits.shape, dtype=np.uint32)
    rounded = np.where(finite, (bits + noise) & np.uint32(0xFFFF0000), bits)
    return rounded.view(np.float32).astype(ml_dtypes.bfloat16)


def round_to(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Write fp32 (or exact integer) engine results into a ``dtype`` tile, as the hardware rounds."""
    dtype = np.dtype(dtype)
    if values.dtype == dtype:
        return values
    if dtype == np.dtype(ml_dtypes.bfloat16) and stochastic_rounding_enabled():
        return _stochastic_bf16(values)
    if dtype == np.bool_:
        return values != 0
    if dtype.kind in "iu" and values.dtype.kind == "f":
        # Float-to-integer conversion truncates toward zero, as torch's casts do.
        with np.errstate(invalid="ignore"):
            return np.trunc(values).astype(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        return values.astype(dtype)


def element(value: Any, dtype: np.dtype) -> np.generic:
    """A Python number as one ``dtype`` element, converted as PyTorch converts a number to a
    tensor's type (c10's casts): anything nonzero (nan too) is True, a float truncates toward
    zero into an integer, an integer wraps into a narrower one (-1 is uint8's 255), a double
    rounds to a 16-bit float through float32. Whether it fits at all was checked before the
    kernel ran (the runtime's number check)."""
    dtype = np.dtype(dtype)
    if isinstance(value, (bool, np.bool_)):
        source = np.asarray(value, dtype=np.bool_)
    elif isinstance(value, (int, np.integer)):
        source = np.asarray(value, dtype=np.int64)
    else:
        source = np.asarray(value, dtype=np.float64)
        if dtype.itemsize == 2 and dtype.kind != "i" and dtype.kind != "u":
            source = source.astype(np.float32)
    return round_to(source, dtype)[()]


def compute_dtype(*dtypes: np.dtype) -> np.dtype:
    """The engines' working type: fp32 for any floating operand, else exact 64-bit integers
    (range-checked against the 32-bit datapath by the instruction)."""
    if any(is_float(d) or np.dtype(d).kind == "f" for d in dtypes):
        return np.dtype(np.float32)
    return np.dtype(np.int64)
