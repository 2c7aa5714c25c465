"""``segment_reduce`` as a decomposition into neuron's native ops: each row of ``data`` (along
``axis`` 0) belongs to the segment whose running end (``cumsum`` of ``lengths``, or the
``offsets``) first exceeds its position (a sequence search), and one ``scatter_reduce`` folds the
rows into their segments, starting from ``initial`` where given, else from the reduction's
identity (so an empty segment holds 0 for sum, 1 for prod, -inf for max, inf for min). ``mean``
is the sum (from ``initial``) over the length: NaN for an empty segment without ``initial``,
``initial`` with it, as on the CPU. Floating data, one dim of lengths or offsets; other forms
are left to the CPU. Within float rounding (sums in another order); max and min exact.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch._ops import OpOverload

aten = torch.ops.aten

#: Each reduction's scatter_reduce name and the value an empty segment starts from.
_REDUCTIONS = {"sum": ("sum", 0.0), "mean": ("sum", 0.0), "prod": ("prod", 1.0),
               "max": ("amax", float("-inf")), "min": ("amin", float("inf"))}


def _segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    given = lengths if lengths is not None else offsets
    if (reduce not in _REDUCTIONS or indices is not None or given is None or given.dim() != 1
            or axis % max(data.dim(), 1) != 0 or not data.is_floating_point() or data.dim() == 0):
        return NotImplemented  # the CPU's forms and errors
    if lengths is None:
        lengths = offsets[1:] - offsets[:-1]
    lengths = lengths.to(torch.int64)
    segments = lengths.shape[0]
    ends = torch.cumsum(lengths, 0)
    rows = torch.arange(data.shape[0], device=data.device)
    segment = torch.searchsorted(ends, rows, right=True).clamp(max=max(segments - 1, 0))
    name, identity = _REDUCTIONS[reduce]
    start = identity if initial is None else float(initial)
    shape = (segments,) + tuple(data.shape[1:])
    index = segment.reshape((-1,) + (1,) * (data.dim() - 1)).expand(data.shape)
    folded = torch.full(shape, start, dtype=data.dtype, device=data.device).scatter_reduce(
        0, index, data, name, include_self=True)
    if reduce != "mean":
        return folded
    count = lengths.to(data.dtype).reshape((-1,) + (1,) * (data.dim() - 1))
    mean = folded / count
    return mean if initial is None else torch.where(count == 0, torch.full_like(mean, start), mean)


def decompositions() -> Mapping[OpOverload, Callable]:
    """The decomposition above, keyed by aten overload."""
    return {aten.segment_reduce.default: _segment_reduce}
