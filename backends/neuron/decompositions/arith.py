"""Small exact families as decompositions into neuron's native ops, each following the CPU
kernel's arithmetic step for step, so the results are the CPU's bit for bit (``addbmm`` within
float rounding: its sum is grouped differently).

* ``addbmm``/``addmv``: one ``mm`` (for ``addbmm`` of the batches laid side by side: the batch
  sum is the contraction; for ``addmv`` of the vector as a column), then ``beta * self + alpha *
  product``; ``beta == 0`` ignores ``self`` (NaN included), as the BLAS convention the CPU
  follows. (PyTorch's own ``addmv`` decomposition calls ``mv``, which the CPU runs as ``addmv``.)
* ``gcd``/``lcm``: the CPU's Euclid loop (``calc_gcd``: ``a, b = |a|, |b|``; while ``a``:
  ``a, b = b % a, a``) run element-wise for a fixed number of steps, enough for every value the
  engines hold: by Lamé's theorem a pair below ``F(n + 2)`` (Fibonacci) needs at most ``n``
  steps; an element already done stays put. int64 is computed as int32 on neuron (larger values
  are refused), so 32 bits bound it. ``lcm`` is ``|a / gcd * b|`` (0 where the gcd is 0).
  Narrower integer types are computed in int32 and truncated on the way back, as the CPU's C++
  promotes them to ``int`` (so an ``lcm`` that overflows int8 wraps as it does there).
* ``nextafter``: integer arithmetic on the float's bits (a dtype view, metadata only): one
  step up or down in the bit pattern moves one representable value, toward or away from zero;
  from zero it is the smallest subnormal with ``other``'s sign, built in bits too, so no float
  arithmetic (which may flush subnormals) touches it.
* ``searchsorted``: the CPU's binary search (``cus_lower_bound``/``cus_upper_bound``) run for
  every value at once for ``ceil(log2(n + 1))`` rounds, each a gather and a compare: exact
  also where a NaN sits in the sequence (a count of smaller elements would not be).
* ``index_reduce``: ``scatter_reduce`` with the index spread along the source's other dims
  (the same reductions, ``include_self`` and integer mean rounding).
* ``fmax``/``fmin``: the other operand where one is NaN, else the larger (smaller); on a tie of
  signed zeros either may come out (IEEE leaves it open; the CPU's own paths differ); ``hardshrink``/``softshrink`` backward: the
  gradient outside ``[-lambd, lambd]``; ``angle`` of a real tensor: NaN, pi below zero, else 0
  (a complex one is left to the CPU); ``_aminmax``: ``amin`` and ``amax``; ``round`` to
  ``decimals``: ``round(x * 10**d) / 10**d`` (``round(x / 10**-d) * 10**-d`` for negative ``d``),
  in float32 for the reduced floats, as the CPU's kernel computes it; ``pow_`` with a tensor
  exponent: ``pow``, written back.
* ``_cdist_forward``: the p-norm of every row pair's difference (count of nonzeros, sum, root of
  squares, max, or the general power sum), or, where the CPU takes its matmul form (p = 2 with
  more than 25 rows, or asked for), that form; within float rounding (sums grouped otherwise).
* ``frexp``: mantissa and exponent read off float32's bits (integer arithmetic on a dtype view).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from torch._ops import OpOverload

aten = torch.ops.aten


def _scaled_sum(self, product, beta, alpha):
    """``beta * self + alpha * product``, ``self`` unread when ``beta`` is 0 (the CPU's rule)."""
    if not product.is_floating_point():
        beta, alpha = int(beta), int(alpha)
    if alpha != 1:
        product = product * alpha
    if beta == 0:
        return product
    return (self * beta if beta != 1 else self) + product


def _addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    batches, rows, inner = batch1.shape
    cols = batch2.shape[2]
    product = torch.mm(batch1.transpose(0, 1).reshape(rows, batches * inner), batch2.reshape(batches * inner, cols))
    return _scaled_sum(self, product, beta, alpha)


def _addmv(self, mat, vec, *, beta=1, alpha=1):
    return _scaled_sum(self, torch.mm(mat, vec.unsqueeze(1)).squeeze(1), beta, alpha)


#: Value bits the engines compute per integer dtype (int64 is computed as int32 on neuron).
_VALUE_BITS = {torch.uint8: 8, torch.int8: 7, torch.int16: 15, torch.int32: 31, torch.int64: 31}


def _euclid_steps(dtype: torch.dtype) -> int:
    """Steps enough for any pair of the dtype (Lamé), plus one for the first swap."""
    bound, previous, current, n = 2 ** _VALUE_BITS[dtype], 1, 1, 0
    while current <= bound:
        previous, current, n = current, previous + current, n + 1
    return n + 1


def _euclid(a, b):
    """The CPU's ``calc_gcd`` element-wise, in ``a``'s dtype."""
    a, b = torch.broadcast_tensors(a.abs(), b.abs())
    for _ in range(_euclid_steps(a.dtype)):
        going = a != 0
        a, b = torch.where(going, b % torch.where(going, a, 1), 0), torch.where(going, a, b)
    return b


def _widened(tensor, dtype):
    """``tensor`` in ``dtype``, or in int32 for a narrower integer type: the CPU's C++ promotes
    those to int in its arithmetic and truncates on the store."""
    return tensor.to(torch.int32 if _VALUE_BITS[dtype] < 31 else dtype)


def _gcd(self, other):
    dtype = torch.result_type(self, other)
    return _euclid(_widened(self, dtype), _widened(other, dtype)).to(dtype)


def _lcm(self, other):
    dtype = torch.result_type(self, other)
    a, b = _widened(self, dtype), _widened(other, dtype)
    divisor = _euclid(a, b)
    quotient = torch.div(a, torch.where(divisor == 0, 1, divisor), rounding_mode="trunc")
    return torch.where(divisor == 0, 0, (quotient * b).abs()).to(dtype)


#: The integer dtype of a float's width, for its bit view.
_BITS_OF = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def _nextafter(self, other):
    dtype = torch.result_type(self, other)
    x, y = torch.broadcast_tensors(self.to(dtype), other.to(dtype))
    bits_dtype = _BITS_OF[dtype]
    bits = x.contiguous().view(bits_dtype)
    sign = -(2 ** (torch.iinfo(bits_dtype).bits - 1))  # the sign bit alone, as a signed value
    away_from_zero = (y > x) == (x > 0)
    stepped = bits + torch.where(away_from_zero, 1, -1).to(bits_dtype)
    from_zero = torch.where(y > x, 1, sign + 1).to(bits_dtype)  # +/- the smallest subnormal
    result = torch.where(x == 0, from_zero, stepped).view(dtype)
    result = torch.where(x == y, y, result)
    return torch.where(torch.isnan(x) | torch.isnan(y), x + y, result)


def _search(sorted_sequence, values, right, sorter):
    """The CPU's lower (upper, ``right``) bound of each value in the last dim of the sequence."""
    length = sorted_sequence.shape[-1]
    batched = sorted_sequence.dim() > 1
    start = torch.zeros(values.shape, dtype=torch.int64, device=values.device)
    end = torch.full(values.shape, length, dtype=torch.int64, device=values.device)
    for _ in range(max(1, math.ceil(math.log2(length + 1)))):
        searching = start < end
        middle = torch.div(start + end, 2, rounding_mode="floor").clamp(max=max(length - 1, 0))
        position = middle
        if sorter is not None:
            position = sorter.gather(-1, middle) if batched else sorter[middle]
        found = sorted_sequence.gather(-1, position) if batched else sorted_sequence[position]
        before = ~(found > values) if right else ~(found >= values)
        start = torch.where(searching & before, middle + 1, start)
        end = torch.where(searching & ~before, middle, end)
    return start


def _searchsorted(sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    if side == "left" and right:
        raise RuntimeError("torch.searchsorted(): side and right can't be set to opposites, got side of left "
                           "while right was True")
    right = right or side == "right"
    if not isinstance(self, torch.Tensor):
        common = torch.result_type(sorted_sequence, self)
        values = torch.full((), self, dtype=common, device=sorted_sequence.device)
    else:
        common = torch.result_type(sorted_sequence, self)
        values = self.to(common)
    result = _search(sorted_sequence.to(common), values, right, sorter)
    return result.to(torch.int32 if out_int32 else torch.int64)


def _index_reduce(self, dim, index, source, reduce, *, include_self=True):
    dim = dim % max(self.dim(), 1)
    if source.dim() == 0:
        source = source.view(1)
    shape = [1] * source.dim()
    shape[dim] = -1
    spread = index.view(shape).expand(source.shape)
    return self.scatter_reduce(dim, spread, source, reduce, include_self=include_self)


def _fmax(self, other):
    a, b = _promoted(self, other)
    return torch.where(torch.isnan(a), b, torch.where(torch.isnan(b) | ~(a < b), a, b))


def _fmin(self, other):
    a, b = _promoted(self, other)
    return torch.where(torch.isnan(a), b, torch.where(torch.isnan(b) | ~(a > b), a, b))


def _promoted(self, other):
    dtype = torch.result_type(self, other)
    return torch.broadcast_tensors(self.to(dtype), other.to(dtype))


def _shrink_backward(grad_output, self, lambd):
    return torch.where((self >= -lambd) & (self <= lambd), 0, grad_output)


def _angle(self):
    if self.is_complex():
        return NotImplemented  # the CPU's atan2 of the parts: left to the fallback
    value = self if self.is_floating_point() else self.to(torch.get_default_dtype())
    return torch.where(torch.isnan(value), value, torch.where(value < 0, math.pi, 0.0).to(value.dtype))


def _aminmax_all(self):
    return torch.amin(self), torch.amax(self)


def _aminmax_dim(self, dim, keepdim=False):
    return torch.amin(self, dim, keepdim), torch.amax(self, dim, keepdim)


def _round_decimals(self, *, decimals):
    if not self.is_floating_point():
        return NotImplemented  # the CPU has no integer form either: its error comes from there
    value = self.float() if self.dtype in (torch.bfloat16, torch.float16) else self
    power = float(10 ** abs(decimals))
    if decimals < 0:
        rounded = torch.round(value / power) * power
    else:
        rounded = torch.round(value * power) / power
    return rounded.to(self.dtype)


def _cdist_forward(x1, x2, p, compute_mode=None):
    rows_large = x1.shape[-2] > 25 or x2.shape[-2] > 25
    if p == 2 and (compute_mode == 1 or (compute_mode in (None, 0) and rows_large)):
        return aten._euclidean_dist(x1, x2)  # the CPU's matmul form for these (already a decomposition)
    difference = (x1.unsqueeze(-2) - x2.unsqueeze(-3)).abs()
    if p == 0:
        return (difference != 0).sum(-1).to(x1.dtype)
    if p == 1:
        return difference.sum(-1)
    if p == 2:
        return difference.square().sum(-1).sqrt()
    if math.isinf(p):
        return difference.amax(-1)
    return difference.pow(p).sum(-1).pow(1.0 / p)


def _pow_tensor_(self, exponent):
    return self.copy_(torch.pow(self, exponent))


#: float32's exponent field, and the bits of a mantissa's exponent field for [0.5, 1) (biased 126).
_EXPONENT_BITS, _HALF_EXPONENT = 0x7F800000, 126 << 23


def _frexp(self):
    """``x = m * 2**e`` with ``|m|`` in [0.5, 1), read off float32's bits: ``e`` is the biased
    exponent field minus 126, ``m`` the bits with that field set to 126 (a subnormal is first
    scaled by 2**24, exact, and ``e`` lowered by 24). Zero, inf and NaN give ``(x, 0)``, as the
    CPU's ``std::frexp``. Reduced floats go through float32 (exact both ways: the mantissa keeps
    their bits)."""
    if not self.is_floating_point() or self.dtype == torch.float64:
        return NotImplemented  # the CPU's error for integers; float64 is refused on neuron
    x = self.float()
    subnormal = (x != 0) & (x.abs() < torch.finfo(torch.float32).tiny)
    scaled = torch.where(subnormal, x * 2.0**24, x)
    bits = scaled.view(torch.int32)
    biased = torch.bitwise_and(torch.bitwise_right_shift(bits, 23), 0xFF)
    special = (x == 0) | ~torch.isfinite(x)
    exponent = torch.where(special, 0, biased - 126 - torch.where(subnormal, 24, 0)).to(torch.int32)
    mantissa_bits = torch.bitwise_or(torch.bitwise_and(bits, ~_EXPONENT_BITS), _HALF_EXPONENT)
    mantissa = torch.where(special, x, mantissa_bits.view(torch.float32))
    return mantissa.to(self.dtype), exponent


def decompositions() -> Mapping[OpOverload, Callable]:
    """The decompositions above, keyed by aten overload (in-place and ``out=`` forms follow)."""
    return {
        aten.addbmm.default: _addbmm,
        aten.addmv.default: _addmv,
        aten.gcd.default: _gcd,
        aten.lcm.default: _lcm,
        aten.nextafter.default: _nextafter,
        aten.searchsorted.Tensor: _searchsorted,
        aten.searchsorted.Scalar: _searchsorted,
        aten.index_reduce.default: _index_reduce,
        aten.fmax.default: _fmax,
        aten.fmin.default: _fmin,
        aten.hardshrink_backward.default: _shrink_backward,
        aten.softshrink_backward.default: _shrink_backward,
        aten.angle.default: _angle,
        aten._aminmax.default: _aminmax_all,
        aten._aminmax.dim: _aminmax_dim,
        aten.round.decimals: _round_decimals,
        aten.pow_.Tensor: _pow_tensor_,
        aten._cdist_forward.default: _cdist_forward,
        aten.frexp.Tensor: _frexp,
    }
