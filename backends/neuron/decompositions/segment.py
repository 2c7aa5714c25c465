"""``segment_reduce`` as a decomposition into neuron's native ops: each row of ``data`` (along
``axis`` 0) belongs to the segment whose running end (``cumsum`` of ``lengths``, or the
``offsets``) first exceeds its position (a sequence search), and one ``scatter_reduce`` folds the
rows into their segments, starting from ``initial`` where given, else from the reduction's
identity (so an empty segment holds 0 for sum, 1 for prod, -inf for max, inf for min). ``mean``
is the sum (from ``initial``) over the length: NaN for an empty segment without ``initial``,
``initial`` with it, as on the CPU. Floating data, one dim of lengths or offsets; other forms
are left to the CPU. Within float rounding (sums in another order); max and min exact.
bfloat16 and float16 sums (and means) accumulate in float32 and round once: the CPU adds row by
row in the data's own precision, so a long or cancelling segment drifts there; the result is
the float32 computation's, rounded.

``_segment_reduce_backward`` gives each row its segment's gradient as the CPU's kernel does:
sum the gradient, mean the gradient over the length; max and min the rows equal to the result
(or NaN) get it, shared equally where several do (the CPU divides only the positive shares, and
so does this); prod the gradient times the result over the row, or, for a zero or NaN row, times
the product of the segment's other rows and ``initial`` (counted per segment: any other NaN
makes it NaN, any other zero 0).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch._ops import OpOverload

from accelkit_backends.neuron.decompositions import _accumulation_dtype

aten = torch.ops.aten

#: Each reduction's scatter_reduce name and the value an empty segment starts from.
_REDUCTIONS = {"sum": ("sum", 0.0), "mean": ("sum", 0.0), "prod": ("prod", 1.0),
               "max": ("amax", float("-inf")), "min": ("amin", float("inf"))}


def _taken(data, reduce, given, axis) -> bool:
    """Whether the decompositions take these arguments (else the CPU's forms and errors)."""
    return (reduce in _REDUCTIONS and given is not None and given.dim() == 1 and data.dim() > 0
            and axis % data.dim() == 0 and data.is_floating_point())


def _segments(data, lengths, offsets) -> tuple[torch.Tensor, torch.Tensor]:
    """The segments' lengths (int64), and each row's segment: the number of segments (one past
    the last) for a row after the segments' total length, which ``unsafe=True`` lets through
    and the CPU leaves out (of the result, and with a zero gradient)."""
    if lengths is None:
        lengths = offsets[1:] - offsets[:-1]
    lengths = lengths.to(torch.int64)
    ends = torch.cumsum(lengths, 0)
    rows = torch.arange(data.shape[0], device=data.device)
    return lengths, torch.searchsorted(ends, rows, right=True)


def _per_row(values: torch.Tensor, segment: torch.Tensor) -> torch.Tensor:
    """Each row's entry of ``values`` (one per segment): its segment's; 0 past the last."""
    padded = torch.cat([values, values.new_zeros((1,) + tuple(values.shape[1:]))])
    return padded.index_select(0, segment)


def _per_segment_sum(values: torch.Tensor, segment: torch.Tensor, segments: int) -> torch.Tensor:
    return values.new_zeros((segments + 1,) + tuple(values.shape[1:])).index_add(0, segment, values)[:segments]


def _segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    given = lengths if lengths is not None else offsets
    if indices is not None or not _taken(data, reduce, given, axis):
        return NotImplemented  # the CPU's forms and errors
    lengths, segment = _segments(data, lengths, offsets)
    segments = lengths.shape[0]
    name, identity = _REDUCTIONS[reduce]
    if name == "sum" and _accumulation_dtype(data.dtype) != data.dtype:
        # Accumulated in float32 and rounded once: a reduced-precision sum rounds at every add,
        # in an order (the scatter's) other than the CPU's row by row.
        return _segment_reduce(data.to(_accumulation_dtype(data.dtype)), reduce, lengths=lengths, axis=axis, unsafe=unsafe,
                               initial=initial).to(data.dtype)
    start = identity if initial is None else float(initial)
    shape = (segments + 1,) + tuple(data.shape[1:])  # one more for the rows past the last segment
    index = segment.reshape((-1,) + (1,) * (data.dim() - 1)).expand(data.shape)
    folded = torch.full(shape, start, dtype=data.dtype, device=data.device).scatter_reduce(
        0, index, data, name, include_self=True)[:segments]
    if reduce != "mean":
        return folded
    count = lengths.to(data.dtype).reshape((-1,) + (1,) * (data.dim() - 1))
    mean = folded / count
    return mean if initial is None else torch.where(count == 0, torch.full_like(mean, start), mean)


def _segment_reduce_backward(grad, output, data, reduce, *, lengths=None, offsets=None, axis=0, initial=None):
    given = lengths if lengths is not None else offsets
    if not _taken(data, reduce, given, axis) or grad.dtype != data.dtype or output.dtype != data.dtype:
        return NotImplemented
    lengths, segment = _segments(data, lengths, offsets)
    segments = lengths.shape[0]
    column = (-1,) + (1,) * (data.dim() - 1)
    row_grad = _per_row(grad, segment)
    if reduce == "sum":
        return row_grad.contiguous()
    if reduce == "mean":
        length = _per_row(lengths, segment).clamp(min=1)  # 0 past the last segment, where the gradient is 0
        return (row_grad / length.reshape(column).to(data.dtype)).contiguous()
    row_output = _per_row(output, segment)
    if reduce in ("max", "min"):
        chosen = torch.isnan(data) | (data == row_output)
        shared_by = _per_row(_per_segment_sum(chosen.to(torch.int32), segment, segments), segment)
        share = torch.where(chosen, row_grad, torch.zeros_like(row_grad))
        divided = (shared_by >= 2) & (share > 0)
        return torch.where(divided, share / shared_by.clamp(min=1).to(data.dtype), share).contiguous()
    # prod
    is_nan, is_zero = torch.isnan(data), data == 0
    special = is_nan | is_zero
    regular_product = torch.ones((segments + 1,) + tuple(data.shape[1:]), dtype=data.dtype, device=data.device)
    index = segment.reshape(column).expand(data.shape)
    regular_product = regular_product.scatter_reduce(0, index, torch.where(special, torch.ones_like(data), data),
                                                     "prod", include_self=True)[:segments]
    start = 1.0 if initial is None else float(initial)
    base = _per_row(regular_product, segment) * start
    other_nans = _per_row(_per_segment_sum(is_nan.to(torch.int32), segment, segments), segment) - is_nan.to(torch.int32)
    other_zeros = (_per_row(_per_segment_sum(is_zero.to(torch.int32), segment, segments), segment)
                   - is_zero.to(torch.int32))
    exclusive = torch.where(other_nans > 0, torch.full_like(base, float("nan")),
                            torch.where(other_zeros > 0, base * 0, base))
    return torch.where(special, row_grad * exclusive, (row_grad * row_output) / data).contiguous()


def decompositions() -> Mapping[OpOverload, Callable]:
    """The decompositions above, keyed by aten overload."""
    return {aten.segment_reduce.default: _segment_reduce,
            aten._segment_reduce_backward.default: _segment_reduce_backward}
