"""``polygamma`` as a decomposition into neuron's native ops, for the orders the CPU computes
in the input's own float type: ``n = 0`` is ``digamma`` (a native activation), ``n = 1`` the
CPU's ``trigamma`` (``Math.h``) step by step in float32: the reflection ``-π² / sin²(πx)`` below
1/2, six terms ``1 / x²`` of the recurrence, then the asymptotic series. Higher orders are
``zeta`` multiples, whose float kernel on the CPU sums in double precision (see
``kernels/special.py``): they are left to the CPU.
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


def _polygamma(n, self):
    if n == 0:
        return torch.digamma(self)
    if n != 1 or not self.is_floating_point():
        return NotImplemented  # zeta's orders (double-precision sums on the CPU), integer inputs
    return _trigamma(self).to(self.dtype)


def decompositions() -> Mapping[OpOverload, Callable]:
    """The decompositions above, keyed by aten overload (their ``out=`` forms follow)."""
    return {aten.polygamma.default: _polygamma}
