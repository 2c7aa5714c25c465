"""``logspace`` in float32 on the device, as exact as the CPU's.

PyTorch's own decomposition forms the exponents in float64, which neuron has not, so the call
went to the CPU. The CPU's float kernel (``RangeFactories.cpp``) takes ``start`` and ``end`` in
the result's type and ``step = (end - start) / (steps - 1)`` in double, forms the exponent
``start + step i`` (the first half) or ``end - step (steps - 1 - i)`` (the second) in double,
and rounds ``pow(base, exponent)`` once. A float32 exponent would cost up to ``|e ln base| / 2``
ulps of the result (12 for 10^10), so here the exponent is the double-float ``hi + lo``:
``step`` split on the host into float32 parts (``step_hi`` into two 12-bit halves), the index
into two 12-bit parts on the device, their products exact, summed with their rounding errors
(TwoSum). The result is ``base_f^hi (1 + lo ln base + hi ln(base / base_f))``, where ``base_f``
is ``base`` rounded to float32 and the device's ``pow`` takes it: within two ulps of the CPU's.

Integer and float64 results, complex or non-positive bases take the CPU (``NotImplemented``).
One step is the CPU's own double power of ``start`` (a number), filled on the device.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np
import torch
from torch._ops import OpOverload

aten = torch.ops.aten
_F32 = np.float32
#: A split point of 2^12: an integer index below 2^24 is two parts of 12 significant bits.
_HALF_BITS = 4096.0


def _two_sum(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    total = a + b
    b_part = total - a
    return total, (a - (total - b_part)) + (b - b_part)


def _halves(value: float) -> tuple[float, float]:
    """A float32 ``value`` as two float32 parts of at most 12 significant bits (Veltkamp)."""
    v = _F32(value)
    c = _F32(v * _F32(4097.0))
    high = _F32(c - _F32(c - v))
    return float(high), float(_F32(v - high))


def _exponents(origin: torch.Tensor, step: float, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``origin + step k`` (float32 origins, a double step, integers k below 2^24 in magnitude)
    as float32 ``hi + lo``."""
    step_hi = float(_F32(step))
    step_lo = float(_F32(step - step_hi))
    step_a, step_b = _halves(step_hi)
    k_b = torch.fmod(k, _HALF_BITS)
    k_a = k - k_b
    hi, lo = origin, torch.zeros_like(k)
    for term in (step_a * k_a, step_a * k_b, step_b * k_a, step_b * k_b, step_lo * k):
        hi, error = _two_sum(hi, term)
        lo = lo + error
    return hi, lo


def _double_power(base: float, exponent: float) -> float:
    try:
        return math.pow(base, exponent)
    except OverflowError:
        return math.inf


def _logspace(start, end, steps, base=10.0, *, dtype=None, layout=None, device=None, pin_memory=None):
    start = start.item() if isinstance(start, torch.Tensor) else start
    end = end.item() if isinstance(end, torch.Tensor) else end
    dtype = dtype or torch.get_default_dtype()
    if (dtype not in (torch.float32, torch.bfloat16, torch.float16) or isinstance(start, complex)
            or isinstance(end, complex) or not base > 0 or steps < 0):
        return NotImplemented  # the CPU's kernel: integer and float64 results; its error
    if steps < 2:
        # the CPU fills one element with the double power of the start (a number, no exponents)
        return torch.full((steps,), _double_power(base, float(start)), dtype=dtype, device=device)
    # start and end in the result's type, their difference too (the CPU's scalar_t arithmetic)
    first, last = torch.tensor(start, dtype=dtype), torch.tensor(end, dtype=dtype)
    step = float(last - first) / (steps - 1)
    first, last = float(first), float(last)
    index = torch.arange(steps, dtype=torch.float32, device=device)
    halfway = steps // 2
    lower = index < halfway
    origin = torch.where(lower, first, last)
    hi, lo = _exponents(origin, step, torch.where(lower, index, index - (steps - 1)))
    base_f = float(_F32(base))
    power = torch.pow(base_f, hi)
    correction = lo * math.log(base) + hi * math.log(base / base_f) + 1.0
    return (power * correction).to(dtype)


def _logspace_out(start, end, steps, base=10.0, *, out):
    """The ``out=`` forms: the runtime does not pair them with the functional ones (a factory's
    functional form takes ``dtype``/``device`` arguments its ``out=`` form lacks)."""
    result = _logspace(start, end, steps, base, dtype=out.dtype, device=out.device)
    if result is NotImplemented:
        return NotImplemented
    if out.shape != result.shape:
        out.resize_(result.shape)
    return out.copy_(result)


def decompositions() -> Mapping[OpOverload, Callable]:
    """``logspace`` and its tensor-argument forms, each with its ``out=`` form."""
    packet = aten.logspace
    table = {getattr(packet, name): _logspace for name in ("default", "Tensor_Tensor", "Tensor_Scalar", "Scalar_Tensor")}
    table.update({getattr(packet, name): _logspace_out
                  for name in ("out", "Tensor_Tensor_out", "Tensor_Scalar_out", "Scalar_Tensor_out")})
    return table
