"""Selections by a mask, and other index bookkeeping, as decompositions into neuron's native
ops: ``nonzero``, ``nonzero_static``, ``masked_select``, ``masked_scatter_``,
``unique_consecutive`` (flattened), ``repeat_interleave`` (of a repeats tensor), ``bincount``
(unweighted), ``put_``, ``equal`` and ``tril_indices``/``triu_indices`` (the grid's positions
that the triangle keeps, compacted in row-major order).

The k-th selected element (in row-major order, as the CPU walks the tensor) goes to output slot
``k``: a running count of the mask (``cumsum``) gives each element its slot, and one ``scatter``
(a ``gather`` for ``masked_scatter_``) moves the values; multi-indices are the flat index's
digits in the tensor's shape. Exact: nothing is computed, only moved.

``nonzero`` and ``masked_select`` return as many elements as the mask selects, a number the
program cannot know before it runs: it is read back from the device (a host sync, as every
device's nonzero has; no CPU fallback). ``nonzero_static`` has its size given and needs none;
``masked_scatter_`` needs none either, unless ``source`` has fewer elements than the mask, when
the count is read to raise the CPU's error for a source too short.

``unique_consecutive`` starts a group wherever an element differs from the one before (so each
NaN is its own group, as on the CPU), keeps each group's first element as a mask selection (its
group count read back), and counts the groups' lengths with a ``scatter_add``.
``repeat_interleave(repeats)`` gives output position ``p`` the first ``i`` whose running total of
repeats exceeds ``p`` (a sequence search); its length is read back unless ``output_size`` says it.
``bincount`` adds ones at each value (``scatter_add``) into ``max + 1`` bins (read back; the
weighted form's float64 result is refused on neuron, so it is left to the CPU). ``put_`` is an
``index_put_`` on the flattened tensor, after the CPU's bounds check (read back: a host sync);
``equal`` reads one bool back (it returns a Python bool).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch._ops import OpOverload

aten = torch.ops.aten


def _slots(mask: torch.Tensor) -> torch.Tensor:
    """Each element's output slot: the number of selected elements before it."""
    flat = mask.reshape(-1).to(torch.int64)
    return torch.cumsum(flat, 0) - flat


def _compacted(mask: torch.Tensor, values: torch.Tensor, size: int, fill) -> torch.Tensor:
    """The selected ``values`` (flat) in order, in ``size`` slots (``fill`` after them); the
    slot past the end takes the unselected elements and is dropped."""
    flat_mask = mask.reshape(-1)
    slot = torch.where(flat_mask, _slots(mask), size).clamp(max=size)
    out = torch.full((size + 1,), fill, dtype=values.dtype, device=values.device)
    return out.scatter(0, slot, values.reshape(-1))[:size]


def _multi_index(flat: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    digits, stride = [], 1
    for size in reversed(shape):
        digits.append(torch.remainder(torch.div(flat, stride, rounding_mode="floor"), size))
        stride *= size
    return torch.stack(digits[::-1], dim=1) if digits else flat.new_zeros((flat.shape[0], 0))


def _positions(self: torch.Tensor, size: int, fill: int) -> torch.Tensor:
    mask = self != 0
    flat = torch.arange(self.numel(), dtype=torch.int64, device=self.device)
    chosen = _compacted(mask, flat, size, -1)
    index = _multi_index(chosen.clamp(min=0), self.shape)
    return torch.where((chosen >= 0).unsqueeze(1), index, fill)


def _nonzero(self):
    return _positions(self, int((self != 0).sum().item()), 0)


def _nonzero_static(self, *, size, fill_value=-1):
    if self.numel() == 0:  # nothing to find, and a zero-size dim has no digits to divide by
        return torch.full((size, self.dim()), fill_value, dtype=torch.int64, device=self.device)
    return _positions(self, size, fill_value)


def _masked_select(self, mask):
    self, mask = torch.broadcast_tensors(self, mask)
    return _compacted(mask, self, int(mask.sum().item()), 0)


def _masked_scatter_(self, mask, source):
    mask = mask.expand(self.shape)
    if source.numel() < mask.numel():
        selected = int(mask.sum().item())
        if selected > source.numel():
            raise RuntimeError("Number of elements of source < number of ones in mask")  # the CPU's words
    slot = _slots(mask).clamp(max=max(source.numel() - 1, 0)).view(self.shape)
    taken = source.reshape(-1).gather(0, slot.reshape(-1)).view(self.shape) if source.numel() else self
    return self.copy_(torch.where(mask, taken.to(self.dtype), self))


def _unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    if dim is not None or self.numel() == 0:
        return NotImplemented  # along a dim (rows compared whole), or the CPU's empty-input shapes
    flat = self.reshape(-1)
    starts = torch.cat([torch.ones(1, dtype=torch.bool, device=self.device), flat[1:] != flat[:-1]])
    group = torch.cumsum(starts.to(torch.int64), 0) - 1
    groups = int(group[-1].item()) + 1
    values = _compacted(starts, flat, groups, 0)
    none = torch.zeros(0, dtype=torch.int64, device=self.device)
    inverse = group.view(self.shape) if return_inverse else none
    counts = (torch.zeros(groups, dtype=torch.int64, device=self.device).scatter_add(0, group, torch.ones_like(group))
              if return_counts else none)
    return values, inverse, counts


def _repeat_interleave(repeats, *, output_size=None):
    from accelkit_backends.neuron.decompositions.arith import _search

    ends = torch.cumsum(repeats.to(torch.int64), 0)
    total = int(ends[-1].item()) if output_size is None and repeats.numel() else (output_size or 0)
    positions = torch.arange(total, dtype=torch.int64, device=repeats.device)
    return _search(ends, positions, True, None).to(repeats.dtype)


def _bincount(self, weights=None, minlength=0):
    if weights is not None or self.numel() == 0:
        return NotImplemented  # float64 counts (refused here), or the CPU's empty-input rules
    if bool((self < 0).any().item()):
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    bins = max(int(self.max().item()) + 1, minlength)
    flat = self.to(torch.int64)
    return torch.zeros(bins, dtype=torch.int64, device=self.device).scatter_add(0, flat, torch.ones_like(flat))


def _put_(self, index, source, accumulate=False):
    if not self.is_contiguous():
        return NotImplemented
    size = self.numel()
    outside = (index < -size) | (index >= size)
    if bool(outside.any().item()):  # the CPU's bounds check, read back (a host sync)
        first = int(index.reshape(-1)[outside.reshape(-1)][0].item())
        raise IndexError(f"out of range: tried to access index {first} on a tensor of {size} elements.")
    flat_index = torch.where(index < 0, index + size, index).reshape(-1).to(torch.int64)
    self.view(-1).index_put_((flat_index,), source.reshape(-1), accumulate)
    return self


def _triangle_indices(row: int, col: int, keep, dtype, device) -> torch.Tensor:
    """The ``[2, count]`` (row, column) pairs of a ``row x col`` grid that ``keep(i, j)`` selects,
    in row-major order (one mask compaction; the count is the host's arithmetic)."""
    flat = torch.arange(row * col, dtype=torch.int64, device=device)
    i = torch.div(flat, max(col, 1), rounding_mode="floor")
    j = flat - i * col
    mask = keep(i, j)
    count = sum(max(0, min(col, hi) - max(0, lo)) for lo, hi in (keep.span(r, col) for r in range(row)))
    chosen = _compacted(mask, flat, count, 0)
    rows = torch.div(chosen, max(col, 1), rounding_mode="floor")
    return torch.stack([rows, chosen - rows * col]).to(dtype if dtype is not None else torch.int64)


class _Below:
    """``j - i <= offset`` (``tril_indices``); ``span`` is row ``r``'s kept columns ``[lo, hi)``."""

    def __init__(self, offset: int):
        self.offset = offset

    def __call__(self, i, j):
        return (j - i) <= self.offset

    def span(self, r: int, col: int) -> tuple[int, int]:
        return 0, r + self.offset + 1


class _Above(_Below):
    """``j - i >= offset`` (``triu_indices``)."""

    def __call__(self, i, j):
        return (j - i) >= self.offset

    def span(self, r: int, col: int) -> tuple[int, int]:
        return r + self.offset, col


def _tril_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _triangle_indices(row, col, _Below(offset), dtype, device)


def _triu_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _triangle_indices(row, col, _Above(offset), dtype, device)


def _equal(self, other):
    if self.shape != other.shape:
        return False
    return bool((self == other).all().item())


def decompositions() -> Mapping[OpOverload, Callable]:
    """The decompositions above, keyed by aten overload (their ``out=`` forms follow)."""
    return {
        aten.nonzero.default: _nonzero,
        aten.nonzero_static.default: _nonzero_static,
        aten.masked_select.default: _masked_select,
        aten.masked_scatter_.default: _masked_scatter_,
        aten.unique_consecutive.default: _unique_consecutive,
        aten.repeat_interleave.Tensor: _repeat_interleave,
        aten.bincount.default: _bincount,
        aten.put_.default: _put_,
        aten.equal.default: _equal,
        aten.tril_indices.default: _tril_indices,
        aten.triu_indices.default: _triu_indices,
    }
