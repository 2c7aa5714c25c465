"""``polygamma`` as a decomposition into neuron's native ops, for the orders the CPU computes
in the input's own float type: ``n = 0`` is ``digamma`` (a native activation), ``n = 1`` the
CPU's ``trigamma`` (``Math.h``) step by step in float32: the reflection ``-π² / sin²(πx)`` below
1/2, six terms ``1 / x²`` of the recurrence, then the asymptotic series. Higher orders are the
CPU's ``(-1)^(n+1) n! zeta(n + 1, x)``, on neuron's float32 ``special_zeta`` program
(``kernels/special.py``); bfloat16 and float16 are computed in float32 and rounded once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from torch._ops import OpOverload

aten = torch.ops.aten


def _trigamma(x: torch.Tensor) -> torch.Tensor:
    x = x.float()
    reflect = x < 0.5
    sin_pi_x = torch.sin(math.pi * x)
    result = torch.where(reflect, -(math.pi * math.pi) / (sin_pi_x * sin_pi_x), torch.zeros_like(x))
    x = torch.where(reflect, 1 - x, x)
    for _ in range(6):
        result = result + 1 / (x * x)
        x = x + 1
    ixx = 1 / (x * x)
    result = result + (1 + 1 / (2 * x) + ixx * (1.0 / 6 - ixx * (1.0 / 30 - ixx * (1.0 / 42)))) / x
    return torch.where(reflect, -result, result)


def _zeta_multiple(n: int, x: torch.Tensor) -> torch.Tensor:
    """``(-1)^(n+1) n! zeta(n + 1, x)`` in float32 (a float64 ``x`` as neuron computes it):
    ``n!`` rounded once, exact up to 13!, infinite past float's range as the CPU's."""
    factor = float(math.factorial(n)) if n <= 170 else math.inf
    if x.dtype not in (torch.float32, torch.float64):
        x = x.float()
    return torch.special.zeta(float(n + 1), x) * (factor if n % 2 else -factor)


def _polygamma(n, self):
    if n < 0:
        return NotImplemented  # the CPU's error
    if not self.is_floating_point():
        self = self.to(torch.get_default_dtype())  # an integer or bool argument: the CPU's promotion
    if n == 0:
        return torch.digamma(self)
    if n == 1:
        return _trigamma(self).to(self.dtype)
    return _zeta_multiple(n, self).to(self.dtype)


def decompositions() -> Mapping[OpOverload, Callable]:
    """The decompositions above, keyed by aten overload (their ``out=`` forms follow)."""
    return {aten.polygamma.default: _polygamma}
